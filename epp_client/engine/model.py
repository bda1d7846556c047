"""The decode-harm plugins' one view of an engine (:class:`EngineModel`) and what it answers
(:class:`Outcome`). The router's own implementation is the engine twin
(:class:`epp_client.engine.twin_engine.TwinEngine`); a reference that knows the engine (the simulator's
oracle) passes its own to ``use_engine_model``.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

from epp_client.types import Endpoint, InferenceRequest


class Outcome(NamedTuple):
    harm: int               # running requests over their TPOT SLO with the request and not without
    ttft_ms: float          # the request's first token, from now (inf: not within max_steps)
    tpot_ms: float          # its TPOT over the probe steps


class EngineModel(Protocol):
    """What the decode-harm plugins know of an engine: the outcome of placing ``request`` (its
    ``prompt`` tokens, ``cached`` of them in the endpoint's prefix cache) on ``endpoint``, which
    has a prediction (the requests this router has running there). A model may also answer
    ``placements(request, endpoints, prompt, cached)`` (``cached[i]`` for the i-th endpoint), the
    same outcomes for all candidates at once; the plugins call it where it exists (the twin does,
    :meth:`epp_client.engine.twin_engine.TwinEngine.placements`)."""

    def placement(self, request: InferenceRequest, endpoint: Endpoint, prompt: int, cached: int) -> Outcome: ...
