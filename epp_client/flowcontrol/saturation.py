"""``utilization-detector``: is the pool saturated? (llm-d's defaults)

Per endpoint the score is its most constrained resource,
``max(waiting / queueDepthThreshold, kvCacheUsage / kvCacheUtilThreshold)``; an endpoint
whose metrics are missing or older than ``metricsStalenessThreshold`` scores 1.0
(fail-closed). The pool's saturation is the unweighted mean over endpoints (1.0 for an
empty pool). Flow control dispatches only while saturation < 1.0 (upstream's static
usage limit). Defaults: queueDepthThreshold 5, kvCacheUtilThreshold 0.8,
metricsStalenessThreshold 200ms, headroom 0 (headroom only relaxes upstream's per-endpoint
scheduling filter, which this project does not implement; it is accepted and kept).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..params import Check, Plugin, ge, gt, param

#: flow control holds requests back while the pool's saturation is at or above this
USAGE_LIMIT = 1.0


class EndpointLoad(NamedTuple):
    waiting: int
    kv_cache_usage: float
    updated_at: float | None       # when these metrics were taken (None: never)


def roofline(waiting: float, kv_cache_usage: float, queue_depth_threshold: float,
             kv_cache_util_threshold: float) -> float:
    """One endpoint's saturation score: its most constrained resource."""
    return max(waiting / queue_depth_threshold, kv_cache_usage / kv_cache_util_threshold)


class UtilizationDetector(Plugin):
    TYPE = "utilization-detector"

    queue_depth_threshold: int = param("queueDepthThreshold", default=5, check=gt(0))
    kv_cache_util_threshold: float = param("kvCacheUtilThreshold", default=0.8,
                                           check=Check(lambda v: 0.0 < v <= 1.0, "in (0, 1]"))
    metrics_staleness_s: float = param("metricsStalenessThreshold", default=0.2, check=gt(0.0), kind="duration")
    headroom: float = param("headroom", default=0.0, check=ge(0.0))

    def saturation(self, endpoints: Sequence[EndpointLoad], now: float) -> float:
        if not endpoints:
            return 1.0
        total = 0.0
        for e in endpoints:
            if e.updated_at is None or now - e.updated_at > self.metrics_staleness_s:
                total += 1.0
            else:
                total += roofline(e.waiting, e.kv_cache_usage, self.queue_depth_threshold, self.kv_cache_util_threshold)
        return total / len(endpoints)

    def saturated(self, endpoints: Sequence[EndpointLoad], now: float) -> bool:
        return self.saturation(endpoints, now) >= USAGE_LIMIT
