"""``latency-scorer`` (B2.4): score by predicted latency headroom; the composite fallback (B1.9) without predictions."""
from __future__ import annotations

import math

from epp_client.framework.params import Plugin, one_of, param
from epp_client.framework.protocols import Scorer
from epp_client.framework.registry import plugin
from epp_client.types import Endpoint, InferenceRequest, LatencyPrediction

_EPS = 1e-9


def _round_half_up(x: float) -> float:
    # round half away from zero; x >= 0 here, so floor(x + 0.5) (B conventions)
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def _prefix_score(e: Endpoint) -> float:
    return e.prefix_match.score if e.prefix_match is not None else 0.0


def composite_scores(endpoints: list[Endpoint], kv_weight: float = 1.0, queue_weight: float = 1.0,
                     prefix_weight: float = 1.0) -> dict[str, float]:
    """The latency scorer's composite fallback (B1.9), used whenever predictions are missing."""
    total = kv_weight + queue_weight + prefix_weight
    if total <= 0:
        wkv, wq, wp = 1.0, 0.0, 0.0
    else:
        wkv, wq, wp = kv_weight / total, queue_weight / total, prefix_weight / total
    max_q = 0
    for e in endpoints:
        if e.metrics is not None and e.metrics.waiting_queue_size > max_q:
            max_q = e.metrics.waiting_queue_size
    out = {}
    for e in endpoints:
        m = e.metrics
        q = m.waiting_queue_size if m is not None else 0
        kv = m.kv_cache_usage if m is not None else 0.0
        rel_queue = (max_q - q) / max_q if max_q > 0 else 1.0
        kv_free = 1.0 - kv
        out[e.name] = _round_half_up(100.0 * (wkv * kv_free + wq * rel_queue + wp * _prefix_score(e))) / 100.0
    return out


@plugin("latency-scorer", Scorer)
class LatencyScorer(Plugin):
    """``latency-scorer``: scores by SLO headroom of the producer's predictions.

    Positive bucket first (configured strategy), else idle negative endpoints, else the
    first non-empty deficit bucket (TPOT-only, TTFT-only, both), always ``least`` there.
    A.2.1: an endpoint without a prediction is on the negative side and scores 0 whenever
    another endpoint has a prediction (upstream counts it as positive with headroom (0, 0)).
    Without any prediction the composite fallback (B1.9) scores everyone.
    """

    ttft_weight: float = param("ttftWeight", default=0.8, doc="weight of the TTFT headroom")
    tpot_weight: float = param("tpotWeight", default=0.2, doc="weight of the TPOT headroom")
    # any value other than "most" acts as "least" (no validation upstream)
    headroom_selection_strategy: str = param("headroomSelectionStrategy", default="least",
                                             doc="`most`: prefer the largest headroom; anything else: the tightest fit")
    negative_selection_strategy: str = param(
        "negativeSelectionStrategy", default="least", check=one_of("least", "most"),
        doc="no busy endpoint meets the SLO: `least` (upstream) prefers the smallest deficit in the first "
            "non-empty deficit bucket, `most` the largest (keep hopeless requests off the endpoints that "
            "can still serve others in time)")
    headroom_normalization: str = param(
        "headroomNormalization", default="range", check=one_of("range", "slo"),
        doc="positive bucket under `most`: `range` (upstream) stretches each headroom over the candidates' range, "
            "`slo` takes each as a fraction of its SLO before weighting, so a TPOT difference that is small "
            "against the TPOT SLO stays small")
    composite_kv_weight: float = param("compositeKVWeight", default=1.0, doc="fallback: weight of free KV cache")
    composite_queue_weight: float = param("compositeQueueWeight", default=1.0,
                                          doc="fallback: weight of the relative queue")
    composite_prefix_weight: float = param("compositePrefixWeight", default=1.0,
                                           doc="fallback: weight of the prefix score")
    latency_prediction_info_producer_name: str = param("latencyPredictionInfoProducerName", default="", ignored=True)
    prefix_match_info_producer_name: str = param("prefixMatchInfoProducerName", default="", ignored=True)

    def setup(self) -> None:
        self.fallbacks = 0  # how often the composite fallback was used

    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        scores = {e.name: 0.0 for e in endpoints}
        # (endpoint, its prediction) pairs: only endpoints with a prediction enter a bucket
        positive: list[tuple[Endpoint, LatencyPrediction]] = []
        negative: list[tuple[Endpoint, LatencyPrediction]] = []
        for e in endpoints:
            p = e.prediction
            if p is None:
                continue  # A.2.1: never in the positive bucket
            if p.ttft_headroom_ms < 0 or p.tpot_headroom_ms < 0:
                negative.append((e, p))
            else:
                positive.append((e, p))
        if not positive and not negative:
            self.fallbacks += 1
            return composite_scores(endpoints, self.composite_kv_weight, self.composite_queue_weight,
                                    self.composite_prefix_weight)
        if positive:
            self._score_bucket(positive, self.headroom_selection_strategy == "most", scores)
            return scores
        idle = [(e, p) for e, p in negative if p.dispatched_request_count == 0]
        if idle:
            self._score_bucket(idle, False, scores)
            return scores
        tpot_only: list[tuple[Endpoint, LatencyPrediction]] = []
        ttft_only: list[tuple[Endpoint, LatencyPrediction]] = []
        both: list[tuple[Endpoint, LatencyPrediction]] = []
        for e, p in negative:
            if p.ttft_headroom_ms >= 0:
                tpot_only.append((e, p))
            elif p.tpot_headroom_ms >= 0:
                ttft_only.append((e, p))
            else:
                both.append((e, p))
        self._score_bucket(tpot_only or ttft_only or both, self.negative_selection_strategy == "most", scores)
        return scores

    def _score_bucket(self, bucket: list[tuple[Endpoint, LatencyPrediction]], most: bool,
                      scores: dict[str, float]) -> None:
        wsum = self.ttft_weight + self.tpot_weight
        if wsum <= 0:
            alpha, beta = 1.0, 0.0
        else:
            alpha, beta = self.ttft_weight / wsum, self.tpot_weight / wsum
        if most and self.headroom_normalization == "slo":
            self._score_by_slo_share(bucket, alpha, beta, scores)
            return
        ht = [abs(pred.ttft_headroom_ms) for _, pred in bucket]
        hp = [abs(pred.tpot_headroom_ms) for _, pred in bucket]
        min_t, min_p = min(ht), min(hp)
        r_t, r_p = max(ht) - min_t, max(hp) - min_p
        if r_t <= _EPS and r_p > _EPS:
            alpha, beta = 0.0, 1.0
        elif r_p <= _EPS and r_t > _EPS:
            alpha, beta = 1.0, 0.0
        for (e, _), t, p in zip(bucket, ht, hp):
            n_t = (t - min_t) / r_t if r_t > _EPS else 0.5
            n_p = (p - min_p) / r_p if r_p > _EPS else 0.5
            c = alpha * n_t + beta * n_p
            w = int(c * 100) + 1 if most else int((1 - c) * 100) + 1
            scores[e.name] = w / 100

    @staticmethod
    def _score_by_slo_share(bucket: list[tuple[Endpoint, LatencyPrediction]], alpha: float, beta: float,
                            scores: dict[str, float]) -> None:
        """``headroomNormalization: slo`` (positive bucket, ``most``): c = α·TTFT headroom / TTFT SLO
        + β·TPOT headroom / TPOT SLO (the SLO each headroom was taken against, buffered for TPOT),
        then c stretched over the candidates (the best 1.01, the worst 0.01, as ``range`` does)."""
        cs = []
        for _, pred in bucket:
            slo_t = pred.ttft_ms + pred.ttft_headroom_ms
            slo_p = pred.tpot_ms + pred.tpot_headroom_ms
            cs.append(alpha * (pred.ttft_headroom_ms / slo_t if slo_t > _EPS else 0.0)
                      + beta * (pred.tpot_headroom_ms / slo_p if slo_p > _EPS else 0.0))
        lo, hi = min(cs), max(cs)
        for (e, _), c in zip(bucket, cs):
            n = (c - lo) / (hi - lo) if hi - lo > _EPS else 0.5
            scores[e.name] = (int(n * 100) + 1) / 100
