"""``inflight-token-scorer``: least in-flight uncached prompt tokens first.

``(max - t) / (max - min)`` over the candidates' ``InFlightLoad.tokens`` (1.0 for all
when equal; a candidate without in-flight data counts 0). The in-flight-token half of
llm-d's token-load routing (behind ``prefix-cache-affinity-filter``); no parameters.
"""
from __future__ import annotations

from epp_client.framework.params import Plugin
from epp_client.framework.protocols import Scorer
from epp_client.framework.registry import plugin
from epp_client.types import Endpoint, InferenceRequest


@plugin("inflight-token-scorer", Scorer)
class InFlightTokenScorer(Plugin):

    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        toks = [e.inflight.tokens if e.inflight is not None else 0 for e in endpoints]
        hi, lo = max(toks), min(toks)
        if hi == lo:
            return {e.name: 1.0 for e in endpoints}
        return {e.name: (hi - t) / (hi - lo) for e, t in zip(endpoints, toks)}
