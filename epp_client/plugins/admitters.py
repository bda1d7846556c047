"""Admitters (B2.5, B2.6): ``admit(request, endpoints) -> Admission``.

They see the full candidate list after the producer, before any filter. A.2.2: a denial
is ``Admission(False, reason, status=429)`` (upstream rewraps it as HTTP 500).
"""
from __future__ import annotations

import random
from dataclasses import field

from epp_client.flowcontrol.saturation import roofline
from epp_client.framework.params import Plugin, gt, param
from epp_client.framework.protocols import Admitter
from epp_client.framework.registry import plugin
from epp_client.types import ADMITTED, Admission, Endpoint, InferenceRequest

#: An endpoint under this KV-cache use counts as cold (B2.5).
COLD_KV_USAGE = 0.02
DENIED_STATUS = 429


@plugin("latency-slo-admitter", Admitter)
class LatencySloAdmitter(Plugin):
    """``latency-slo-admitter``: sheddable requests with an SLO are rejected when no
    endpoint is predicted valid and none is idle (server metrics) or cold. Fail-open when
    no endpoint has a prediction."""

    latency_prediction_info_producer_name: str = param("latencyPredictionInfoProducerName", default="", ignored=True)

    REASON = "no valid endpoint available to serve the request"

    def setup(self) -> None:
        self.rejected = 0

    def admit(self, request: InferenceRequest | None, endpoints: list[Endpoint]) -> Admission:
        if request is None or request.priority >= 0:
            return ADMITTED
        if not (request.ttft_slo_ms > 0 or request.tpot_slo_ms > 0):
            return ADMITTED
        has_cold = has_idle = has_valid = has_pred = False
        for e in endpoints:
            m = e.metrics
            if m is not None:
                if m.kv_cache_usage < COLD_KV_USAGE:
                    has_cold = True
                if m.running_requests_size == 0:
                    has_idle = True
            p = e.prediction
            if p is not None:
                has_pred = True
                if p.ttft_valid and p.tpot_valid:
                    has_valid = True
        if not has_pred:
            return ADMITTED
        if not has_valid and not has_idle and not has_cold:
            self.rejected += 1
            return Admission(False, self.REASON, DENIED_STATUS)
        return ADMITTED


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
