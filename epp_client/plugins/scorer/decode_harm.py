"""``decode-harm-scorer``: ``1 / (1 + count)`` of :class:`~epp_client.plugins.filter.decode_harm.DecodeHarmCount`
(0 without a prediction).
"""
from __future__ import annotations

from epp_client.framework.protocols import Scorer
from epp_client.framework.registry import plugin
from epp_client.plugins.filter.decode_harm import DecodeHarmCount
from epp_client.types import Endpoint, InferenceRequest


@plugin("decode-harm-scorer", Scorer)
class DecodeHarmScorer(DecodeHarmCount):
    """``decode-harm-scorer``: the filter's count as a score, 1 / (1 + count); 0 without a prediction."""

    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        counts = self.scores(request, endpoints)
        return {e.name: 1.0 / (1.0 + counts[e.name]) if e.name in counts else 0.0 for e in endpoints}
