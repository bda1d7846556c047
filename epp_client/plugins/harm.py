"""``decode-harm-filter`` and ``decode-harm-scorer`` (this project's; none exists upstream):
prefer the endpoints where the request's prefill pushes the fewest running requests over their
TPOT SLO. Experimental: not in the recommended profile (docs/plugins.md B2.9).

A prompt's prefill slows every engine step of the server it lands on, and with it the decode of
every request running there (docs/evaluation.md §4: on ``standard`` at 80% load every policy
that judges only the request being placed misses TPOT for 5% or more; the simulator's oracle
that also counts this harm reaches 98%). Per candidate ``e`` with a prediction:

- the prefill's length ``P``: the request's lowest predicted TTFT over the candidates, scaled by
  the prompt tokens not cached on ``e`` over those not cached on that fastest endpoint, at most
  its predicted TTFT on ``e``; its engine steps ``ceil(uncached / prefillChunkTokens)``, each
  ``P / steps`` long (at least the predicted TPOT on ``e``);
- for each request the producer has running on ``e`` (``LatencyPrediction.decoding``: decode
  time so far ``d``, TPOT so far ``p``, TPOT SLO ``s``; ``d = p = 0`` before its first token):
  its TPOT so far when the prefill ends, with one token per prefill step,
  ``(d + P) / (d / p + P / step)``, against the same with one token per predicted TPOT on ``e``;
  it is harmed when the first is over ``s`` and the second is not;
- the count: those harmed, plus 1 when the request itself is predicted over its TTFT or TPOT
  SLO on ``e`` (``countOwnMiss``).

The filter keeps the endpoints with the lowest count (order preserved; endpoints without a
prediction only when none has one); the scorer gives ``1 / (1 + count)``, 0 without a prediction.
"""
from __future__ import annotations

from ..inflight import uncached_prompt_tokens
from ..params import Plugin, gt, param
from ..types import Endpoint, InferenceRequest
from .protocols import Filter, Scorer
from .registry import plugin


def harmed(decoding: tuple, stall_ms: float, step_ms: float, pace_ms: float) -> int:
    """How many of ``decoding`` ((decode ms so far, TPOT so far, TPOT SLO) each; (0, 0, SLO) not
    decoding yet) a prefill of ``stall_ms`` at ``step_ms`` per token (one token per engine step)
    pushes over their SLO by its end, that ``pace_ms`` per token would leave within it."""
    if stall_ms <= 0 or not decoding:
        return 0
    slow, calm = stall_ms / step_ms, stall_ms / pace_ms
    n = 0
    for d, p, s in decoding:
        done = d / p if p > 0 else 0.0
        if (d + stall_ms) / (done + slow) > s >= (d + stall_ms) / (done + calm):
            n += 1
    return n


class DecodeHarmCount(Plugin):
    """What both plugins share: their parameters and the count per endpoint (:meth:`scores`)."""

    prefill_chunk_tokens: int = param("prefillChunkTokens", default=2048, check=gt(0),
                                      doc="prompt tokens the engine prefills per step (vLLM's max_num_batched_tokens)")

    own_miss: bool = param("countOwnMiss", default=True,
                           doc="add 1 where the request itself is predicted to miss its SLO")

    def scores(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        """Harm + own miss per endpoint with a prediction."""
        with_pred = [e for e in endpoints if e.prediction is not None]
        if not with_pred:
            return {}
        prompt = max(0, int(request.input_tokens))
        best = min(with_pred, key=lambda e: e.prediction.ttft_ms)   # type: ignore[union-attr]
        best_ttft = best.prediction.ttft_ms                          # type: ignore[union-attr]
        best_uncached = max(1, uncached_prompt_tokens(best, prompt))
        out: dict[str, float] = {}
        for e in with_pred:
            pred = e.prediction
            assert pred is not None
            uncached = max(1, uncached_prompt_tokens(e, prompt))
            stall = min(pred.ttft_ms, best_ttft * uncached / best_uncached)
            steps = -(-uncached // self.prefill_chunk_tokens)   # the prefill's steps, one token each for decodes
            pace = max(pred.tpot_ms, 1e-3)
            own = self.own_miss and (0 < request.ttft_slo_ms < pred.ttft_ms or 0 < request.tpot_slo_ms < pred.tpot_ms)
            out[e.name] = harmed(pred.running_decodes(), stall, max(stall / steps, pace), pace) + int(own)
        return out


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
