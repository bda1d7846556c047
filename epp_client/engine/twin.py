"""An engine twin: one model server's continuous batching run forward from what the router knows.

The ``decode-harm-filter`` asks, per candidate endpoint: if this request lands there, how many of
the requests running there end up over their TPOT SLO because of it, and does the request itself
meet its SLO? The twin answers by stepping a vLLM-like engine forward from the router's own view
of the endpoint (the requests it dispatched there and has not seen finish):

- each step, every decoding request generates one token; the remaining per-step token budget
  (``budget``, vLLM's ``max_num_batched_tokens``) goes to the prefills in dispatch order (chunked:
  a prompt larger than what is left continues next step); a prompt whose last chunk ran
  produces its first token at the end of that step and decodes from the next;
- a step takes :meth:`StepModel.ms` of its batch;
- nobody finishes: the router does not know output lengths (and does not need them: the
  simulator's oracle, blind to them, routes as well as with them; docs/evaluation.md §4).

:func:`placement` runs it twice, with the request appended to the queue until its first token
plus ``probe`` decode steps, and without it to the same moment; the harm is how many more
requests are over their TPOT SLO then (TPOT so far: decode time over tokens after the first).
Where every running request decodes (the common state) the request is alone in the queue and
:func:`placement` steps it without the general loop; stretches of like steps (decode-only steps, a
long prompt's full chunks) are summed as series by :mod:`epp_client.engine.stretch`. All of it gives
the plain replay's outcome, its times to rounding (tests/test_twin_exact.py). Pure functions over
tuples, no clock, no I/O.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from epp_client.engine.model import Outcome
from epp_client.engine.stretch import _decode_steps, alone_each, full_chunks


class Running(NamedTuple):
    """A request the router has running on an endpoint, as the twin sees it."""

    decode_ms: float        # time since its first token (0 before it)
    tokens: int             # tokens generated so far (0 before the first)
    tpot_slo_ms: float      # 0: none (it loads the engine but is never counted)
    context: int            # tokens in its KV cache once prefilled (prompt + generated)
    prefill: int = 0        # prompt tokens still to prefill (0 once it decodes)
    queued_ms: float = 0.0  # how long it has been first in the queue (its prefill under way)


@dataclass(frozen=True)
class StepModel:
    """Duration of one engine step, linear in its batch::

        ms = fixed + per_token * tokens + per_context_token * (context of the decodes)
             + decode * [any decode] + per_prefill_pair * (causal token pairs of the prefill chunks)

    The defaults are the least-squares fit of the measured Llama-3-8B / A100 step times
    (``load/data/step-time``) over batches of up to 80 decodes and 2,048 tokens; ``speed``
    divides every step (2: a server twice as fast)."""

    fixed_ms: float = 2.93
    per_token_ms: float = 0.0651
    per_context_token_ms: float = 7.37e-5
    decode_ms: float = 8.09
    per_prefill_pair_ms: float = 3.37e-6
    speed: float = 1.0

    def ms(self, tokens: float, context: float, decodes: int, pairs: float) -> float:
        t = (self.fixed_ms + self.per_token_ms * tokens + self.per_context_token_ms * context
             + (self.decode_ms if decodes else 0.0) + self.per_prefill_pair_ms * pairs)
        return max(t, 0.1) / self.speed


def _over(running: tuple[Running, ...], firsts: dict[int, tuple[float, int]], t: float, steps: int) -> int:
    """How many of ``running`` are over their TPOT SLO at ``t`` after ``steps`` steps."""
    n = 0
    for i, r in enumerate(running):
        if r.tpot_slo_ms <= 0:
            continue
        if r.prefill <= 0 and r.tokens >= 1:
            k = r.tokens - 1 + steps
            if k >= 1 and (r.decode_ms + t) / k > r.tpot_slo_ms:
                n += 1
        elif i in firsts:
            tf, sf = firsts[i]
            k = steps - sf
            if k >= 1 and (t - tf) / k > r.tpot_slo_ms:
                n += 1
    return n


class _State:
    """The twin's engine between steps: per request (``running`` + the new one) the prompt tokens
    left to prefill and done, the queue of those still prefilling (dispatch order), the decodes,
    their context, the time and steps so far, the head of the queue and the first tokens."""

    __slots__ = ("left", "done", "queue", "decodes", "context", "t", "steps", "head", "firsts")

    def __init__(self, left: list, done: list, queue: list, decodes: int, context: float) -> None:
        self.left, self.done, self.queue, self.decodes, self.context = left, done, queue, decodes, context
        self.t, self.steps, self.head = 0.0, 0, 0
        self.firsts: dict[int, tuple[float, int]] = {}

    def copy(self, undo: list[tuple[int, int]], queue: list) -> _State:
        """This state with the chunks of ``undo`` given back (the step under way), over ``queue``."""
        c = _State(list(self.left), list(self.done), queue, self.decodes, self.context)
        for i, n in undo:
            c.left[i] += n
            c.done[i] -= n
        c.t, c.steps, c.head, c.firsts = self.t, self.steps, self.head, dict(self.firsts)
        return c


def _start(model: StepModel, budget: int, reqs: tuple[Running, ...]) -> _State:
    left: list[int] = []
    done: list[int] = []
    queue: list[int] = []
    context = 0
    for i, r in enumerate(reqs):
        n = r.prefill if r.prefill > 0 else 0
        d = r.context - n
        d = d if d > 0 else 0
        left.append(n)
        done.append(d)
        if n > 0 or r.tokens < 1:
            queue.append(i)
        else:
            context += d
    decodes = len(reqs) - len(queue)
    ctx = float(context)
    _under_way(model, budget, reqs, left, done, queue, decodes, ctx)
    return _State(left, done, queue, decodes, ctx)


def _under_way(model: StepModel, budget: int, reqs: tuple[Running, ...], left: list[int], done: list[int],
               queue: Sequence[int], decodes: int, ctx: float) -> None:
    """The prefill under way: the full chunks of the queue's head since it reached the head
    (``queued_ms``), taken from ``left`` and added to ``done``."""
    room = max(1, budget - decodes)
    # model.ms inlined (the same arithmetic in the same order): a long prompt takes many chunks
    fixed, per_token, per_context, per_pair, speed = model.fixed_ms, model.per_token_ms, \
        model.per_context_token_ms, model.per_prefill_pair_ms, model.speed
    dm = model.decode_ms if decodes else 0.0
    for i in queue:
        elapsed = reqs[i].queued_ms
        while elapsed > 0 and left[i] > 1:   # each chunk costs more than the last (causal attention)
            n = min(room, left[i] - 1)
            ms = fixed + per_token * (decodes + n) + per_context * ctx + dm + per_pair * (n * (done[i] + n / 2.0))
            elapsed -= (0.1 if 0.1 > ms else ms) / speed     # max(ms, 0.1)
            if elapsed < 0:
                break
            left[i] -= n
            done[i] += n


def _run(model: StepModel, budget: int, st: _State, new_i: int = -1, probe: int = 4, until_ms: float | None = None,
         max_steps: int = 4000) -> _State | None:
    """Step ``st`` forward (see :func:`forward`). With ``new_i`` (the last in the queue), returns the
    state at the start of the step in which it first gets a chunk, the moment a run without it
    would part from this one (None if it never does)."""
    left, done, queue, firsts = st.left, st.done, st.queue, st.firsts
    decodes, context, t, steps, head, n_queue = st.decodes, st.context, st.t, st.steps, st.head, len(queue)
    fork: _State | None = None
    # model.ms inlined (the same arithmetic in the same order): this loop is the twin's cost
    fixed, per_token, per_context, decode_ms = model.fixed_ms, model.per_token_ms, model.per_context_token_ms, \
        model.decode_ms
    per_pair, speed = model.per_prefill_pair_ms, model.speed
    while steps < max_steps:
        if head >= n_queue and decodes and (new_i >= 0 or until_ms is not None):
            # nothing left to prefill: decode-only steps to the end of the run (_decode_steps)
            if new_i >= 0:
                n = min(probe - (steps - firsts[new_i][1]), max_steps - steps)
                t, k = _decode_steps(model, decodes, context, t, n, None)
            else:
                t, k = _decode_steps(model, decodes, context, t, max_steps - steps, until_ms)
            steps += k
            context += k * decodes
            break
        room = budget - decodes
        if head < n_queue and room > 0 and (fork is not None or queue[head] != new_i):
            i = queue[head]
            m = min((left[i] - 1) // room, max_steps - steps)  # its full chunks but the last: none for others
            if m >= 1:
                t, k = full_chunks(model, decodes, context, t, room, done[i], m,
                                   until_ms if new_i < 0 else None)
                left[i] -= k * room
                done[i] += k * room
                steps += k
                context += k * decodes
                if new_i < 0 and until_ms is not None and t >= until_ms:
                    break
                continue
        tokens, pairs, ready = decodes, 0.0, []
        j = head
        chunks: list[tuple[int, int]] | None = [] if new_i >= 0 and fork is None else None   # until the fork
        while j < n_queue and room > 0:
            i = queue[j]
            if i == new_i and chunks is not None and fork is None:
                st.decodes, st.context, st.t, st.steps, st.head = decodes, context, t, steps, head
                fork = st.copy(chunks, queue[:-1])
            n = max(1, min(left[i], room))          # a fully cached prompt still takes a step
            pairs += n * (done[i] + n / 2.0)
            left[i] -= n
            done[i] += n
            room -= n
            tokens += n
            if chunks is not None and fork is None:
                chunks.append((i, n))
            if left[i] <= 0:
                ready.append(i)
            j += 1
        if tokens <= 0:
            break
        ms = (fixed + per_token * tokens + per_context * context + (decode_ms if decodes else 0.0)
              + per_pair * pairs)
        t += max(ms, 0.1) / speed
        steps += 1
        context += decodes
        for i in ready:
            firsts[i] = (t, steps)
            decodes += 1
            context += done[i] + 1
        while head < n_queue and left[queue[head]] <= 0:
            head += 1
        if new_i >= 0:
            if new_i in firsts and steps - firsts[new_i][1] >= probe:
                break
        elif until_ms is not None and t >= until_ms:
            break
        elif until_ms is None and head >= n_queue:
            break
    st.decodes, st.context, st.t, st.steps, st.head = decodes, context, t, steps, head
    return fork


def forward(model: StepModel, budget: int, running: tuple[Running, ...], new: Running | None = None,
            probe: int = 4, until_ms: float | None = None, max_steps: int = 4000
            ) -> tuple[float, int, dict[int, tuple[float, int]]]:
    """Step the engine from now until ``new`` (queued last) has its first token plus ``probe``
    decode steps, else until ``until_ms``, else until nothing is left to prefill; at most
    ``max_steps``. Returns (time reached ms, steps, {index in ``running`` + [new]: (first token
    time, step)} of the prompts prefilled)."""
    reqs = (*running, new) if new is not None else running
    st = _start(model, budget, reqs)
    _run(model, budget, st, len(reqs) - 1 if new is not None else -1, probe, until_ms, max_steps)
    return st.t, st.steps, st.firsts


def _harm(running: tuple[Running, ...], firsts: dict[int, tuple[float, int]], t: float, steps: int,
          firsts0: dict[int, tuple[float, int]], t0: float, steps0: int) -> int:
    """``_over`` of the run with the request (``firsts``, ``t``, ``steps``) less ``_over`` of the
    run without it (``firsts0``, ``t0``, ``steps0``), at least 0: the two counts in one pass."""
    n = 0
    for i, (decode_ms, tokens, slo, _, prefill, _) in enumerate(running):
        if slo <= 0:
            continue
        if prefill <= 0 and tokens >= 1:
            k = tokens - 1 + steps
            if k >= 1 and (decode_ms + t) / k > slo:
                n += 1
            k = tokens - 1 + steps0
            if k >= 1 and (decode_ms + t0) / k > slo:
                n -= 1
            continue
        n += _first_flip(slo, firsts.get(i), t, steps, firsts0.get(i), t0, steps0)
    return n if n > 0 else 0


def _first_flip(slo: float, first: tuple[float, int] | None, t: float, steps: int,
                first0: tuple[float, int] | None, t0: float, steps0: int) -> int:
    """A request with no first token when the runs start (``first``, ``first0``: its first token's
    time and step in the run with the request and in the run without it): 1 if it is over ``slo``
    at the end of the first run only, -1 at the end of the second only, else 0."""
    n = 0
    if first is not None:
        k = steps - first[1]
        if k >= 1 and (t - first[0]) / k > slo:
            n += 1
    if first0 is not None:
        k = steps0 - first0[1]
        if k >= 1 and (t0 - first0[0]) / k > slo:
            n -= 1
    return n


def placement(model: StepModel, budget: int, running: tuple[Running, ...], prompt_tokens: int, cached_tokens: int,
              probe: int = 4, max_steps: int = 4000) -> Outcome:
    """The request (``prompt_tokens``, of which ``cached_tokens`` are in the endpoint's cache)
    placed on an endpoint running ``running``: :class:`Outcome`. The run without it is the run
    with it up to the step in which its prefill starts, so it resumes from there."""
    uncached = max(1, prompt_tokens - cached_tokens)
    if running:
        fast = _all_decoding(model, budget, running, prompt_tokens, uncached, probe, max_steps)
        if fast is not None:
            return fast
    new = Running(0.0, 0, 0.0, max(prompt_tokens, uncached), uncached)
    st = _start(model, budget, (*running, new))
    i = len(running)
    fork = _run(model, budget, st, i, probe, max_steps=max_steps)
    t, steps, firsts = st.t, st.steps, st.firsts
    if i not in firsts:
        return Outcome(_over(running, firsts, t, steps), float("inf"), float("inf"))
    tf, sf = firsts[i]
    tpot = (t - tf) / (steps - sf) if steps > sf else 0.0
    if not running or fork is None:
        return Outcome(0, tf, tpot)
    _run(model, budget, fork, until_ms=t, max_steps=max_steps)
    return Outcome(_harm(running, firsts, t, steps, fork.firsts, fork.t, fork.steps), tf, tpot)


def _all_decoding(model: StepModel, budget: int, running: tuple[Running, ...], prompt_tokens: int, uncached: int,
                  probe: int, max_steps: int) -> Outcome | None:
    """:func:`placement` where every running request decodes (the common state), or None where
    another is still prefilling or the run would reach ``max_steps``: the same steps in the same
    order without the general loop's bookkeeping (:func:`_decoding_runs`); nobody else gets a
    first token, so the harm reads each request's decode time and tokens only."""
    whole = 0
    for _, tokens, _, c, prefill, _ in running:
        if prefill > 0 or tokens < 1 or not c >= 0:
            return None
        whole += c
    runs = _decoding_runs(model, budget, len(running), float(whole), prompt_tokens, uncached, probe, max_steps)
    if runs is None:
        return None
    tf, tpot, t, steps, t0, steps0 = runs
    harm = 0    # every k below is at least 1: tokens >= 1, and both runs took a step
    for d, tokens, slo, _, _, _ in running:
        if slo > 0:
            if (d + t) / (tokens - 1 + steps) > slo:
                harm += 1
            if (d + t0) / (tokens - 1 + steps0) > slo:
                harm -= 1
    return Outcome(harm if harm > 0 else 0, tf, tpot)


def _decoding_runs(model: StepModel, budget: int, decodes: int, context: float, prompt_tokens: int, uncached: int,
                   probe: int, max_steps: int) -> tuple[float, float, float, int, float, int] | None:
    """The two runs of :func:`placement` where ``decodes`` requests with ``context`` tokens all
    decode: (the request's first token time, its TPOT, the time and steps the run with it ends
    at, the time and steps the run without it ends at), or None where the run would reach
    ``max_steps`` or there is no room for a prefill. The request is alone in the queue, so the
    run without it parts at the start (time 0) and is one decode-only stretch."""
    return decoding_runs(budget, prompt_tokens, probe, max_steps, [(model, decodes, context, uncached)])[0]


def decoding_runs(budget: int, prompt_tokens: int, probe: int, max_steps: int,
                  todo: list[tuple[StepModel, int, float, int]]
                  ) -> list[tuple[float, float, float, int, float, int] | None]:
    """:func:`_decoding_runs` of the request on each endpoint of ``todo`` (its step model, decodes,
    their context, the request's tokens to prefill there), the request's run on all of them in one
    loop (:func:`alone_each`)."""
    starts, fits = [], []
    for model, decodes, context, uncached in todo:
        room = budget - decodes
        fit = room > 0 and -(-uncached // room) + probe <= max_steps    # its prefill steps, then the probe's
        fits.append(fit)
        if fit:
            starts.append((model, room, decodes, context, 0.0, 0, uncached,
                           (prompt_tokens if prompt_tokens > uncached else uncached) - uncached, probe, max_steps))
    ran = iter(alone_each(starts))
    out: list[tuple[float, float, float, int, float, int] | None] = []
    for (model, decodes, context, _), fit in zip(todo, fits):
        if not fit:
            out.append(None)
            continue
        tf, sf, t, steps = next(ran)
        t0, steps0 = _decode_steps(model, decodes, context, 0.0, max_steps, t)    # the run without it
        out.append((tf, (t - tf) / (steps - sf) if steps > sf else 0.0, t, steps, t0, steps0))
    return out
