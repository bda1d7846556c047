"""What the engine twin's TTFT is made of, for learning its step model.

A twin step takes ``(fixed + per_token * tokens + per_context * context + decode * [decodes]
+ per_pair * pairs) / speed`` (:class:`~epp_client.engine.twin.StepModel`, ignoring its 0.1 ms
floor). Given the twin's schedule (which requests get which chunks in which step: set by the
token budget, not by the coefficients), the request's TTFT is then linear in the coefficients::

    ttft_ms = (c . F) / speed

where ``F`` sums, over the twin's steps from now until the step that gives the request its first
token, the five quantities the coefficients multiply (:data:`FEATURES`, in the order of
``features.schema.ENGINE_COEFFICIENTS``). :func:`step_features` computes ``F`` for a request
placed on an endpoint's running set, from the same inputs as :func:`~epp_client.engine.twin.placement`
(tests/test_engine_features.py checks ``c . F / speed`` against its TTFT for random states and
coefficients). The EPP sends ``F`` with the request's TPOT training entry; the training server
fits ``c`` per endpoint class and ``speed`` per endpoint (docs/plugins.md B2.9).

The schedule depends on the coefficients only through the prefill under way at the head of the
queue (how much of it is done by now, :func:`~epp_client.engine.twin._start`): ``F`` is computed
with the step model the router uses for the endpoint. A plain step loop (once per dispatched
request, not per candidate).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from epp_client.engine.queued import queue_state
from epp_client.engine.twin import Running, StepModel, _start

#: the five sums, or None (no first token within the step bound)
Sums = tuple[float, float, float, float, float]

#: the sums, in the order of the step model's coefficients (features.schema.ENGINE_FEATURE_FIELDS)
FEATURES = ("steps", "step_tokens", "step_context", "decode_steps", "prefill_pairs")


class EngineView(NamedTuple):
    """The twin's view of a request at dispatch on the endpoint it goes to: what its TPOT
    training entry carries (the wire's ``engine_*`` fields). ``redo(prompt_tokens,
    cached_tokens)`` recomputes ``features`` on the same schedule for another prompt length:
    the router schedules with the gateway's estimate of the prompt, the engine ran the true
    count, which the response reports (``usage.prompt_tokens``) at the end; the sums sent for
    learning use it (:meth:`for_prompt`), so the fit is not biased by the estimate's error."""

    endpoint: str
    engine_class: str
    features: Sums
    ttft_ms: float          # the twin's TTFT: coefficients . features / speed
    prompt_tokens: int = 0  # the prompt length the features were computed with (the estimate)
    cached_tokens: int = 0  # of which the router's prefix index found cached
    redo: Callable[[int, int], Sums | None] | None = None

    def for_prompt(self, true_tokens: int | None) -> Sums:
        """The features with the prompt's true token count (its cached part scaled alike); the
        dispatch-time features when the count is unknown or the same, or the twin gives none."""
        if not true_tokens or true_tokens <= 0 or true_tokens == self.prompt_tokens or self.redo is None:
            return self.features
        cached = round(self.cached_tokens * true_tokens / self.prompt_tokens) if self.prompt_tokens > 0 else 0
        redone = self.redo(int(true_tokens), min(int(true_tokens), cached))
        return self.features if redone is None else redone


def twin_ttft(model: StepModel, features: tuple[float, ...]) -> float:
    """``(c . F) / speed``: the twin's TTFT from its step sums (the step floor ignored)."""
    c = (model.fixed_ms, model.per_token_ms, model.per_context_token_ms, model.decode_ms, model.per_prefill_pair_ms)
    return sum(a * b for a, b in zip(c, features)) / model.speed


def decoding_features(budget: int, decodes: int, context: float, prompt_tokens: int, cached_tokens: int,
                      max_steps: int = 4000) -> tuple[float, float, float, float, float] | None:
    """:func:`step_features` where every request running on the endpoint decodes (the common
    state): ``decodes`` of them with ``context`` tokens in all (the producer's columns,
    ``LatencyPrediction.decoding_columns``), without building their rows. The request is alone in
    the queue: its chunks are the steps until its first token."""
    room = budget - decodes
    left = max(1, prompt_tokens - cached_tokens)
    done = max(prompt_tokens, left) - left
    if room <= 0 or -(-left // room) > max_steps:
        return None
    steps = tokens_sum = context_sum = pairs_sum = 0.0
    while left > 0:
        n = left if left < room else room
        pairs_sum += n * (done + n / 2.0)
        tokens_sum += decodes + n
        context_sum += context
        context += decodes
        left -= n
        done += n
        steps += 1
    return steps, tokens_sum, context_sum, steps if decodes else 0.0, pairs_sum


def step_features(model: StepModel, budget: int, running: tuple[Running, ...], prompt_tokens: int,
                  cached_tokens: int, max_steps: int = 4000) -> tuple[float, float, float, float, float] | None:
    """The five sums of the twin's steps from now until the first token of a request of
    ``prompt_tokens`` (``cached_tokens`` of them cached) queued last on an endpoint running
    ``running``; None when the twin gives it no first token within ``max_steps``."""
    uncached = max(1, prompt_tokens - cached_tokens)
    new = Running(0.0, 0, 0.0, max(prompt_tokens, uncached), uncached)
    st = _start(model, budget, (*running, new))
    return _sums(budget, st.left, st.done, st.queue, st.decodes, st.context, len(running), max_steps)


def queued_features(model: StepModel, budget: int, decodes: int, context: float, queued: tuple[Running, ...],
                    prompt_tokens: int, cached_tokens: int, max_steps: int = 4000
                    ) -> tuple[float, float, float, float, float] | None:
    """:func:`step_features` where ``decodes`` requests with ``context`` tokens decode (with their
    tokens counted) and ``queued`` (dispatch order) wait for or are in their prefill: the
    producer's columns and queue (``DecodingView.queued``), without building the decodes' rows."""
    uncached = max(1, prompt_tokens - cached_tokens)
    left, done, queue = queue_state(model, budget, decodes, context, queued, prompt_tokens, uncached)
    return _sums(budget, left, done, queue, decodes, context, len(queued), max_steps)


def _sums(budget: int, left: list[int], done: list[int], queue: list[int], decodes: int, context: float, new_i: int,
          max_steps: int) -> tuple[float, float, float, float, float] | None:
    """The five sums of the twin's steps over ``queue`` (``left`` and ``done`` per request) beside
    ``decodes`` decodes with ``context`` tokens until request ``new_i``'s first token."""
    head, n_queue = 0, len(queue)
    steps = tokens_sum = context_sum = decode_steps = pairs_sum = 0.0
    for _ in range(max_steps):
        room = budget - decodes
        tokens, pairs, ready = decodes, 0.0, None
        j = head
        while j < n_queue and room > 0:
            i = queue[j]
            n = left[i]
            n = (n if n < room else room) if n > 1 else 1     # max(1, min(left, room))
            pairs += n * (done[i] + n / 2.0)
            left[i] -= n
            done[i] += n
            room -= n
            tokens += n
            if left[i] <= 0:
                if ready is None:
                    ready = [i]
                else:
                    ready.append(i)
            j += 1
        steps += 1
        tokens_sum += tokens
        context_sum += context
        if decodes:
            decode_steps += 1
        pairs_sum += pairs
        context += decodes
        if ready is not None:
            if new_i in ready:
                return steps, tokens_sum, context_sum, decode_steps, pairs_sum
            for i in ready:
                decodes += 1
                context += done[i] + 1
            while head < n_queue and left[queue[head]] <= 0:
                head += 1
    return None
