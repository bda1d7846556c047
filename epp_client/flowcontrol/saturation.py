"""Saturation detectors: is the pool saturated? (llm-d's two detectors, with their defaults)

Flow control dispatches only while the pool's saturation is below 1.0 (upstream's static
usage limit). Both detectors read one :class:`EndpointLoad` per candidate endpoint.

``utilization-detector`` (the default) reads the *scraped* metrics. Per endpoint the score
is its most constrained resource, ``max(waiting / queueDepthThreshold, kvCacheUsage /
kvCacheUtilThreshold)``; an endpoint whose metrics are missing or older than
``metricsStalenessThreshold`` scores 1.0 (fail-closed). The pool's saturation is the
unweighted mean over endpoints (1.0 for an empty pool). Defaults: queueDepthThreshold 5,
kvCacheUtilThreshold 0.8, metricsStalenessThreshold 200ms, headroom 0 (headroom only
relaxes upstream's per-endpoint scheduling filter, which this project does not implement;
it is accepted and kept).

``concurrency-detector`` reads the router's own *in-flight* accounting
(``inflight-load-producer``: requests dispatched and not yet completed, and their uncached
prompt tokens until the first token), which changes at every dispatch and completion, so
it never bursts past its limit between two scrapes. ``concurrencyMode`` ``requests``:
saturation = Σ in-flight requests / (endpoints × ``maxConcurrency``); ``tokens``: Σ
in-flight tokens / (endpoints × ``maxTokenConcurrency``); ``hybrid``: the mean over
endpoints of ``max(requests / maxConcurrency, tokens / maxTokenConcurrency)``. Defaults:
mode requests, maxConcurrency 100, maxTokenConcurrency 1,000,000, headroom 0 (again only
for upstream's endpoint filter). Source: llm-d/llm-d-router
``pkg/epp/framework/plugins/flowcontrol/saturationdetector/{utilization,concurrency}/config.go``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from epp_client.framework.params import Check, Plugin, ge, gt, one_of, param

#: flow control holds requests back while the pool's saturation is at or above this
USAGE_LIMIT = 1.0


class EndpointLoad(NamedTuple):
    waiting: int
    kv_cache_usage: float
    updated_at: float | None       # when these metrics were taken (None: never)
    inflight_requests: int = 0     # the router's in-flight accounting (always current)
    inflight_tokens: int = 0


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

    def saturation(self, endpoints: Sequence[EndpointLoad], now: float, pending: int = 0) -> float:
        """``pending`` is unused: the scraped metrics are what this detector reads."""
        if not endpoints:
            return 1.0
        total = 0.0
        for e in endpoints:
            if e.updated_at is None or now - e.updated_at > self.metrics_staleness_s:
                total += 1.0
            else:
                total += roofline(e.waiting, e.kv_cache_usage, self.queue_depth_threshold, self.kv_cache_util_threshold)
        return total / len(endpoints)

    def saturated(self, endpoints: Sequence[EndpointLoad], now: float, pending: int = 0) -> bool:
        return self.saturation(endpoints, now, pending) >= USAGE_LIMIT


class ConcurrencyDetector(Plugin):
    TYPE = "concurrency-detector"

    concurrency_mode: str = param("concurrencyMode", default="requests", check=one_of("requests", "tokens", "hybrid"))
    max_concurrency: int = param("maxConcurrency", default=100, check=gt(0),
                                 doc="in-flight requests per endpoint at saturation 1.0")
    max_token_concurrency: int = param("maxTokenConcurrency", default=1_000_000, check=gt(0),
                                       doc="in-flight tokens per endpoint at saturation 1.0")
    headroom: float = param("headroom", default=0.0, check=ge(0.0))

    def saturation(self, endpoints: Sequence[EndpointLoad], now: float, pending: int = 0) -> float:
        """``pending``: requests released by flow control that no endpoint counts yet (they
        count as requests, their tokens are not known yet). ``now`` is unused: in-flight
        counts are never stale."""
        if not endpoints:
            return 1.0
        n = len(endpoints)
        reqs = pending / (n * self.max_concurrency)
        if self.concurrency_mode == "requests":
            return reqs + sum(e.inflight_requests for e in endpoints) / (n * self.max_concurrency)
        if self.concurrency_mode == "tokens":
            return sum(e.inflight_tokens for e in endpoints) / (n * self.max_token_concurrency)
        return reqs + sum(max(e.inflight_requests / self.max_concurrency,
                              e.inflight_tokens / self.max_token_concurrency) for e in endpoints) / n

    def saturated(self, endpoints: Sequence[EndpointLoad], now: float, pending: int = 0) -> bool:
        return self.saturation(endpoints, now, pending) >= USAGE_LIMIT


#: the detectors by plugin type
DETECTOR_TYPES = {c.TYPE: c for c in (UtilizationDetector, ConcurrencyDetector)}
