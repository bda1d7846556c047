"""The engine twin (epp_client.engine.twin): continuous batching stepped forward from the router's view."""
from __future__ import annotations

import math

import pytest

from epp_client.engine.twin import Running, StepModel, forward, placement

#: 10 ms a step plus 0.01 ms a token: a 2,048-token prefill step takes 30.48 ms, a one-decode step 10.01
FLAT = StepModel(fixed_ms=10.0, per_token_ms=0.01, per_context_token_ms=0.0, decode_ms=0.0, per_prefill_pair_ms=0.0)


def test_step_model_is_linear_in_the_batch_and_speed_divides_it():
    m = StepModel(1.0, 0.1, 0.001, 5.0, 0.0001)
    assert m.ms(100, 0, 0, 0) == pytest.approx(11.0)
    assert m.ms(100, 2_000, 3, 0) == pytest.approx(11.0 + 2.0 + 5.0)        # decodes read their context
    assert m.ms(100, 0, 0, 10_000) == pytest.approx(12.0)                   # causal pairs of the prefill
    assert StepModel(1.0, 0.1, 0.001, 5.0, 0.0001, speed=2.0).ms(100, 0, 0, 0) == pytest.approx(5.5)


def test_an_idle_engine_prefills_in_chunks_then_decodes_a_token_a_step():
    o = placement(FLAT, 2_048, (), 4_096, 0, probe=4)
    assert o.harm == 0
    assert o.ttft_ms == pytest.approx(2 * 30.48)       # two full chunks, first token at the end of the second
    assert o.tpot_ms == pytest.approx(10.01)           # then one decode a step
    # cached prompt tokens are not prefilled again
    assert placement(FLAT, 2_048, (), 4_096, 2_048).ttft_ms == pytest.approx(30.48)
    # a fully cached prompt still takes one step for its first token
    assert placement(FLAT, 2_048, (), 4_096, 4_096).ttft_ms == pytest.approx(10.01)


def test_the_queue_ahead_prefills_first_and_the_decodes_share_each_step():
    ahead = Running(0.0, 0, 100.0, 2_048, 2_048)      # dispatched, not prefilled yet
    o = placement(FLAT, 2_048, (ahead,), 2_048, 0)
    # its step (2,048 tokens); then its first decode and 2,047 of ours; then its decode and our last token
    assert o.ttft_ms == pytest.approx(30.48 + 30.48 + 10.02)
    # two decodes take two tokens of the budget, so a 2,048-token prompt needs a second step
    dec = Running(1_000.0, 101, 0.0, 500)
    o = placement(FLAT, 2_048, (dec, dec), 2_048, 0)
    assert o.ttft_ms == pytest.approx(30.48 + (10.0 + 0.01 * 4))


def test_harm_counts_the_requests_the_placement_pushes_over_their_slo_and_only_those():
    # 100 tokens in 1,000 ms (10 ms each) so far, SLO 10.5 ms: a decode-only step (10.01 ms) keeps
    # it within; a 20,000-token prefill (10 steps of ~30 ms) pushes it over
    tight = Running(1_000.0, 101, 10.5, 3_000)
    late = Running(3_000.0, 101, 10.5, 3_000)          # 30 ms a token: over with or without
    slack = Running(1_000.0, 101, 100.0, 3_000)
    no_slo = Running(1_000.0, 101, 0.0, 3_000)         # loads the engine, never counted
    o = placement(FLAT, 2_048, (tight, late, slack, no_slo), 20_000, 0)
    assert o.harm == 1
    assert placement(FLAT, 2_048, (late, slack), 20_000, 0).harm == 0
    # a short prompt is one step like the others
    assert placement(FLAT, 2_048, (tight, late, slack), 10, 0).harm == 0
    # a request queued ahead that has not decoded yet is judged from its own first token
    waiting = Running(0.0, 0, 12.0, 2_000, 2_000)
    assert placement(FLAT, 2_048, (waiting,), 20_000, 0).harm == 1
    assert placement(FLAT, 2_048, (Running(0.0, 0, 40.0, 2_000, 2_000),), 20_000, 0).harm == 0


def test_forward_is_bounded_and_a_prompt_beyond_the_bound_never_gets_its_first_token():
    o = placement(FLAT, 2_048, (), 1_000_000, 0, max_steps=10)
    assert math.isinf(o.ttft_ms) and math.isinf(o.tpot_ms)
    t, steps, firsts = forward(FLAT, 2_048, (Running(0.0, 0, 0.0, 4_096, 4_096),))
    assert steps == 2 and firsts == {0: (pytest.approx(60.96), 2)}    # drains the queue, then stops
    t, steps, _ = forward(FLAT, 2_048, (Running(10.0, 5, 0.0, 100),), until_ms=100.0)
    assert steps == 10 and t >= 100.0


def test_the_prefill_under_way_has_run_the_full_steps_since_it_reached_the_head_of_the_queue():
    fresh = Running(0.0, 0, 0.0, 8_192, 8_192)
    under_way = Running(0.0, 0, 0.0, 8_192, 8_192, queued_ms=65.0)     # two full 30.48 ms steps ran
    assert placement(FLAT, 2_048, (fresh,), 100, 0).ttft_ms == pytest.approx(4 * 30.48 + 10.0 + 0.01 * 101)
    assert placement(FLAT, 2_048, (under_way,), 100, 0).ttft_ms == pytest.approx(2 * 30.48 + 10.0 + 0.01 * 101)
    # never the whole prompt: its first token has not come, so at least one token is left
    done = Running(0.0, 0, 0.0, 8_192, 8_192, queued_ms=1e6)
    t, steps, firsts = forward(FLAT, 2_048, (done,))
    assert steps == 1 and t == pytest.approx(10.01)


def test_each_chunk_of_the_prefill_under_way_costs_more_than_the_last():
    # causal attention: a chunk reads every token prefilled before it, so the time since the prompt
    # reached the head of the queue covers fewer chunks of a long prompt than its first chunk's cost says
    quad = StepModel(fixed_ms=10.0, per_token_ms=0.0, per_context_token_ms=0.0, decode_ms=0.0,
                     per_prefill_pair_ms=1e-5)
    chunk = [quad.ms(2_048, 0, 0, 2_048 * (2_048 * k + 1_024)) for k in range(4)]   # 31.0, 72.9, 114.9, 156.8
    under_way = Running(0.0, 0, 0.0, 8_192, 8_192, queued_ms=chunk[0] + chunk[1] + 1.0)
    t, steps, firsts = forward(quad, 2_048, (under_way,))
    assert steps == 2 and t == pytest.approx(chunk[2] + chunk[3])      # two chunks ran, two are left
    assert firsts == {0: (pytest.approx(chunk[2] + chunk[3]), 2)}


def test_the_run_without_the_request_resumed_where_they_part_is_the_run_from_scratch():
    # placement() resumes the run without the request from the step in which its prefill starts;
    # the run without it from now (forward) must give the same count (and times, to rounding)
    import random

    from epp_client.engine.twin import _over

    rng = random.Random(7)
    models = (StepModel(), FLAT, StepModel(1.0, 0.1, 0.001, 5.0, 1e-4, speed=1.7))
    for _ in range(400):
        model = rng.choice(models)
        running = tuple(
            Running(rng.uniform(0, 5_000), rng.randint(1, 500), rng.choice((0.0, 20.0, 100.0)), rng.randint(10, 60_000))
            if rng.random() < 0.6 else
            Running(0.0, 0, rng.choice((0.0, 50.0)), 80_000, rng.randint(1, 60_000), rng.choice((0.0, 3_000.0)))
            for _ in range(rng.randint(1, 25)))
        prompt, budget, probe = rng.randint(1, 60_000), rng.choice((512, 2_048)), rng.randint(1, 8)
        cached = rng.randint(0, prompt)
        o = placement(model, budget, running, prompt, cached, probe, max_steps=4_000)
        uncached = max(1, prompt - cached)
        new = Running(0.0, 0, 0.0, max(prompt, uncached), uncached)
        t, steps, firsts = forward(model, budget, running, new, probe)
        if len(running) not in firsts:
            assert math.isinf(o.ttft_ms)
            continue
        t0, steps0, firsts0 = forward(model, budget, running, None, probe, until_ms=t)
        assert o.ttft_ms == pytest.approx(firsts[len(running)][0], rel=1e-9)
        assert o.harm == max(0, _over(running, firsts, t, steps) - _over(running, firsts0, t0, steps0))

