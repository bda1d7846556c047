"""Filters (B2.2, B2.3): ``filter(request, endpoints) -> list[Endpoint]``, order preserved,
never empty for a non-empty input."""
from __future__ import annotations

import random
import sys

from ..params import Configurable, Param, ge, one_of, within
from ..types import ConfigError, Endpoint, InferenceRequest

_MAX_FLOAT = sys.float_info.max


class PrefixCacheAffinityFilter(Configurable):
    """``prefix-cache-affinity-filter``: keep the endpoints whose prefix score reaches
    ``affinity_threshold`` (inclusive), unless exploring (probability
    ``exploration_probability``) or unless the best sticky endpoint's TTFT is more than
    ``max_ttft_penalty_ms`` worse (strictly) than the best non-sticky one (load gate)."""

    TYPE = "prefix-cache-affinity-filter"
    PARAMS = (
        Param("affinityThreshold", "affinity_threshold", "float",
              lambda v: None if v <= 1.0 else f"must be <= 1.0, got {v!r}"),
        Param("explorationProbability", "exploration_probability", "float", within(0.0, 1.0)),
        Param("maxTTFTPenaltyMs", "max_ttft_penalty_ms", "float", ge(0.0)),
        Param("ttftSource", "ttft_source", "str", one_of("prefillThroughput", "latencyPredictor")),
        Param("peakPrefillThroughput", "peak_prefill_throughput", "float", ge(0.0)),
        Param("prefixMatchInfoProducerName", "prefix_match_info_producer_name", "str"),
        Param("latencyPredictionInfoProducerName", "latency_prediction_info_producer_name", "str"),
        Param("inFlightLoadProducerName", "in_flight_load_producer_name", "str"),
    )
    EXTRA = ("rng",)

    def __init__(self, affinity_threshold: float = 0.80, exploration_probability: float = 0.0,
                 max_ttft_penalty_ms: float = 18000.0, ttft_source: str = "prefillThroughput",
                 peak_prefill_throughput: float = 15928.0, prefix_match_info_producer_name: str = "",
                 latency_prediction_info_producer_name: str = "", in_flight_load_producer_name: str = "",
                 rng: random.Random | None = None) -> None:
        v = self._validated(affinity_threshold=affinity_threshold, exploration_probability=exploration_probability,
                            max_ttft_penalty_ms=max_ttft_penalty_ms, ttft_source=ttft_source,
                            peak_prefill_throughput=peak_prefill_throughput)
        if v["ttft_source"] == "prefillThroughput" and v["max_ttft_penalty_ms"] > 0 \
                and v["peak_prefill_throughput"] <= 0:
            raise ConfigError(f"{self.TYPE}.peakPrefillThroughput",
                              "must be > 0 when ttftSource is prefillThroughput and maxTTFTPenaltyMs > 0")
        self.affinity_threshold = v["affinity_threshold"]
        self.exploration_probability = v["exploration_probability"]
        self.max_ttft_penalty_ms = v["max_ttft_penalty_ms"]
        self.ttft_source = v["ttft_source"]
        self.peak_prefill_throughput = v["peak_prefill_throughput"]
        self.rng = rng or random.Random()

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


class SloHeadroomTierFilter(Configurable):
    """``slo-headroom-tier-filter``: keep the tier with non-negative TTFT and TPOT headroom;
    with probability ``epsilon_explore_neg`` keep the negative tier instead. Endpoints
    without a prediction join the negative tier; if nobody has one, keep all."""

    TYPE = "slo-headroom-tier-filter"
    PARAMS = (
        Param("epsilonExploreNeg", "epsilon_explore_neg", "float", within(0.0, 1.0)),
        Param("latencyPredictionInfoProducerName", "latency_prediction_info_producer_name", "str"),
    )
    EXTRA = ("rng",)

    def __init__(self, epsilon_explore_neg: float = 0.01, latency_prediction_info_producer_name: str = "",
                 rng: random.Random | None = None) -> None:
        v = self._validated(epsilon_explore_neg=epsilon_explore_neg)
        self.epsilon_explore_neg = v["epsilon_explore_neg"]
        self.rng = rng or random.Random()

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
