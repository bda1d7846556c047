"""``probabilistic-admitter`` (B2.6): reject a sheddable request with a probability that grows with saturation."""
from __future__ import annotations

import random
from dataclasses import field

from epp_client.flowcontrol.saturation import roofline
from epp_client.framework.params import Plugin, gt, param
from epp_client.framework.protocols import Admitter
from epp_client.framework.registry import plugin
from epp_client.plugins.admitter.latency_slo import DENIED_STATUS
from epp_client.types import ADMITTED, Admission, Endpoint, InferenceRequest


@plugin("probabilistic-admitter", Admitter)
class ProbabilisticAdmitter(Plugin):
    """``probabilistic-admitter``: rejects a sheddable request with probability
    ``min(sat^power × k, 1)``, sat = mean over candidates of
    ``max(waiting / queueDepthThreshold, kv / kvCacheUtilThreshold)``."""

    queue_depth_threshold: int = param("queueDepthThreshold", default=5, check=gt(0),
                                       doc="waiting requests that saturate an endpoint")
    kv_cache_util_threshold: float = param("kvCacheUtilThreshold", default=0.8, check=gt(0.0),
                                           doc="KV-cache use (fraction) that saturates an endpoint")
    power: float = param("power", default=5.0, check=gt(0.0), doc="exponent of the saturation")
    k: float = param("k", default=300.0, check=gt(0.0), doc="multiplier of the rejection probability")
    rng: random.Random = field(default_factory=random.Random)

    def setup(self) -> None:
        self.rng = self.rng or random.Random()
        self.rejected = 0

    def saturation(self, endpoints: list[Endpoint]) -> float:
        total = 0.0
        for e in endpoints:
            m = e.metrics
            if m is None:
                total += 1.0
            else:
                total += roofline(m.waiting_queue_size, m.kv_cache_usage, self.queue_depth_threshold,
                                  self.kv_cache_util_threshold)
        return total / len(endpoints)

    def admit(self, request: InferenceRequest | None, endpoints: list[Endpoint]) -> Admission:
        if request is None or request.priority >= 0 or not endpoints:
            return ADMITTED
        sat = self.saturation(endpoints)
        p = min(sat ** self.power * self.k, 1.0)
        if self.rng.random() < p:
            self.rejected += 1
            return Admission(False, f"probabilistic-admitter: rejected, saturation={sat:.3f} prob={p:.2f}",
                             DENIED_STATUS)
        return ADMITTED
