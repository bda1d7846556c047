"""The engine twin's stretches of like steps (:mod:`epp_client.engine.twin`): decode-only steps
(every request running decodes, nothing is left to prefill), stepped in a tight loop, read from a
:class:`DecodeCache` of stretches already stepped, and stepped with numpy when long; and the full
chunks of one long prompt (:func:`full_chunks`). The same arithmetic in the same order as the
twin's general step, to the last bit (tests/test_twin_exact.py).
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections import OrderedDict
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

if TYPE_CHECKING:
    from epp_client.engine.twin import StepModel


def _decode_steps(model: StepModel, decodes: int, context: float, t: float, n: int, until_ms: float | None,
                  cache: DecodeCache | None) -> tuple[float, int]:
    """``n`` decode-only steps of ``decodes`` requests with ``context`` tokens from ``t``, or fewer:
    up to the first that ends at or after ``until_ms``. Returns (time reached, steps taken). The
    same arithmetic in the same order as a step of :func:`_run` with nothing to prefill (the time
    to the last bit); with ``cache``, the times of a stretch already stepped are read from it."""
    if n <= 0:
        return t, 0
    if cache is not None and until_ms is not None:
        return cache.end(model, decodes, context, t, n, until_ms)
    base = model.fixed_ms + model.per_token_ms * decodes
    per_context, decode_ms, speed = model.per_context_token_ms, model.decode_ms, model.speed
    zero = model.per_prefill_pair_ms * 0.0
    k = 0
    while k < n:
        ms = base + per_context * context + decode_ms + zero
        t += (ms if ms > 0.1 else 0.1) / speed
        context += decodes
        k += 1
        if until_ms is not None and t >= until_ms:
            break
    return t, k


#: a stretch's times after each step: a numpy array, or a list of floats when short (_LIST_TIMES)
_Times: TypeAlias = "np.ndarray | list[float]"


class DecodeCache:
    """The times of decode-only stretches already stepped, per start (step model, decodes,
    context, time): while an endpoint's running requests do not change, every decision's run
    without the request steps the same stretch. Bounded: past ``size`` stretches, the oldest is
    dropped for each new one."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._reach = 0.0     # how far past its start recent stretches were asked for, decaying
        self._runs: OrderedDict[tuple[int, int, float, float], tuple[StepModel, _Times]] = OrderedDict()

    def end(self, model: StepModel, decodes: int, context: float, t: float, n: int, until_ms: float
            ) -> tuple[float, int]:
        """:func:`_decode_steps` with ``until_ms`` read from the stretch's times: (time reached, steps)."""
        entry = self._runs.get((id(model), decodes, context, t))
        times = entry[1] if entry is not None and entry[0] is model else None
        if times is None or (len(times) < n and (not len(times) or times[-1] < until_ms)):
            times = self.times(model, decodes, context, t, n, until_ms)
        hi = len(times)
        hi = n if n < hi else hi
        if isinstance(times, list):    # a short stretch (_LIST_TIMES)
            k = bisect_left(times, until_ms, 0, hi)     # the first at or after until_ms
            k = hi - 1 if k > hi - 1 else k
            return times[k], k + 1
        k = int(times[:hi].searchsorted(until_ms))     # the same (bisect_left on a sorted array)
        k = hi - 1 if k > hi - 1 else k
        return float(times[k]), k + 1

    def times(self, model: StepModel, decodes: int, context: float, t: float, n: int, until_ms: float
              ) -> _Times:
        """The times after each step of the stretch, at least up to the first at or after
        ``until_ms`` or ``n`` of them (when stepped, a quarter further than ``until_ms``, and from
        ``t`` = 0 at least as far as recent stretches from 0 were asked for): a numpy array, or a
        list of floats (the same values) for a stretch of at most ``_LIST_TIMES`` steps."""
        key = (id(model), decodes, context, t)
        entry = self._runs.get(key)
        if entry is None or entry[0] is not model:
            if len(self._runs) >= self.size:     # the oldest goes (a stretch of a state gone by), one at a time
                self._runs.popitem(last=False)
            entry = (model, [])
            self._runs[key] = entry
        times = entry[1]
        if len(times) < n and (not len(times) or times[-1] < until_ms):
            # a quarter further, and a stretch from now (t = 0: an endpoint where all decode, the
            # same for every decision while its requests do not change) at least as far as recent
            # requests' runs went: a long prompt's run then finds the other endpoints' stretches
            # stepped far enough. One from later (behind a queue, which moves) only as asked.
            span = (until_ms - t) * 1.25
            if t == 0.0:
                self._reach *= 0.99
                if self._reach < span < math.inf:
                    self._reach = span
                span = self._reach
            if t + span > until_ms:   # never short of until_ms (an infinite one stays as asked)
                until_ms = t + span
            base = model.fixed_ms + model.per_token_ms * decodes
            per_context, decode_ms, speed = model.per_context_token_ms, model.decode_ms, model.speed
            zero = model.per_prefill_pair_ms * 0.0
            k = len(times)
            c = context + k * decodes
            u = float(times[-1]) if k else t
            chunks: list[np.ndarray] = []     # stepped with numpy
            tail: list[float] = []            # stepped in the plain loop, after them
            while k < n:
                ms = base + per_context * c + decode_ms + zero
                step = (ms if ms > 0.1 else 0.1) / speed
                left = (until_ms - u) / step   # more steps than this to until_ms: every step is as long or longer
                if left >= _VECTOR_STEPS and per_context >= 0:
                    m = n - k if left >= n - k else min(n - k, int(left) + 1)
                    chunks.append(_stepped(base, per_context, decode_ms, zero, speed, c, decodes, u, m))
                    u = float(chunks[-1][-1])
                    c += m * decodes
                    k += m
                    if u >= until_ms:
                        break
                    continue
                # fewer steps left than stepped with numpy, and fewer still at each step (with
                # per_context >= 0 no step is shorter than the one before; below 0, never numpy):
                # the rest in a plain loop
                append = tail.append
                while True:
                    u += step
                    append(u)
                    c += decodes
                    k += 1
                    if u >= until_ms or k >= n:
                        break
                    ms = base + per_context * c + decode_ms + zero
                    step = (ms if ms > 0.1 else 0.1) / speed
                break
            if not chunks and isinstance(times, list):    # short stepping onto a short stretch: no numpy
                joined = times + tail
                times = joined if len(joined) <= _LIST_TIMES else np.array(joined)
            else:
                whole = np.concatenate((np.asarray(times), *chunks, np.array(tail)))
                times = whole.tolist() if len(whole) <= _LIST_TIMES else whole
            self._runs[key] = (model, times)
        return times


#: a decode-only stretch at least this many steps long is stepped with numpy
_VECTOR_STEPS = 96

#: a stretch of at most this many steps keeps its times as a list: most runs read one time of a
#: short stretch, which a bisection of a list finds faster than numpy's per-call overhead
_LIST_TIMES = 256


def _stepped(base: float, per_context: float, decode_ms: float, zero: float, speed: float,
             context: float, decodes: int, t: float, m: int) -> np.ndarray:
    """The times after each of ``m`` decode-only steps from ``t``: the loop of
    :meth:`DecodeCache.times` elementwise, the same operations in the same order (the contexts are
    whole numbers, exact in a float; the time is accumulated left to right), to the last bit."""
    ms = base + per_context * (context + decodes * np.arange(m, dtype=np.float64)) + decode_ms + zero
    return _cumulative(t, ms, speed)[1:]


def _cumulative(t: float, ms: np.ndarray, speed: float) -> np.ndarray:
    """``t`` followed by the time after each step of ``ms`` (floored at 0.1 ms, divided by
    ``speed``), accumulated left to right as the scalar loops do."""
    acc = np.empty(len(ms) + 1)
    acc[0] = t
    np.divide(np.maximum(ms, 0.1), speed, out=acc[1:])
    return np.cumsum(acc, out=acc)


#: a prompt with at least this many full chunks ahead has them stepped with numpy (numpy's cost per
#: call, about 40 us for :func:`full_chunks`, is the plain loop's for about 50 chunks)
_VECTOR_CHUNKS = 48


def full_chunks(model: StepModel, decodes: int, context: float, t: float, room: int, done: int, m: int,
                until_ms: float | None) -> tuple[float, int]:
    """``m`` steps from ``t`` in which one prompt (``done`` of its tokens prefilled) takes the whole
    ``room`` of the budget beside ``decodes`` decodes with ``context`` tokens, or fewer: up to the
    first that ends at or after ``until_ms``. Returns (time reached, steps taken). The general
    step of :func:`epp_client.engine.twin._run` elementwise (the contexts and prompt tokens are
    whole numbers, exact in a float; the time is accumulated left to right), to the last bit."""
    if m < _VECTOR_CHUNKS:
        return _full_chunks_loop(model, decodes, context, t, room, done, m, until_ms)
    j = np.arange(m, dtype=np.float64)
    pairs = 0.0 + room * ((done + room * j) + room / 2.0)
    ms = (model.fixed_ms + model.per_token_ms * (decodes + room) + model.per_context_token_ms * (context + decodes * j)
          + (model.decode_ms if decodes else 0.0) + model.per_prefill_pair_ms * pairs)
    acc = _cumulative(t, ms, model.speed)
    if until_ms is not None:
        k = int(np.searchsorted(acc[1:], until_ms, "left"))
        m = min(m, k + 1)
    return float(acc[m]), m


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
    :func:`epp_client.engine.twin._run` steps them, to the last bit. Returns (its first token's time
    and step, the time and steps reached); the caller keeps within ``max_steps`` but for the probe."""
    return alone_each([(model, room, decodes, context, t, steps, left, done, probe, max_steps)])[0]


def alone_each(starts: list[tuple[StepModel, int, int, float, float, int, int, int, int, int]]
               ) -> list[tuple[float, int, float, int]]:
    """:func:`alone` of each of ``starts`` (its arguments, in order), in one loop: the placements of
    a decision (:meth:`epp_client.engine.twin_engine.TwinEngine.placements`) step one prompt beside
    each candidate's decodes."""
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
        m = (left - 1) // room    # its full chunks but the last
        if m >= _VECTOR_CHUNKS:
            t, k = full_chunks(model, decodes, context, t, room, done, m, None)
            steps += k
            left -= m * room
            done += m * room
            context += m * decodes
        if left > 0:    # its chunks: steps counted at once (one each, the last may be short)
            steps += -(-left // room)
        while left > 0:     # the general step with this prompt alone in it
            n = left if left < room else room
            pairs = n * (done + n / 2.0)    # the replay's 0.0 + pairs: the same (pairs > 0)
            left -= n
            done += n
            ms = fixed + per_token * (decodes + n) + per_context * context + decode_ms + per_pair * pairs
            t += (0.1 if 0.1 > ms else ms) / speed     # max(ms, 0.1)
            context += decodes
        tf = t
        context += done + 1
        # the probe's decode steps (:func:`_decode_steps`, inlined: the same arithmetic in the same order)
        base, grow = fixed + per_token * (decodes + 1), decodes + 1
        n = max_steps - steps
        n = probe if probe < n else n
        for _ in range(n):
            ms = base + per_context * context + decode_ms + zero
            t += (ms if ms > 0.1 else 0.1) / speed
            context += grow
        append((tf, steps, t, steps + n if n > 0 else steps))
    return out
