"""The engine twin's TTFT is its step coefficients over the step sums the EPP reports
(epp_client.engine.features), and the decode-harm filter reports them at dispatch through the
producer's TTFT training entry."""
from __future__ import annotations

import math
import random

import pytest

from epp_client.engine.features import decoding_features, step_features, twin_ttft
from epp_client.engine.twin import Running, StepModel, placement
from epp_client.framework.loader import build_scheduler
from epp_client.training import ListSink
from epp_client.types import Endpoint, InferenceRequest
from features.schema import ENGINE_FEATURE_FIELDS, parse_training_entry
from support.engine import HARM_CONFIG, FixedPredictor


def random_state(rng: random.Random) -> tuple[int, tuple[Running, ...], int, int]:
    budget = rng.choice([256, 512, 2048, 8192])
    running = []
    for _ in range(rng.randint(0, 40)):
        if rng.random() < 0.7:   # decoding
            tokens, ctx = rng.randint(1, 500), rng.randint(10, 5000)
            running.append(Running(rng.uniform(0, 20000), tokens, rng.choice([0.0, 50.0]), ctx + tokens))
        else:                    # still to prefill, maybe under way at the head of the queue
            p = rng.randint(1, 9000)
            running.append(Running(0.0, 0, rng.choice([0.0, 50.0]), p + rng.randint(0, 3000), p,
                                   rng.choice([0.0, rng.uniform(0, 500)])))
    prompt = rng.randint(1, 20000)
    return budget, tuple(running), prompt, rng.randint(0, prompt)


def test_the_twins_ttft_is_the_coefficients_over_its_step_sums():
    """c . F / speed is the twin's own TTFT (placement) for random states and random step models:
    the sums the EPP reports and the twin it routes with can never drift apart."""
    rng = random.Random(7)
    checked = 0
    for _ in range(600):
        m = StepModel(rng.uniform(0.5, 10), rng.uniform(0, 0.2), rng.uniform(0, 3e-4), rng.uniform(0, 15),
                      rng.uniform(0, 1e-5), rng.uniform(0.3, 3))     # fixed >= 0.5 ms: the 0.1 ms floor never binds
        budget, running, prompt, cached = random_state(rng)
        f = step_features(m, budget, running, prompt, cached)
        o = placement(m, budget, running, prompt, cached)
        assert f is not None and math.isfinite(o.ttft_ms)
        assert twin_ttft(m, f) == pytest.approx(o.ttft_ms, rel=1e-9)
        assert f[0] >= 1 and f[3] <= f[0] and min(f) >= 0
        checked += 1
    assert checked == 600


def test_the_sums_where_every_running_request_decodes_need_only_their_count_and_context():
    """decoding_features (the producer's columns: how many decode, their context) gives the sums
    of step_features over the running requests themselves, where all of them decode."""
    rng = random.Random(11)
    for _ in range(400):
        budget = rng.choice([64, 256, 2048, 8192])
        running = tuple(Running(rng.uniform(0, 5000), t, 50.0, rng.randint(10, 9000) + t)
                        for t in (rng.randint(1, 300) for _ in range(rng.randint(0, 80))))
        prompt = rng.randint(1, 40000)
        cached = rng.randint(0, prompt)
        want = step_features(StepModel(), budget, running, prompt, cached, max_steps=300)
        got = decoding_features(budget, len(running), float(sum(r.context for r in running)), prompt, cached,
                                max_steps=300)
        assert got == want


def test_no_first_token_within_max_steps_gives_no_sums():
    m = StepModel()
    running = tuple(Running(0.0, 5, 0.0, 100) for _ in range(64))   # 64 decodes fill a 64-token budget
    assert step_features(m, 64, running, 1000, 0, max_steps=50) is None
    assert placement(m, 64, running, 1000, 0, max_steps=50).ttft_ms == math.inf


def test_the_tpot_entry_carries_the_twins_view_at_dispatch():
    """Through a real scheduler: the decode-harm filter computes the step sums on the picked
    endpoint at dispatch (with requests already running there), the producer sends them with the
    TPOT entry when the request ends, with the measured TTFT they go with (the TTFT entry, sent at
    the first token, has none), and c . F / speed is the twin's TTFT it reports."""
    sink = ListSink()
    clock = [0.0]
    sched = build_scheduler(HARM_CONFIG, predictor=FixedPredictor(), sink=sink, clock=lambda: clock[0],
                            wall_clock=lambda: 1e9 + clock[0])
    eps = [Endpoint(name="pod-a", labels={"llm-d.ai/accelerator": "a100"})]
    for i in range(3):
        req = InferenceRequest(request_id=f"r{i}", input_tokens=800 + 100 * i, streaming=True,
                               headers={"x-slo-ttft-ms": "2000", "x-slo-tpot-ms": "50"})
        res = sched.schedule(req, eps, now=clock[0])
        assert res.ok
        sched.pre_request(req, res, now=clock[0])
        assert req.engine_view is None          # consumed by the producer
        clock[0] += 0.01
    for i in range(3):
        sched.on_first_chunk(f"r{i}", now=clock[0] + 0.2 + 0.1 * i, tokens=1)
        sched.on_chunk(f"r{i}", now=clock[0] + 0.6, tokens=1)
        sched.on_complete(f"r{i}", now=clock[0] + 0.7)
    ttft = [e for e in sink.entries if e["actual_ttft_ms"] > 0]
    tpot = [e for e in sink.entries if e["actual_tpot_ms"] > 0]
    assert len(ttft) == len(tpot) == 3 and not any("engine_steps" in e for e in ttft)
    for e, first in zip(tpot, ttft):
        parsed = parse_training_entry(e).engine
        assert parsed is not None and parsed.endpoint == "pod-a" and parsed.engine_class == "-|a100"
        assert parsed.actual_ttft_ms == first["actual_ttft_ms"] == e["engine_actual_ttft_ms"] > 0
        assert e["engine_ttft_ms"] == pytest.approx(twin_ttft(StepModel(), parsed.features), rel=1e-12)
    # the third request queued behind two prefills it was dispatched after: more steps, more tokens
    assert tpot[2]["engine_step_tokens"] > tpot[0]["engine_step_tokens"]


def _engine_entry(estimate: int, *, running: int, true_tokens: int | None) -> dict:
    """The entry with the twin's view of a request estimated at ``estimate`` prompt tokens,
    dispatched behind ``running`` others, whose response reports ``true_tokens`` (None: no usage)."""
    sink = ListSink()
    clock = [0.0]
    sched = build_scheduler(HARM_CONFIG, predictor=FixedPredictor(), sink=sink, clock=lambda: clock[0],
                            wall_clock=lambda: 1e9 + clock[0])
    eps = [Endpoint(name="pod-a")]
    for i in range(running + 1):
        req = InferenceRequest(request_id=f"r{i}", input_tokens=600 if i < running else estimate, streaming=True,
                               headers={"x-slo-ttft-ms": "2000", "x-slo-tpot-ms": "50"})
        res = sched.schedule(req, eps, now=clock[0])
        assert res.ok
        sched.pre_request(req, res, now=clock[0])
    last = f"r{running}"
    sched.on_first_chunk(last, now=0.5, tokens=1)
    sched.on_chunk(last, now=0.6, tokens=1)
    sched.on_complete(last, now=0.7, prompt_tokens=true_tokens)
    return next(e for e in sink.entries if e.get("engine_endpoint"))


@pytest.mark.parametrize("running", [0, 3])
def test_the_engine_sums_sent_use_the_prompts_true_length_the_response_reports(running):
    """The router schedules with the gateway's estimate of the prompt; the engine ran the true
    count, which the response reports at the end (usage.prompt_tokens). The sums sent with it are
    those of the same schedule with the true length (what a request estimated at the true length
    gets), the twin's TTFT stays the one it routed with, and the latency features keep the
    estimate the predictor was asked with."""
    exact = _engine_entry(1300, running=running, true_tokens=None)
    corrected = _engine_entry(1000, running=running, true_tokens=1300)
    estimated = _engine_entry(1000, running=running, true_tokens=None)
    sums = [f.name for f in ENGINE_FEATURE_FIELDS]
    assert [corrected[k] for k in sums] == pytest.approx([exact[k] for k in sums], rel=1e-12)
    assert corrected["engine_step_tokens"] > estimated["engine_step_tokens"]
    assert corrected["engine_prefill_pairs"] > estimated["engine_prefill_pairs"]
    assert corrected["engine_ttft_ms"] == estimated["engine_ttft_ms"] < exact["engine_ttft_ms"]
    assert corrected["input_token_length"] == estimated["input_token_length"] == 1000


def test_the_twin_counts_prompts_in_the_engines_tokens_once_responses_report_them():
    """Responses report 1.3 engine tokens per estimated token (a workload at ~3 bytes per token):
    the producer learns the ratio, and the twin then schedules a request estimated at 1,000
    tokens as the 1,300 the engine will run, its own and those already queued alike."""
    sink = ListSink()
    clock = [0.0]
    sched = build_scheduler(HARM_CONFIG, predictor=FixedPredictor(), sink=sink, clock=lambda: clock[0],
                            wall_clock=lambda: 1e9 + clock[0])
    eps = [Endpoint(name="pod-a")]

    def dispatch(rid: str, estimate: int) -> None:
        req = InferenceRequest(request_id=rid, input_tokens=estimate, streaming=True,
                               headers={"x-slo-ttft-ms": "2000", "x-slo-tpot-ms": "50"})
        res = sched.schedule(req, eps, now=clock[0])
        assert res.ok
        sched.pre_request(req, res, now=clock[0])

    for i in range(40):                        # each served alone, reporting its true count
        dispatch(f"w{i}", 800 + 10 * i)
        sched.on_first_chunk(f"w{i}", now=clock[0] + 0.1, tokens=1)
        sched.on_chunk(f"w{i}", now=clock[0] + 0.2, tokens=1)
        sched.on_complete(f"w{i}", now=clock[0] + 0.3, prompt_tokens=round(1.3 * (800 + 10 * i)))
        clock[0] += 1.0
    dispatch("head", 1000)                     # queued, no first token yet
    dispatch("new", 1000)
    sched.on_first_chunk("new", now=clock[0] + 0.5, tokens=1)
    sched.on_chunk("new", now=clock[0] + 0.6, tokens=1)
    sched.on_complete("new", now=clock[0] + 0.7)   # no usage this time: the sums at dispatch are sent
    entry = next(e for e in reversed(sink.entries) if e.get("engine_endpoint"))
    queued = (Running(0.0, 0, 50.0, 1300, 1300),)   # the head's 1,300 engine tokens, then the new one's
    assert [entry[f.name] for f in ENGINE_FEATURE_FIELDS] == pytest.approx(
        step_features(StepModel(), 2048, queued, 1300, 0), rel=1e-12)
    assert entry["input_token_length"] == 1000     # the latency features keep the estimate
