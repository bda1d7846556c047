"""``decode-harm-filter`` and ``decode-harm-scorer`` (this project's; none exists upstream):
prefer the endpoints where the request's prefill leaves the fewest running requests over their
TPOT SLO. The filter is in the recommended profile, after the loose affinity filter
(docs/plugins.md B2.9).

A prompt's prefill slows every engine step of the server it lands on, and with it the decode of
every request running there (docs/evaluation.md §4: on ``standard`` at 80% load every policy
that judges only the request being placed misses TPOT for 5% or more; the simulator's oracle
that also counts this harm reaches 98%). Per candidate ``e`` with a prediction:

- the request's own prefill ``P``: its lowest predicted TTFT over the candidates, scaled by the
  prompt tokens not cached on ``e`` over those not cached on that fastest endpoint, at most its
  predicted TTFT ``T`` on ``e``; the rest, ``Q = T - P``, is the queue ahead of it. ``k =
  ceil(uncached / prefillChunkTokens)`` engine steps of ``P / k`` each (at least the pace);
- the pace: the median TPOT so far of the requests running on ``e``, else its predicted TPOT;
- each request the producer has running on ``e`` (``LatencyPrediction.decoding``: decode time
  so far ``d``, TPOT so far ``p``, TPOT SLO ``s``; ``d = p = 0`` before its first token), judged
  ``probeSteps`` steps after the request's first token, one token per step: its TPOT so far then,
  ``(d + Q + P + probe * pace) / (d / p + Q / step + k + probe)``; one not decoding yet starts
  as the queue drains: ``(P + probe * pace) / (k + probe)``. Counted when over ``s``; with
  ``countLate: false`` only when the prefill's steps at the pace would leave it within ``s``
  (the marginal harm the simulator's ``oracle-harm`` counts, which sees no harm where every
  running request is already late and so sends requests to the most overloaded endpoints);
- the count: those, plus 1 when the request itself is predicted over its TTFT or TPOT SLO on
  ``e`` (``countOwnMiss``), plus ``adapterLoadCount`` (2) when ``e`` serves LoRA adapters and the
  request's is not active there (the models know nothing of adapter slots: without it the filter
  thrashed adapters, ``multi-lora`` at 80% fell from 64% to 45%), plus 1 when ``e``'s scraped KV
  cache use is over ``kvUsageThreshold`` (0.95): a prompt's blocks there risk preempting a running
  request, a cliff the models do not see coming (``heterogeneous`` at 100%, seed 2: 37% with
  1,293 preemptions without it, 60% with 315).

The filter keeps the endpoints with the lowest count (order preserved; endpoints without a
prediction only when none has one); the scorer gives ``1 / (1 + count)``, 0 without a prediction.
"""
from __future__ import annotations

from ..inflight import uncached_prompt_tokens
from ..params import Plugin, ge, gt, param, within
from ..types import Endpoint, InferenceRequest
from .protocols import Filter, Scorer
from .registry import plugin
from .scorers import lora_affinity


def harmed(decoding: tuple, prefill_ms: float, steps: int, queue_ms: float, pace_ms: float, probe: int,
           late: bool = True) -> int:
    """How many of ``decoding`` ((decode ms so far, TPOT so far, TPOT SLO) each; (0, 0, SLO) not
    decoding yet) are over their SLO ``probe`` steps after a prefill of ``prefill_ms`` in
    ``steps`` engine steps (one token each) that starts ``queue_ms`` from now, the steps before
    and after it ``pace_ms`` each. ``late`` False: only those it pushes over (within their SLO
    if the prefill's steps took ``pace_ms`` too)."""
    if prefill_ms <= 0 or steps <= 0 or not decoding or pace_ms <= 0:
        return 0
    step = max(prefill_ms / steps, pace_ms)
    q_steps = queue_ms / step                    # the queue ahead prefills at the same step time
    tail = prefill_ms + probe * pace_ms          # from the queue's end to the judging moment
    slow, calm = steps + probe, tail / pace_ms
    n = 0
    for d, p, s in decoding:
        if p > 0:
            time, done = d + queue_ms + tail, d / p + q_steps
        else:                                    # starts decoding as the queue ahead drains
            time, done = tail, 0.0
        if time / (done + slow) > s and (late or s >= time / (done + calm)):
            n += 1
    return n


def _loads_an_adapter(target: str, e: Endpoint) -> bool:
    """The endpoint serves LoRA adapters and ``target`` is not active there: serving the request
    there waits for the adapter to load, and may swap out one that others use."""
    m = e.metrics
    return bool(target) and m is not None and m.max_active_lora > 0 and lora_affinity(target, m) < 1.0


class DecodeHarmCount(Plugin):
    """What both plugins share: their parameters and the count per endpoint (:meth:`scores`)."""

    prefill_chunk_tokens: int = param("prefillChunkTokens", default=2048, check=gt(0),
                                      doc="prompt tokens the engine prefills per step (vLLM's max_num_batched_tokens)")

    probe_steps: int = param("probeSteps", default=4, check=gt(0),
                             doc="decode steps of the request after its first token that the harm is judged at")

    own_miss: bool = param("countOwnMiss", default=True,
                           doc="add 1 where the request itself is predicted to miss its SLO")

    adapter_load_count: float = param("adapterLoadCount", default=2.0, check=ge(0.0),
                                      doc="added where the request's LoRA adapter is not active on an endpoint "
                                          "that serves adapters (0: never)")

    kv_usage_threshold: float = param("kvUsageThreshold", default=0.95, check=within(0.0, 1.0),
                                      doc="add 1 where the endpoint's scraped KV cache use is above it (1: never)")

    count_late: bool = param("countLate", default=True,
                             doc="count the running requests over their TPOT SLO with the placement; false: only "
                                 "those it pushes over")

    def parts(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, tuple[float, float, float]]:
        """Per endpoint with a prediction, the count's three terms: (running requests harmed, 1 if
        the request itself is predicted to miss its SLO there, adapter load + near-full KV cache)."""
        with_pred = [e for e in endpoints if e.prediction is not None]
        if not with_pred:
            return {}
        prompt = max(0, int(request.input_tokens))
        best = min(with_pred, key=lambda e: e.prediction.ttft_ms)   # type: ignore[union-attr]
        best_ttft = best.prediction.ttft_ms                          # type: ignore[union-attr]
        best_uncached = max(1, uncached_prompt_tokens(best, prompt))
        out: dict[str, tuple[float, float, float]] = {}
        for e in with_pred:
            pred = e.prediction
            assert pred is not None
            uncached = max(1, uncached_prompt_tokens(e, prompt))
            prefill = min(pred.ttft_ms, best_ttft * uncached / best_uncached)
            steps = -(-uncached // self.prefill_chunk_tokens)
            decoding = pred.running_decodes()
            paces = sorted(p for _, p, _ in decoding if p > 0)
            pace = paces[len(paces) // 2] if paces else max(pred.tpot_ms, 1e-3)
            own = self.own_miss and (0 < request.ttft_slo_ms < pred.ttft_ms or 0 < request.tpot_slo_ms < pred.tpot_ms)
            harm = harmed(decoding, prefill, steps, pred.ttft_ms - prefill, pace, self.probe_steps, self.count_late)
            load = self.adapter_load_count if _loads_an_adapter(request.target_model, e) else 0.0
            full = e.metrics is not None and e.metrics.kv_cache_usage > self.kv_usage_threshold
            out[e.name] = (float(harm), float(own), load + int(full))
        return out

    def scores(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        """The count per endpoint with a prediction: harm, own miss, adapter load, near-full KV cache."""
        return {name: sum(terms) for name, terms in self.parts(request, endpoints).items()}


@plugin("decode-harm-filter", Filter)
class DecodeHarmFilter(DecodeHarmCount):
    """``decode-harm-filter``: keep the endpoints where the request's prefill harms the fewest decodes."""

    def setup(self) -> None:
        self.filtered = 0   # requests for which some candidate was dropped

    def filter(self, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        if len(endpoints) <= 1:
            return endpoints
        scores = self.scores(request, endpoints)
        if not scores:
            return endpoints
        low = min(scores.values())
        kept = [e for e in endpoints if scores.get(e.name, float("inf")) <= low]
        if len(kept) < len(endpoints):
            self.filtered += 1
        return kept


@plugin("decode-harm-scorer", Scorer)
class DecodeHarmScorer(DecodeHarmCount):
    """``decode-harm-scorer``: the filter's count as a score, 1 / (1 + count); 0 without a prediction."""

    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        counts = self.scores(request, endpoints)
        return {e.name: 1.0 / (1.0 + counts[e.name]) if e.name in counts else 0.0 for e in endpoints}
