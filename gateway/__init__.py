"""OpenAI-compatible streaming gateway in front of model servers (``latency-predictor gateway``).

    latency-predictor gateway --endpoints URL[,URL...] [--config EPP.yaml] [--port P]
        [--prediction-urls URL,...] [--training-url URL]

Routes ``/v1/completions`` and ``/v1/chat/completions`` (streaming or not) to one of the
endpoints, chosen by the ``epp_client`` scheduler built from ``--config`` (an
EndpointPickerConfig YAML), or by the built-in least-load router without one. Exposes
``/metrics`` (Prometheus), ``/healthz``, ``/gateway/endpoints`` and ``/gateway/requests``.
"""
from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from .cli import main as _main

    return _main(argv)


__all__ = ["main"]
