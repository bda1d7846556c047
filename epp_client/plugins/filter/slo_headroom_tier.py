"""``slo-headroom-tier-filter`` (B2.3): keep the tier of endpoints with SLO headroom (or the one without)."""
from __future__ import annotations

import random
from dataclasses import field

from epp_client.framework.params import Plugin, param, within
from epp_client.framework.protocols import Filter
from epp_client.framework.registry import plugin
from epp_client.types import Endpoint, InferenceRequest


@plugin("slo-headroom-tier-filter", Filter)
class SloHeadroomTierFilter(Plugin):
    """``slo-headroom-tier-filter``: keep the tier with non-negative TTFT and TPOT headroom;
    with probability ``epsilon_explore_neg`` keep the negative tier instead. Endpoints
    without a prediction join the negative tier; if nobody has one, keep all."""

    epsilon_explore_neg: float = param("epsilonExploreNeg", default=0.01, check=within(0.0, 1.0),
                                       doc="probability of keeping the negative tier instead")
    latency_prediction_info_producer_name: str = param("latencyPredictionInfoProducerName", default="", ignored=True)
    rng: random.Random = field(default_factory=random.Random)

    def setup(self) -> None:
        self.rng = self.rng or random.Random()

    def filter(self, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        if len(endpoints) <= 1:
            return endpoints
        positive, negative, missing = [], [], []
        for e in endpoints:
            p = e.prediction
            if p is None:
                missing.append(e)
            elif p.ttft_headroom_ms >= 0 and p.tpot_headroom_ms >= 0:
                positive.append(e)
            else:
                negative.append(e)
        if not positive and not negative:
            return endpoints
        if missing:
            negative = negative + missing  # appended, as upstream does
        if positive and negative:
            return negative if self.rng.random() < self.epsilon_explore_neg else positive
        return positive or negative
