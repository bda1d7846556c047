"""Well-known EndpointPickerConfigs, by name.

A name is accepted wherever a config is (``build_scheduler``, the gateway's
``--config``, ``simulate --epp-config``)::

    predicted-latency-slo          llm-d's predicted-latency wiring (its integration test's config)
    predicted-latency-recommended  this project's recommended predicted-latency profile

Each is a plain YAML file, ``epp_client/profiles/<name>.yaml`` (with ``helm-reference.yaml``, the
Helm chart's wiring, ``REFERENCE_CONFIG``); why a profile is wired as it is lives in
docs/plugins.md B2.8.
:func:`config_text` turns a name or a file path into YAML text
(:func:`epp_client.plugins.handler.opt_in.with_opt_in` makes the opt-in variant of a predicted config).
"""
from __future__ import annotations

from pathlib import Path

#: the folder of the well-known configs, one YAML file a name (``<name>.yaml``)
PROFILES_DIR = Path(__file__).resolve().parent


def profile_text(name: str) -> str:
    """The YAML text of the shipped config ``profiles/<name>.yaml``."""
    return (PROFILES_DIR / f"{name}.yaml").read_text(encoding="utf-8")


#: B2.8: the Helm chart's wiring with router.latencyPredictor.enabled=true.
REFERENCE_CONFIG = profile_text("helm-reference")
#: B2.8: the integration test's well-known config ``predicted-latency-slo``.
PREDICTED_LATENCY_SLO_CONFIG = profile_text("predicted-latency-slo")
#: the recommended predicted-latency profile ``predicted-latency-recommended`` (docs/plugins.md B2.8).
RECOMMENDED_CONFIG = profile_text("predicted-latency-recommended")

#: name -> YAML text of the configs accepted by name
WELL_KNOWN_CONFIGS: dict[str, str] = {
    "predicted-latency-slo": PREDICTED_LATENCY_SLO_CONFIG,
    "predicted-latency-recommended": RECOMMENDED_CONFIG,
}


def config_text(name_or_path: str) -> str:
    """The YAML text of a well-known config name, else of the file at that path (OSError
    when it cannot be read)."""
    text = WELL_KNOWN_CONFIGS.get(name_or_path)
    return text if text is not None else Path(name_or_path).read_text()
