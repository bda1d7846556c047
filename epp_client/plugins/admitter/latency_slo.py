"""``latency-slo-admitter`` (B2.5): deny a request no endpoint can serve within its SLOs."""
from __future__ import annotations

from epp_client.framework.params import Plugin, param
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
