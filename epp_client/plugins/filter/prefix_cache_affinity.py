"""``prefix-cache-affinity-filter`` (B2.2): keep the endpoints that have the prompt cached,
unless that costs too much TTFT."""
from __future__ import annotations

import random
import sys
from dataclasses import field

from epp_client.framework.params import Plugin, ge, le, one_of, param, within
from epp_client.framework.protocols import Filter
from epp_client.framework.registry import plugin
from epp_client.types import ConfigError, Endpoint, InferenceRequest

_MAX_FLOAT = sys.float_info.max


@plugin("prefix-cache-affinity-filter", Filter)
class PrefixCacheAffinityFilter(Plugin):
    """``prefix-cache-affinity-filter``: keep the endpoints whose prefix score reaches
    ``affinity_threshold`` (inclusive), unless exploring (probability
    ``exploration_probability``) or unless the best sticky endpoint's TTFT is more than
    ``max_ttft_penalty_ms`` worse (strictly) than the best non-sticky one (load gate)."""

    affinity_threshold: float = param("affinityThreshold", default=0.80, check=le(1.0),
                                      doc="prefix score that makes an endpoint sticky (<= 0 disables the filter)")
    exploration_probability: float = param("explorationProbability", default=0.0, check=within(0.0, 1.0),
                                           doc="probability of keeping every endpoint (explore)")
    max_ttft_penalty_ms: float = param("maxTTFTPenaltyMs", default=18000.0, check=ge(0.0),
                                       doc="TTFT cost of stickiness that lifts the filter (0 disables the load gate)")
    ttft_source: str = param("ttftSource", default="prefillThroughput",
                             check=one_of("prefillThroughput", "latencyPredictor"),
                             doc="where the load gate's TTFT comes from")
    peak_prefill_throughput: float = param("peakPrefillThroughput", default=15928.0, check=ge(0.0),
                                           doc="prefill tokens/s for the `prefillThroughput` source (> 0 when used)")
    prefix_match_info_producer_name: str = param("prefixMatchInfoProducerName", default="", ignored=True)
    latency_prediction_info_producer_name: str = param("latencyPredictionInfoProducerName", default="", ignored=True)
    in_flight_load_producer_name: str = param("inFlightLoadProducerName", default="", ignored=True)
    rng: random.Random = field(default_factory=random.Random)

    def setup(self) -> None:
        if self.ttft_source == "prefillThroughput" and self.max_ttft_penalty_ms > 0 \
                and self.peak_prefill_throughput <= 0:
            raise ConfigError(f"{self.TYPE}.peakPrefillThroughput",
                              "must be > 0 when ttftSource is prefillThroughput and maxTTFTPenaltyMs > 0, "
                              f"got {self.peak_prefill_throughput!r}")
        self.rng = self.rng or random.Random()

    def _ttft(self, e: Endpoint) -> float:
        if self.ttft_source == "latencyPredictor":
            return e.prediction.ttft_ms if e.prediction is not None else _MAX_FLOAT
        tokens = e.inflight.tokens if e.inflight is not None else 0
        return tokens / self.peak_prefill_throughput * 1000.0

    def filter(self, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        if len(endpoints) <= 1 or self.affinity_threshold <= 0:
            return endpoints
        if self.rng.random() < self.exploration_probability:
            return endpoints
        sticky, other = [], []
        for e in endpoints:
            s = e.prefix_match.score if e.prefix_match is not None else 0.0
            (sticky if s >= self.affinity_threshold else other).append(e)
        if not sticky:
            return endpoints
        if self.max_ttft_penalty_ms > 0 and other:
            best_s = min(self._ttft(e) for e in sticky)
            best_n = min(self._ttft(e) for e in other)
            if best_s - best_n > self.max_ttft_penalty_ms:
                return endpoints
        return sticky
