"""Scorers (B2.4, B4.1-B4.3): ``score(request, endpoints) -> {name: raw score}``.

The profile clamps each raw score to [0, 1] and multiplies it by the scorer weight.
"""
from __future__ import annotations

import math

from epp_client.framework.params import Plugin, gt, one_of, param, within
from epp_client.framework.protocols import Scorer
from epp_client.framework.registry import plugin
from epp_client.plugins.lora_history import LoraRequestHistory
from epp_client.types import ConfigError, Endpoint, EndpointMetrics, InferenceRequest, LatencyPrediction

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


@plugin("queue-scorer", Scorer)
class QueueScorer(Plugin):
    """``queue-scorer``: (maxQ - q) / (maxQ - minQ) over waiting queues; 1.0 when all equal."""

    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        qs = [e.metrics.waiting_queue_size if e.metrics is not None else 0 for e in endpoints]
        if not qs:
            return {}
        lo, hi = min(qs), max(qs)
        if hi == lo:
            return {e.name: 1.0 for e in endpoints}
        return {e.name: (hi - q) / (hi - lo) for e, q in zip(endpoints, qs)}


@plugin("kv-cache-utilization-scorer", Scorer)
class KVCacheUtilizationScorer(Plugin):
    """``kv-cache-utilization-scorer``: 1 - KV-cache usage (a fraction)."""

    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        return {e.name: 1.0 - (e.metrics.kv_cache_usage if e.metrics is not None else 0.0) for e in endpoints}


@plugin("prefix-cache-scorer", Scorer)
class PrefixCacheScorer(Plugin):
    """``prefix-cache-scorer``: w·min(1, matched tokens / scale)² + (1 - w)·match/total."""

    match_length_weight: float = param("matchLengthWeight", default=0.0, check=within(0.0, 1.0),
                                       doc="weight w of the matched length against the matched fraction")
    match_length_scale_tokens: float = param("matchLengthScaleTokens", default=8192.0,
                                             doc="matched tokens that score a full length (> 0 when w > 0)")

    def setup(self) -> None:
        if self.match_length_weight > 0 and self.match_length_scale_tokens <= 0:
            raise ConfigError(f"{self.TYPE}.matchLengthScaleTokens",
                              f"must be > 0 when matchLengthWeight > 0, got {self.match_length_scale_tokens!r}")

    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        w = self.match_length_weight
        out = {}
        for e in endpoints:
            pm = e.prefix_match
            if pm is None or pm.total_blocks <= 0:
                out[e.name] = 0.0
                continue
            ratio = pm.match_blocks / pm.total_blocks
            if w > 0:
                length = min(1.0, pm.match_blocks * pm.block_size_tokens / self.match_length_scale_tokens)
                out[e.name] = w * length * length + (1 - w) * ratio
            else:
                out[e.name] = ratio
        return out


def lora_affinity(target: str, m: EndpointMetrics | None) -> float:
    """The metric-only LoRA affinity of ``target`` on an endpoint: 1.0 active, 0.8 spare adapter
    capacity, 0.6 waiting, else 0 (also without metrics)."""
    if m is None:
        return 0.0
    if target in m.active_lora_adapters:
        return 1.0
    if len(m.active_lora_adapters) + len(m.waiting_lora_adapters) < m.max_active_lora:
        return 0.8
    return 0.6 if target in m.waiting_lora_adapters else 0.0


@plugin("lora-affinity-scorer", Scorer)
class LoraAffinityScorer(Plugin):
    """``lora-affinity-scorer``: 1.0 active, 0.8 spare adapter capacity, 0.6 waiting, else 0.

    With ``requestHistory: true`` it also remembers what this router sent where
    (:class:`~epp_client.plugins.lora_history.LoraRequestHistory`, driven by the
    scheduler's lifecycle) and scores the same rules over the running adapters completed
    by the history (scraped running ∪ adapters with a history count > 0), with one more
    tier: 1.0 if the adapter is running or in flight there; else 0.9 if |running ∪
    history| + |waiting| < ``max_lora`` and the adapter is among the last ``max_lora``
    this router sent there (probably still loaded); else 0.8 if that sum is < ``max_lora``;
    else 0.6 if the adapter is waiting there; else 0. Requests without an adapter score
    1.0 everywhere. The history is reconciled with the scraped metrics every
    ``reconcileIntervalSeconds``.
    """

    request_history: bool = param("requestHistory", default=False, doc="also count what this router sent where")
    reconcile_interval_seconds: float = param("reconcileIntervalSeconds", default=1.0, check=gt(0.0),
                                              doc="how often the history is reconciled with the metrics")

    def setup(self) -> None:
        self.history = LoraRequestHistory(self.reconcile_interval_seconds) if self.request_history else None

    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        if self.history is not None:
            return self._score_with_history(self.history, request, endpoints)
        return {e.name: lora_affinity(request.target_model, e.metrics) for e in endpoints}

    def _score_with_history(self, history: LoraRequestHistory, request: InferenceRequest,
                            endpoints: list[Endpoint]) -> dict[str, float]:
        target = request.target_model
        if not target:
            return {e.name: 1.0 for e in endpoints}
        out = {}
        for e in endpoints:
            m = e.metrics
            running = m.active_lora_adapters if m is not None else frozenset()
            waiting = m.waiting_lora_adapters if m is not None else frozenset()
            max_lora = m.max_active_lora if m is not None else 0
            active = running | history.adapters(e.name)
            if target in active:
                out[e.name] = 1.0
            elif len(active) + len(waiting) < max_lora:
                out[e.name] = 0.9 if target in history.recent(e.name, max_lora) else 0.8
            elif target in waiting:
                out[e.name] = 0.6
            else:
                out[e.name] = 0.0
        return out

    # -- request lifecycle (called by the scheduler; no-ops without history) --------------
    def observe(self, endpoints: list[Endpoint], now: float) -> None:
        """Before each scheduling decision, with every candidate: the periodic reconcile."""
        if self.history is not None:
            self.history.maybe_reconcile(endpoints, now)

    def pre_request(self, request: InferenceRequest, target: Endpoint) -> None:
        if self.history is not None:
            self.history.dispatched(request.request_id, target.name, request.target_model)

    def on_complete(self, request_id: str) -> None:
        """Completion and abort alike: -1, floored at 0."""
        if self.history is not None:
            self.history.released(request_id)
