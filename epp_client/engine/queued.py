"""The engine twin's placement on an endpoint where requests wait for or are in their prefill
beside requests that decode with their tokens counted: the decodes enter the run as two sums
(how many, their context), as in :func:`epp_client.engine.twin._decoding_runs`, and only the
queue is stepped request by request, once for both runs up to the step in which they part
(:func:`_both_runs`; the general loop where a run could reach ``max_steps`` or a step have no
room for a prefill). :meth:`epp_client.engine.twin_engine.TwinEngine.placements`
takes the sums and the queue from the producer's columns (``DecodingView.queued``) and counts
the decodes pushed over their SLO for all candidates at once (``DecodingView.over_counts``);
the outcome is :func:`epp_client.engine.twin.placement`'s (tests/test_engine_queued.py,
tests/test_twin_exact.py, tests/test_producer_running_columns.py).
"""
from __future__ import annotations

from collections import OrderedDict

from epp_client.engine.stretch import _decode_steps, alone, full_chunks
from epp_client.engine.twin import Running, StepModel, _first_flip, _run, _State, _under_way


def queue_state(model: StepModel, budget: int, decodes: int, context: float, queued: tuple[Running, ...],
                prompt_tokens: int, uncached: int) -> tuple[list[int], list[int], list[int]]:
    """The twin's queue where ``decodes`` requests with ``context`` tokens decode, ``queued`` wait
    for or are in their prefill and the request (``uncached`` of its ``prompt_tokens`` to prefill)
    comes last: per queued request and the request, the prompt tokens left to prefill and done,
    and the queue (all of them, in order), as :func:`~epp_client.engine.twin._start` gives them."""
    left: list[int] = []
    done: list[int] = []
    for r in queued:     # every one is in the queue: none has a first token
        n = r.prefill if r.prefill > 0 else 0
        d = r.context - n
        left.append(n)
        done.append(d if d > 0 else 0)
    _under_way(model, budget, queued, left, done, range(len(queued)), decodes, context)
    left.append(uncached)   # the request: nothing under way
    done.append((prompt_tokens if prompt_tokens > uncached else uncached) - uncached)
    return left, done, list(range(len(left)))


def queued_runs(model: StepModel, budget: int, decodes: int, context: float, queued: tuple[Running, ...],
                prompt_tokens: int, uncached: int, probe: int, max_steps: int, ahead_cache: AheadCache | None = None
                ) -> tuple[float, float, float, int, float, int, int] | None:
    """The two runs of :func:`~epp_client.engine.twin.placement` where ``decodes`` requests with
    ``context`` tokens decode and ``queued`` (dispatch order, none with a first token) wait for or
    are in their prefill: (the request's first token time, its TPOT, the time and steps the run
    with it ends at, the time and steps the run without it ends at, how many of ``queued`` are
    over their TPOT SLO at the end of the run with it less those at the end of the run without
    it). None where the request gets no first token within ``max_steps``. With ``ahead_cache``,
    the queue ahead of the request is read from it where stepped already (the same outcome)."""
    left, done, queue = queue_state(model, budget, decodes, context, queued, prompt_tokens, uncached)
    room = budget - decodes - len(queued)     # the least room of any step until its first token
    if queued and room > 0:
        bound = probe if probe > 0 else 0     # more steps than the run with it takes
        for n in left:
            bound += -(-n // room) if n > 1 else 1
        if bound <= max_steps:
            return _both_runs(model, budget, decodes, context, queued, left, done, probe, max_steps, ahead_cache)
    st = _State(left, done, queue, decodes, context)
    i = len(queued)
    fork = _run(model, budget, st, i, probe, max_steps=max_steps)
    t, steps, firsts = st.t, st.steps, st.firsts
    if i not in firsts:
        return None
    tf, sf = firsts[i]
    tpot = (t - tf) / (steps - sf) if steps > sf else 0.0
    if fork is None:    # no run without it to compare: nothing harmed (the same run, counted twice)
        return tf, tpot, t, steps, t, steps, 0
    _run(model, budget, fork, until_ms=t, max_steps=max_steps)
    t0, steps0, firsts0 = fork.t, fork.steps, fork.firsts
    flips = 0
    for j, r in enumerate(queued):
        if r.tpot_slo_ms > 0:
            flips += _first_flip(r.tpot_slo_ms, firsts.get(j), t, steps, firsts0.get(j), t0, steps0)
    return tf, tpot, t, steps, t0, steps0, flips


class AheadCache:
    """The queue ahead of the request stepped to where the runs part (:func:`_ahead`), per start
    (step model, budget, decodes, their context, the queue's tokens left and done): while an
    endpoint's queue does not move, every decision's request parts from it at the same step.
    Bounded: past ``size`` starts, the oldest is dropped for each new one."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._ahead: OrderedDict[tuple, tuple[StepModel, tuple]] = OrderedDict()
        self.stepped = 0    # starts stepped (not found in the cache)

    def ahead(self, model: StepModel, budget: int, decodes: int, context: float, left: list[int], done: list[int]
              ) -> tuple:
        """:func:`_ahead` of this start, read from the cache where stepped already (``left`` and
        ``done``: the queue's, the request's last, left as they are on a hit)."""
        nq = len(left) - 1
        key = (id(model), budget, decodes, context, tuple(left[:nq]), tuple(done[:nq]))
        entry = self._ahead.get(key)
        if entry is not None and entry[0] is model:
            return entry[1]
        if len(self._ahead) >= self.size:     # the oldest goes (a queue gone by), one at a time
            self._ahead.popitem(last=False)
        got = _ahead(model, budget, decodes, context, nq, left, done)
        self._ahead[key] = (model, got)
        self.stepped += 1
        return got


def _ahead(model: StepModel, budget: int, decodes: int, context: float, nq: int, left: list[int], done: list[int]
           ) -> tuple[float, int, int, int, float, int, int, float, dict[int, tuple[float, int]], float, int, float]:
    """The steps of :func:`_both_runs` that do not depend on the request (last in the queue, at
    ``nq``): the queue ahead of it until the step in which it gets its first chunk. Returns the
    time, steps, head of the queue, tokens, prefill pairs and room of that step before the
    request's chunk, the decodes and their context then, the first tokens so far, the time that
    step ends without the request, and the decodes and their context after it (``left`` and
    ``done`` are stepped in place; the request's are untouched)."""
    fixed, per_token, per_context, decode_ms = model.fixed_ms, model.per_token_ms, model.per_context_token_ms, \
        model.decode_ms
    per_pair, speed = model.per_prefill_pair_ms, model.speed
    t, steps, head = 0.0, 0, 0
    firsts: dict[int, tuple[float, int]] = {}    # first tokens before the runs part: the same in both
    while True:
        room = budget - decodes
        if head < nq:
            m = (left[head] - 1) // room    # its full chunks but the last
            if m >= 1:
                t, k = full_chunks(model, decodes, context, t, room, done[head], m, None)
                left[head] -= k * room
                done[head] += k * room
                steps += k
                context += k * decodes
                continue
        tokens, pairs, j = decodes, 0.0, head
        while j < nq and room > 0:
            n = left[j] if left[j] < room else room
            n = n if n > 1 else 1       # a fully cached prompt still takes a step
            pairs += n * (done[j] + n / 2.0)
            left[j] -= n
            done[j] += n
            room -= n
            tokens += n
            j += 1
        if j == nq and room > 0:
            break   # the request's first chunk is in this step: the runs part here
        ms = fixed + per_token * tokens + per_context * context + (decode_ms if decodes else 0.0) + per_pair * pairs
        t += (0.1 if 0.1 > ms else ms) / speed
        steps += 1
        context += decodes
        for i in range(head, j):
            if left[i] <= 0:
                firsts[i] = (t, steps)
                decodes += 1
                context += done[i] + 1
        while head < nq and left[head] <= 0:
            head += 1
    t0, after_decodes, after_context = t, decodes, context
    if head < nq:   # those ahead of it take their last chunks in this step, with it and without it
        ms = fixed + per_token * tokens + per_context * context + (decode_ms if decodes else 0.0) + per_pair * pairs
        t0 = t + (0.1 if 0.1 > ms else ms) / speed
        after_context += decodes
        for i in range(head, nq):
            after_decodes += 1
            after_context += done[i] + 1
    return t, steps, head, tokens, pairs, room, decodes, context, firsts, t0, after_decodes, after_context


def _both_runs(model: StepModel, budget: int, decodes: int, context: float, queued: tuple[Running, ...],
               left: list[int], done: list[int], probe: int, max_steps: int, ahead_cache: AheadCache | None = None
               ) -> tuple[float, float, float, int, float, int, int]:
    """:func:`queued_runs` where the run with the request ends within ``max_steps`` and every step
    has room for a prefill: the steps of :func:`~epp_client.engine.twin._run` in the same order
    with the same arithmetic, the queue ahead stepped once for both runs (:func:`_ahead`, read from
    ``ahead_cache`` where given). The runs part in the step in which the request gets its first
    chunk (the step of those ahead of it, with and without it); from there, the request alone
    (:func:`alone`) and a decode-only stretch."""
    nq = len(queued)    # the request is the last, at nq
    t, steps, part, tokens, pairs, room, decodes, context, firsts, t0, after_decodes, after_context = \
        ahead_cache.ahead(model, budget, decodes, context, left, done) if ahead_cache is not None else \
        _ahead(model, budget, decodes, context, nq, left, done)
    steps0, left_new, done_new = steps, left[nq], done[nq]
    if part < nq:   # the request's first chunk beside the last chunks of those ahead of it
        n = left_new if left_new < room else room
        pairs += n * (done_new + n / 2.0)
        tokens += n
        left_new -= n
        done_new += n
        ms = (model.fixed_ms + model.per_token_ms * tokens + model.per_context_token_ms * context
              + (model.decode_ms if decodes else 0.0) + model.per_prefill_pair_ms * pairs)
        t += (0.1 if 0.1 > ms else ms) / model.speed
        steps += 1
        steps0 = steps
        decodes, context = after_decodes, after_context
    first, first0 = (t, steps), (t0, steps)     # of those ahead of it that take their last chunk there
    tf, sf, t, steps = alone(model, budget - decodes, decodes, context, t, steps, left_new, done_new, probe,
                             max_steps)
    if decodes and (part == nq or t0 < t):    # then a decode-only stretch (all that run without it decode)
        t0, k = _decode_steps(model, decodes, context, t0, max_steps - steps0, t)
        steps0 += k
    flips = 0
    for i, r in enumerate(queued):
        if r.tpot_slo_ms > 0:
            f = firsts.get(i)
            flips += _first_flip(r.tpot_slo_ms, f, t, steps, f, t0, steps0) if i < part else \
                _first_flip(r.tpot_slo_ms, first, t, steps, first0, t0, steps0)
    tpot = (t - tf) / (steps - sf) if steps > sf else 0.0
    return tf, tpot, t, steps, t0, steps0, flips
