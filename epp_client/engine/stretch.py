"""The engine twin's stretches of like steps (:mod:`epp_client.engine.twin`): decode-only steps
(every request running decodes, nothing is left to prefill), the full chunks of one long prompt
(:func:`full_chunks`) and one prompt alone in the queue beside decodes (:func:`alone_each`).

In each stretch a step's duration grows by the same amount from one step to the next (a decode
adds its token to the context; a chunk also adds its causal pairs), so the time after ``k`` steps
is an arithmetic series and the step at which a stretch reaches a time is the root of a
quadratic (:func:`linear_steps`): a few operations whatever the stretch's length or the state it
starts from (an endpoint's state changes with every token its requests stream, so nothing stepped
for one decision serves the next). Where a step could be floored at 0.1 ms (a step model with a
step under it or a negative coefficient) the stretch is stepped one step at a time instead, as
the general step of :func:`epp_client.engine.twin._run` does. A series sums the steps in another
order than stepping does: the times agree to rounding, the step counts exactly
(tests/test_twin_exact.py holds the twin to a plain replay within 1e-9, relative).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epp_client.engine.twin import StepModel

#: the shortest step (ms) before the step model's speed: a step model's step is floored there
FLOOR_MS = 0.1


def linear_steps(a: float, b: float, speed: float, t: float, n: int, until_ms: float | None
                 ) -> tuple[float, int] | None:
    """Up to ``n`` steps from ``t`` whose ``j``-th (from 0) takes ``(a + b * j) / speed`` ms, up to
    the first that ends at or after ``until_ms`` (None: all ``n``): (time reached, steps taken),
    at least one step where ``n`` >= 1. None where a step could be floored (``a`` < ``FLOOR_MS``
    or ``b`` < 0, or either not finite): the caller steps those one at a time."""
    if not (FLOOR_MS <= a < math.inf and 0.0 <= b < math.inf):
        return None
    if n <= 0:
        return t, 0
    if until_ms is None or not until_ms < math.inf:
        k = n
    else:
        d = (until_ms - t) * speed      # the steps' ms needed to reach until_ms
        if d <= 0.0:
            k = 1
        else:
            h = a - 0.5 * b             # sum over k steps: k * h + b * k * k / 2; its root, without cancellation
            k = math.ceil(d / a) if b == 0.0 else math.ceil(2.0 * d / (h + math.sqrt(h * h + 2.0 * b * d)))
            k = 1 if k < 1 else (n if k > n else k)
            while k > 1 and t + ((k - 1) * a + 0.5 * b * (k - 1) * (k - 2)) / speed >= until_ms:
                k -= 1                  # the root's rounding: the first step at or after until_ms
            while k < n and t + (k * a + 0.5 * b * k * (k - 1)) / speed < until_ms:
                k += 1
    return t + (k * a + 0.5 * b * k * (k - 1)) / speed, k


def _decode_steps(model: StepModel, decodes: int, context: float, t: float, n: int, until_ms: float | None
                  ) -> tuple[float, int]:
    """``n`` decode-only steps of ``decodes`` requests with ``context`` tokens from ``t``, or fewer:
    up to the first that ends at or after ``until_ms``. Returns (time reached, steps taken): a
    step's cost is the general step's with no prefill chunk (:func:`linear_steps`)."""
    if n <= 0:
        return t, 0
    base = model.fixed_ms + model.per_token_ms * decodes
    per_context, decode_ms, speed = model.per_context_token_ms, model.decode_ms, model.speed
    zero = model.per_prefill_pair_ms * 0.0
    got = linear_steps(base + per_context * context + decode_ms + zero, per_context * decodes, speed, t, n, until_ms)
    if got is not None:
        return got
    k = 0
    while k < n:
        ms = base + per_context * context + decode_ms + zero
        t += (ms if ms > FLOOR_MS else FLOOR_MS) / speed
        context += decodes
        k += 1
        if until_ms is not None and t >= until_ms:
            break
    return t, k


def full_chunks(model: StepModel, decodes: int, context: float, t: float, room: int, done: int, m: int,
                until_ms: float | None) -> tuple[float, int]:
    """``m`` steps from ``t`` in which one prompt (``done`` of its tokens prefilled) takes the whole
    ``room`` of the budget beside ``decodes`` decodes with ``context`` tokens, or fewer: up to the
    first that ends at or after ``until_ms``. Returns (time reached, steps taken): the general step
    of :func:`epp_client.engine.twin._run`, each chunk ``room`` more tokens in and ``decodes`` more
    in the decodes' context than the one before (:func:`linear_steps`)."""
    per_context, per_pair = model.per_context_token_ms, model.per_prefill_pair_ms
    a = (model.fixed_ms + model.per_token_ms * (decodes + room) + per_context * context
         + (model.decode_ms if decodes else 0.0) + per_pair * (room * (done + room / 2.0)))
    got = linear_steps(a, per_context * decodes + per_pair * room * room, model.speed, t, m, until_ms)
    return got if got is not None else _full_chunks_loop(model, decodes, context, t, room, done, m, until_ms)


def _full_chunks_loop(model: StepModel, decodes: int, context: float, t: float, room: int, done: int, m: int,
                      until_ms: float | None) -> tuple[float, int]:
    """:func:`full_chunks` stepped one chunk at a time (the general step's arithmetic in its order)."""
    fixed, per_token, per_context, per_pair, speed = model.fixed_ms, model.per_token_ms, \
        model.per_context_token_ms, model.per_prefill_pair_ms, model.speed
    dm = model.decode_ms if decodes else 0.0
    tokens, half = decodes + room, room / 2.0
    k = 0
    while k < m:
        pairs = 0.0 + room * (done + half)
        ms = fixed + per_token * tokens + per_context * context + dm + per_pair * pairs
        t += (0.1 if 0.1 > ms else ms) / speed     # max(ms, 0.1)
        done += room
        context += decodes
        k += 1
        if until_ms is not None and t >= until_ms:
            break
    return t, k


def alone(model: StepModel, room: int, decodes: int, context: float, t: float, steps: int, left: int, done: int,
          probe: int, max_steps: int) -> tuple[float, int, float, int]:
    """A prompt alone in the queue beside ``decodes`` decodes (at least one) with ``context`` tokens
    and ``room`` (> 0) of the budget: its ``left`` tokens still to prefill (0: its last chunk ran in
    the step that ended at ``t``, ``steps``) with ``done`` prefilled, then ``probe`` decode steps, as
    :func:`epp_client.engine.twin._run` steps them. Returns (its first token's time and step, the
    time and steps reached); the caller keeps within ``max_steps`` but for the probe."""
    return alone_each([(model, room, decodes, context, t, steps, left, done, probe, max_steps)])[0]


def alone_each(starts: list[tuple[StepModel, int, int, float, float, int, int, int, int, int]]
               ) -> list[tuple[float, int, float, int]]:
    """:func:`alone` of each of ``starts`` (its arguments, in order), in one loop: the placements of
    a decision (:meth:`epp_client.engine.twin_engine.TwinEngine.placements`) step one prompt beside
    each candidate's decodes: its full chunks (:func:`full_chunks`) and its probe
    (:func:`_decode_steps`) as series, its last chunk as one general step."""
    out = []
    append = out.append
    last = None
    for model, room, decodes, context, t, steps, left, done, probe, max_steps in starts:
        if model is not last:
            last = model
            fixed, per_token, per_context, decode_ms = model.fixed_ms, model.per_token_ms, \
                model.per_context_token_ms, model.decode_ms
            per_pair, speed = model.per_prefill_pair_ms, model.speed
            zero = per_pair * 0.0
            # a series where no step is floored (linear_steps' condition for every stretch here)
            series = fixed + decode_ms >= FLOOR_MS and min(per_token, per_context, per_pair) >= 0.0 and \
                max(fixed, per_token, per_context, decode_ms, per_pair) < math.inf
        m = (left - 1) // room    # its full chunks but the last
        if m > 0:
            if series:      # full_chunks: m chunks of room tokens, each b more than the last
                a = (fixed + per_token * (decodes + room) + per_context * context + decode_ms
                     + per_pair * (room * (done + room / 2.0)))
                t += (m * a + 0.5 * (per_context * decodes + per_pair * room * room) * m * (m - 1)) / speed
            else:
                t = _full_chunks_loop(model, decodes, context, t, room, done, m, None)[0]
            steps += m
            left -= m * room
            done += m * room
            context += m * decodes
        if left > 0:    # the last chunk (at most room tokens): one general step
            pairs = left * (done + left / 2.0)
            ms = fixed + per_token * (decodes + left) + per_context * context + decode_ms + per_pair * pairs
            t += (FLOOR_MS if FLOOR_MS > ms else ms) / speed
            steps += 1
            done += left
            context += decodes
        tf = t
        context += done + 1
        n = max_steps - steps       # the probe's decode steps, the request among the decodes
        n = probe if probe < n else n
        if n > 0:
            if series:
                t += (n * (fixed + per_token * (decodes + 1) + per_context * context + decode_ms + zero)
                      + 0.5 * per_context * (decodes + 1) * n * (n - 1)) / speed
            else:
                t = _decode_steps(model, decodes + 1, context, t, n, None)[0]
        append((tf, steps, t, steps + n if n > 0 else steps))
    return out
