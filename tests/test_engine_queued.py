"""The engine twin's placement on an endpoint with requests waiting for or in their prefill beside
counted decodes (:func:`epp_client.engine.queued.queued_runs`: the queue ahead stepped once for the
runs with and without the request) gives the plain replay's outcome (times to rounding)."""
from __future__ import annotations

import random

from epp_client.engine.features import queued_features, step_features
from epp_client.engine.model import Outcome
from epp_client.engine.queued import AheadCache, queued_runs
from epp_client.engine.twin import Running, StepModel
from test_twin_exact import MODELS, _same_outcome, ref_placement


def _queued(rng: random.Random) -> tuple[Running, ...]:
    """Prompts waiting for their first token: some fully cached (nothing left to prefill), some
    whose prefill is under way, a few exactly as large as a step's room (the next is then skipped
    past as the replay does)."""
    out = []
    for _ in range(rng.randint(1, 12)):
        left = rng.choice((0, 1, 2, 512 - 8, 2_048, rng.randint(1, 300), rng.randint(1, 9_000)))
        out.append(Running(0.0, 0, rng.choice((0.0, 0.0, 20.0, 50.0, 200.0)), left + rng.randint(0, 3_000), left,
                           rng.choice((0.0, 0.0, 30.0, 900.0))))
    return tuple(out)


def _outcome(got: tuple[float, float, float, int, float, int, int] | None, decoding: tuple[Running, ...]
             ) -> Outcome | None:
    """:func:`queued_runs`' runs as the placement's outcome: the SLO count of the decodes added
    (None: no first token within max_steps)."""
    if got is None:
        return None
    tf, tpot, t, steps, t0, steps0, harm = got
    for d, tokens, slo, _, _, _ in decoding:
        if slo > 0:
            harm += ((d + t) / (tokens - 1 + steps) > slo) - ((d + t0) / (tokens - 1 + steps0) > slo)
    return Outcome(harm if harm > 0 else 0, tf, tpot)


def test_the_queue_and_the_decodes_summed_give_the_plain_replays_outcome():
    rng = random.Random(77)
    fast = none = harmed = 0
    for _ in range(3_000):
        model = rng.choice(MODELS)
        budget, probe, max_steps = rng.choice((512, 2_048)), rng.randint(0, 8), rng.choice((4_000, 4_000, 30, 9))
        decoding = tuple(Running(rng.uniform(0, 5_000), rng.randint(1, 500), rng.choice((0.0, 20.0, 50.0)),
                                 rng.randint(10, 6_000)) for _ in range(rng.choice((0, 1, 8, rng.randint(0, 60)))))
        queued = _queued(rng)
        prompt = rng.randint(1, 12_000)
        cached = rng.choice((0, prompt // 2, prompt))
        want = ref_placement(model, budget, (*decoding, *queued), prompt, cached, probe, max_steps)
        uncached = max(1, prompt - cached)
        got = _outcome(queued_runs(model, budget, len(decoding), float(sum(r.context for r in decoding)), queued,
                                   prompt, uncached, probe, max_steps), decoding)
        if got is None:
            none += 1
            assert want.ttft_ms == float("inf")
            continue
        assert _same_outcome(got, want), (got, want)
        fast += 1
        harmed += want.harm > 0
    assert fast > 2_000 and none > 30 and harmed > 200


def test_the_queue_ahead_read_from_its_cache_gives_the_plain_replays_outcome():
    """Queue states judged for several requests each (the queue ahead of them read from an
    AheadCache, small enough to drop starts on the way): every outcome is the plain replay's, and
    most requests found the queue ahead stepped already."""
    rng = random.Random(79)
    ahead = AheadCache(size=rng.choice((4, 64)))
    judged = 0
    for _ in range(400):
        model = rng.choice(MODELS)
        budget, probe, max_steps = rng.choice((512, 2_048)), rng.randint(0, 8), rng.choice((4_000, 4_000, 30))
        decoding = tuple(Running(rng.uniform(0, 5_000), rng.randint(1, 500), rng.choice((0.0, 20.0, 50.0)),
                                 rng.randint(10, 6_000)) for _ in range(rng.choice((0, 1, 8, rng.randint(0, 60)))))
        queued = _queued(rng)
        for _ in range(rng.randint(1, 6)):
            prompt = rng.randint(1, 12_000)
            cached = rng.choice((0, prompt // 2, prompt))
            want = ref_placement(model, budget, (*decoding, *queued), prompt, cached, probe, max_steps)
            got = _outcome(queued_runs(model, budget, len(decoding), float(sum(r.context for r in decoding)),
                                       queued, prompt, max(1, prompt - cached), probe, max_steps, ahead),
                           decoding)
            if got is None:
                assert want.ttft_ms == float("inf")
                continue
            assert _same_outcome(got, want), (got, want)
            judged += 1
    assert judged > 800 and 100 < ahead.stepped < judged // 2


def test_the_engine_features_from_the_queue_and_the_decodes_summed_are_the_per_request_views():
    rng = random.Random(78)
    found = none = 0
    for _ in range(2_000):
        model = rng.choice(MODELS)
        budget, max_steps = rng.choice((512, 2_048)), rng.choice((4_000, 4_000, 30, 9))
        decoding = tuple(Running(rng.uniform(0, 5_000), rng.randint(1, 500), rng.choice((0.0, 20.0, 50.0)),
                                 rng.randint(10, 6_000)) for _ in range(rng.choice((0, 1, 8, rng.randint(0, 60)))))
        queued = _queued(rng)
        prompt = rng.randint(1, 12_000)
        cached = rng.choice((0, prompt // 2, prompt))
        want = step_features(model, budget, (*decoding, *queued), prompt, cached, max_steps)
        got = queued_features(model, budget, len(decoding), float(sum(r.context for r in decoding)), queued, prompt,
                              cached, max_steps)
        assert got == want and repr(got) == repr(want)
        found += want is not None
        none += want is None
    assert found > 1_000 and none > 30


def test_each_step_sum_is_the_plain_replays_ttft_under_a_step_model_of_that_one_coefficient():
    """The five step sums (steps, tokens, context, steps with decodes, prefill pairs), over the
    running requests themselves (step_features) and over the columns and the queue
    (queued_features), are the plain replay's TTFT under a step model of 1 ms per unit of that one
    term over a large fixed part (which keeps the 0.1 ms floor away), less the fixed part per step:
    whole and half-whole numbers, exact in a float whatever the order they are summed in."""
    rng = random.Random(80)
    fixed = 2.0 ** 20
    units = [StepModel(fixed, 0.0, 0.0, 0.0, 0.0), StepModel(fixed, 1.0, 0.0, 0.0, 0.0),
             StepModel(fixed, 0.0, 1.0, 0.0, 0.0), StepModel(fixed, 0.0, 0.0, 1.0, 0.0),
             StepModel(fixed, 0.0, 0.0, 0.0, 1.0)]
    found = none = 0
    for _ in range(400):
        budget, max_steps = rng.choice((512, 2_048)), rng.choice((4_000, 4_000, 30, 9))
        decoding = tuple(Running(rng.uniform(0, 5_000), rng.randint(1, 500), 50.0, rng.randint(10, 6_000))
                         for _ in range(rng.choice((0, 1, 8, rng.randint(0, 60)))))
        queued = _queued(rng)
        prompt = rng.randint(1, 12_000)
        cached = rng.choice((0, prompt // 2, prompt))
        for k, model in enumerate(units):
            want = ref_placement(model, budget, (*decoding, *queued), prompt, cached, 1, max_steps).ttft_ms
            got = step_features(model, budget, (*decoding, *queued), prompt, cached, max_steps)
            also = queued_features(model, budget, len(decoding), float(sum(r.context for r in decoding)), queued,
                                   prompt, cached, max_steps)
            assert also == got
            if got is None:
                assert want == float("inf")
                none += 1
                continue
            assert got[0] * fixed + (got[k] if k else 0.0) == want
            found += 1
    assert found > 1_000 and none > 50
