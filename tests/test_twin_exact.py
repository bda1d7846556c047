"""The engine twin's fast paths (the placement where every running request decodes, decode-only
stretches and a long prompt's full chunks summed as series (``stretch.linear_steps``), the two SLO
counts in one pass, the producer's view built in one pass) give the outcome of the plain replay:
``ref_placement`` below is the plain replay (every step through the general loop, the counts in two
passes), kept here as the reference the twin is held to (its state and SLO count, unchanged, are the
twin's own). A series sums its steps in another order than stepping does, so times agree to rounding
(``REL``), step counts and SLO counts exactly."""
from __future__ import annotations

import random

from epp_client.engine.model import Outcome
from epp_client.engine.twin import Running, StepModel, _over, _State, placement

#: relative tolerance on times: a series and a step-by-step sum differ by rounding only
REL = 1e-9


def _same_time(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= REL * max(abs(a), abs(b))


def _same_outcome(got: Outcome, want: Outcome) -> bool:
    return type(got) is Outcome and got.harm == want.harm and _same_time(got.ttft_ms, want.ttft_ms) \
        and _same_time(got.tpot_ms, want.tpot_ms)


def _same_state(st: _State, ref: _State) -> bool:
    return _same_time(st.t, ref.t) and (st.steps, st.context, st.head, st.left, st.done) == \
        (ref.steps, ref.context, ref.head, ref.left, ref.done) and st.firsts.keys() == ref.firsts.keys() and \
        all(_same_time(st.firsts[i][0], f[0]) and st.firsts[i][1] == f[1] for i, f in ref.firsts.items())


def _ref_start(model: StepModel, budget: int, reqs: tuple[Running, ...]) -> _State:
    left = [max(0, r.prefill) for r in reqs]
    done = [max(0, r.context - n) for r, n in zip(reqs, left)]
    queue = [i for i, r in enumerate(reqs) if r.prefill > 0 or r.tokens < 1]
    queued = set(queue)
    decodes = len(reqs) - len(queue)
    context = float(sum(done[i] for i in range(len(reqs)) if i not in queued))
    room = max(1, budget - decodes)
    for i in queue:   # the prefill under way: the full chunks since it reached the head of the queue
        elapsed = reqs[i].queued_ms
        while elapsed > 0 and left[i] > 1:   # each chunk costs more than the last (causal attention)
            n = min(room, left[i] - 1)
            elapsed -= model.ms(decodes + n, context, decodes, n * (done[i] + n / 2.0))
            if elapsed < 0:
                break
            left[i] -= n
            done[i] += n
    return _State(left, done, queue, decodes, context)


def _ref_run(model: StepModel, budget: int, st: _State, new_i: int = -1, probe: int = 4,
             until_ms: float | None = None,
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
        room, tokens, pairs, ready = budget - decodes, decodes, 0.0, []
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


def ref_placement(model: StepModel, budget: int, running: tuple[Running, ...], prompt_tokens: int, cached_tokens: int,
              probe: int = 4, max_steps: int = 4000) -> Outcome:
    """The request (``prompt_tokens``, of which ``cached_tokens`` are in the endpoint's cache)
    placed on an endpoint running ``running``: :class:`Outcome`. The run without it is the run
    with it up to the step in which its prefill starts, so it resumes from there."""
    uncached = max(1, prompt_tokens - cached_tokens)
    new = Running(0.0, 0, 0.0, max(prompt_tokens, uncached), uncached)
    st = _ref_start(model, budget, (*running, new))
    i = len(running)
    fork = _ref_run(model, budget, st, i, probe, max_steps=max_steps)
    t, steps, firsts = st.t, st.steps, st.firsts
    with_it = _over(running, firsts, t, steps)
    if i not in firsts:
        return Outcome(with_it, float("inf"), float("inf"))
    tf, sf = firsts[i]
    tpot = (t - tf) / (steps - sf) if steps > sf else 0.0
    if not running or fork is None:
        return Outcome(0, tf, tpot)
    _ref_run(model, budget, fork, until_ms=t, max_steps=max_steps)
    return Outcome(max(0, with_it - _over(running, fork.firsts, fork.t, fork.steps)), tf, tpot)




FLAT = StepModel(fixed_ms=10.0, per_token_ms=0.01, per_context_token_ms=0.0, decode_ms=0.0, per_prefill_pair_ms=0.0)
MODELS = (StepModel(), FLAT, StepModel(1.0, 0.1, 0.001, 5.0, 1e-4, speed=1.7), StepModel(0.0, 0.0, 0.0, 0.0, 0.0))


def _random_running(rng: random.Random) -> tuple[Running, ...]:
    decoding_only = rng.random() < 0.4      # the common state: every request dispatched there is decoding
    return tuple(
        Running(rng.uniform(0, 5_000), rng.randint(1, 500), rng.choice((0.0, 20.0, 50.0, 100.0)),
                rng.randint(10, 60_000))
        if decoding_only or rng.random() < 0.6 else
        Running(0.0, 0, rng.choice((0.0, 50.0)), 80_000, rng.randint(1, 60_000), rng.choice((0.0, 40.0, 3_000.0)))
        for _ in range(rng.randint(0, 30)))


def test_the_twin_gives_the_plain_replays_outcome():
    rng = random.Random(31)
    for _ in range(600):
        model, running = rng.choice(MODELS), _random_running(rng)
        budget, probe, max_steps = rng.choice((512, 2_048)), rng.randint(1, 8), rng.choice((4_000, 4_000, 40))
        for _ in range(rng.randint(1, 4)):   # several requests judged against the same endpoint state
            prompt = rng.randint(1, 60_000)
            cached = rng.randint(0, prompt)
            want = ref_placement(model, budget, running, prompt, cached, probe, max_steps)
            got = placement(model, budget, running, prompt, cached, probe, max_steps)
            assert _same_outcome(got, want), (got, want)


def test_a_decode_only_stretch_ends_where_the_replay_does():
    from epp_client.engine.twin import _run, _start

    rng = random.Random(5)
    for _ in range(300):
        model = rng.choice(MODELS)
        running = tuple(Running(rng.uniform(0, 5_000), rng.randint(1, 500), 50.0, rng.randint(10, 60_000))
                        for _ in range(rng.randint(1, 30)))
        for _ in range(3):              # the same stretch to several ends
            until, max_steps = rng.uniform(1.0, 3_000.0), rng.choice((4_000, 7))
            ref = _ref_start(model, 2_048, running)
            _ref_run(model, 2_048, ref, until_ms=until, max_steps=max_steps)
            st = _start(model, 2_048, running)
            _run(model, 2_048, st, until_ms=until, max_steps=max_steps)
            assert _same_state(st, ref)


def _ref_running_on(endpoint, now, running, contexts, first_token_at):
    out = []
    head = True
    for rid, slo in running.requests(endpoint).items():
        ctx = contexts.get(rid)
        if ctx is None or ctx.dispatch is None:
            continue
        slo = max(0.0, slo)
        if not ctx.ttft_ms:
            since = max(ctx.dispatch, first_token_at.get(endpoint, ctx.dispatch)) if head else now
            out.append(Running(0.0, 0, slo, ctx.input_tokens, ctx.uncached, max(0.0, now - since) * 1000.0))
            head = False
            continue
        elapsed = (now - ctx.dispatch) * 1000.0 - ctx.ttft_ms
        if ctx.tokens_known and ctx.tokens >= 1:
            tokens = ctx.tokens
        else:
            pace = ctx.predictions.get(endpoint, (0.0, 0.0))[1]
            tokens = 1 + int(max(0.0, elapsed) / pace) if pace > 0 else 1
        out.append(Running(max(0.0, elapsed), tokens, slo, ctx.input_tokens + tokens))
    return tuple(out)


def test_the_producers_view_of_an_endpoint_is_the_plain_loops():
    from epp_client.plugins.producer.request_state import RequestContext, RunningQueue
    from epp_client.plugins.producer.twin_view import running_on

    rng = random.Random(11)
    for _ in range(200):
        queue, contexts, now = RunningQueue(), {}, rng.uniform(100.0, 200.0)
        for j in range(rng.randint(0, 40)):
            ctx = RequestContext(f"r{j}", rng.randint(1, 9_000))
            ctx.dispatch = None if rng.random() < 0.05 else now - rng.uniform(0.0, 60.0)
            ctx.ttft_ms = rng.choice((0.0, 1e-9, rng.uniform(1.0, 3_000.0)))
            ctx.tokens, ctx.tokens_known = rng.randint(0, 400), rng.random() < 0.7
            ctx.uncached = rng.randint(0, ctx.input_tokens)
            ctx.predictions = {"a": (100.0, rng.choice((0.0, 25.0)))}
            if rng.random() < 0.95:
                contexts[ctx.request_id] = ctx
            queue.add("a", ctx.request_id, rng.choice((0.0, 20.0, 50.0)))
        first = {"a": now - rng.uniform(-1.0, 30.0)} if rng.random() < 0.7 else {}
        want = _ref_running_on("a", now, queue, contexts, first)
        got = running_on("a", now, queue, contexts, first)
        assert got == want and repr(got) == repr(want)
        assert all(type(r) is Running for r in got)


def test_the_all_decoding_fast_path_equals_the_plain_replay_as_the_endpoint_state_changes_between_decisions():
    """An endpoint's running requests evolve between decisions (tokens and decode time advance,
    requests finish, new ones are dispatched and get their first token): every outcome is the
    plain replay's, and most come from the fast path."""
    from epp_client.engine.twin import _all_decoding

    rng = random.Random(4)
    fast = total = 0
    for _ in range(60):
        model, budget = rng.choice(MODELS), rng.choice((64, 512, 2_048))
        probe, max_steps = rng.randint(1, 6), rng.choice((4_000, 4_000, 12))
        running = [Running(rng.uniform(0, 3_000), rng.randint(1, 300), rng.choice((0.0, 20.0, 50.0)),
                           rng.randint(10, 30_000)) for _ in range(rng.randint(1, 24))]
        for _ in range(25):
            state = tuple(running)
            for _ in range(rng.randint(1, 3)):
                prompt = rng.randint(1, 9_000)
                cached = rng.choice((0, rng.randint(0, prompt), prompt))
                want = ref_placement(model, budget, state, prompt, cached, probe, max_steps)
                got = placement(model, budget, state, prompt, cached, probe, max_steps)
                assert _same_outcome(got, want), (got, want)
                total += 1
                fast += bool(state) and _all_decoding(model, budget, state, prompt, max(1, prompt - cached), probe,
                                                      max_steps) is not None
            dt, steps = rng.choice((0.0, rng.uniform(0.0, 200.0))), rng.randint(0, 20)
            running = [r._replace(decode_ms=r.decode_ms + dt, tokens=r.tokens + steps, context=r.context + steps)
                       if r.tokens >= 1 else r for r in running]
            if running and rng.random() < 0.3:
                running.pop(rng.randrange(len(running)))
            if rng.random() < 0.3:
                running.append(Running(0.0, 1, rng.choice((0.0, 50.0)), rng.randint(10, 9_000)))
            if rng.random() < 0.1:     # a dispatched request still prefilling: the general path
                running.append(Running(0.0, 0, 50.0, 9_000, rng.randint(1, 9_000), rng.uniform(0.0, 100.0)))
            if rng.random() < 0.15:
                running = [r for r in running if r.tokens >= 1]
    assert fast > total // 2 and fast < total     # both paths were compared


def test_long_decode_only_stretches_end_where_the_replay_does():
    """Stretches of thousands of steps, summed as one series, against the plain replay: the same
    steps and context, the time to rounding."""
    from epp_client.engine.twin import _run, _start

    rng = random.Random(9)
    longest = 0
    for _ in range(80):
        model = rng.choice(MODELS)
        running = tuple(Running(rng.uniform(0, 5_000), rng.randint(1, 500), 50.0, rng.randint(10, 90_000))
                        for _ in range(rng.randint(1, 64)))
        for _ in range(3):
            until, max_steps = rng.uniform(1.0, 40_000.0), rng.choice((4_000, 4_000, 300, 7))
            ref = _ref_start(model, 2_048, running)
            _ref_run(model, 2_048, ref, until_ms=until, max_steps=max_steps)
            st = _start(model, 2_048, running)
            _run(model, 2_048, st, until_ms=until, max_steps=max_steps)
            assert _same_state(st, ref)
            longest = max(longest, ref.steps)
    assert longest > 1_000


def test_runs_through_long_prompts_to_a_time_end_where_the_replay_does():
    """Runs without a request to place through queues of long prompts (their full chunks summed as
    series), to a time or until nothing is left to prefill: the same state as the plain replay."""
    from epp_client.engine.twin import _run, _start

    rng = random.Random(12)
    most = 0
    for _ in range(300):
        model, budget = rng.choice(MODELS), rng.choice((256, 2_048))
        running = _random_running(rng)
        until, max_steps = rng.choice((None, rng.uniform(1.0, 30_000.0))), rng.choice((4_000, 4_000, 9))
        ref = _ref_start(model, budget, running)
        _ref_run(model, budget, ref, until_ms=until, max_steps=max_steps)
        st = _start(model, budget, running)
        _run(model, budget, st, until_ms=until, max_steps=max_steps)
        assert _same_state(st, ref)
        most = max(most, max((n // budget for n in ref.done), default=0))
    assert most > 100     # prompts of hundreds of full chunks


def test_a_series_reaches_a_time_at_the_step_stepping_does_and_a_floored_step_is_stepped():
    """``linear_steps`` against a plain step-by-step sum, for steps growing by ``b`` (0 included)
    from every start: the same step count (the first step at or after the end, at least one),
    the time to rounding; where a step could be floored (a first step under 0.1 ms, a negative
    growth) it declines and ``_decode_steps`` steps one at a time, to the last bit."""
    from epp_client.engine.stretch import FLOOR_MS, _decode_steps, linear_steps

    def stepped(a, b, speed, t, n, until):
        k = 0
        while k < n:
            t += max(a + b * k, FLOOR_MS) / speed
            k += 1
            if until is not None and t >= until:
                break
        return t, k

    rng = random.Random(3)
    for _ in range(5_000):
        a, b = rng.uniform(FLOOR_MS, 80.0), rng.choice((0.0, rng.uniform(0.0, 5.0), rng.uniform(0.0, 1e-4)))
        speed, t, n = rng.choice((1.0, 0.5, 1.7)), rng.uniform(0.0, 1e4), rng.choice((1, 4, 300, 4_000))
        until = rng.choice((None, t - 5.0, t, t + rng.uniform(0.0, 1e5)))
        got, want = linear_steps(a, b, speed, t, n, until), stepped(a, b, speed, t, n, until)
        assert got is not None and got[1] == want[1] and _same_time(got[0], want[0]), (a, b, t, n, until)
    assert linear_steps(0.05, 1.0, 1.0, 0.0, 10, None) is None and linear_steps(5.0, -0.1, 1.0, 0.0, 10, None) is None
    floored = StepModel(0.0, 0.0, 0.0, 0.0, 0.0)     # every step floored at 0.1 ms
    t, k = _decode_steps(floored, 3, 100.0, 0.0, 4_000, 0.35)
    assert (t, k) == stepped(0.0, 0.0, 1.0, 0.0, 4_000, 0.35) and k == 4
