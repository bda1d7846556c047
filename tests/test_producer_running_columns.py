"""The producer's running requests as columns (``RunningColumns``, kept across decisions) and the
twin judging every candidate from them at once (``TwinEngine.placements``): through a real
producer driven by dispatches, first chunks, streamed tokens (counted or not), re-dispatches,
completions and expiry, every decision's outcomes are those of the per-request view
(``TwinEngine.placement`` over ``running_on``) to the last bit, and the columns follow each
change of an endpoint's running requests."""
from __future__ import annotations

import random

from epp_client import Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.engine.twin import StepModel
from epp_client.engine.twin_engine import TwinEngine
from epp_client.plugins import PredictedLatencyProducer
from test_producer_predicted_latency import Clock

NAMES = ("a", "b", "c", "d")


class Pace:
    """A predictor answering one TTFT and TPOT for every row (the TPOT paces uncounted tokens)."""

    def predict_bulk(self, rows):
        from epp_client.predictor import BulkPrediction

        return BulkPrediction([300.0] * len(rows), [25.0] * len(rows), "v")


def _endpoints(rng: random.Random) -> list[Endpoint]:
    return [Endpoint(name=n, metrics=EndpointMetrics(0.2, 0, 0),
                     prefix_match=PrefixMatch(rng.choice((0, 8, 16)), 16, 64)) for n in NAMES]


def _request(rid: str, rng: random.Random) -> InferenceRequest:
    headers = {"x-llm-d-slo-tpot-ms": str(rng.choice((0, 12, 15, 20, 40)))} if rng.random() < 0.8 else {}
    return InferenceRequest(request_id=rid, headers=headers, input_tokens=rng.randint(1, 6_000))


def _judge(prod: PredictedLatencyProducer, twin: TwinEngine, rng: random.Random, n: int) -> tuple[int, int, int]:
    """A decision: the producer writes its predictions, the twin judges the request on every
    endpoint both ways; returns (endpoints judged from the columns with every request decoding,
    those with some waiting for their first token and none paced, outcomes with harm)."""
    eps = _endpoints(rng)
    req = _request(f"probe{n}", rng)
    prod.produce(req, eps)
    prompt = req.input_tokens
    cached = [rng.choice((0, prompt // 2, prompt, prompt + 100)) for _ in eps]
    got = twin.placements(req, eps, prompt, cached)
    want = [twin.placement(req, e, prompt, c) for e, c in zip(eps, cached)]
    assert got == want and repr(got) == repr(want)
    prod.discard(req.request_id)
    view = eps[0].prediction.decoding_columns()
    fast = queued = 0
    for e in eps:
        running = e.prediction.running_decodes()
        i = view.index.get(e.name, view.size)
        if running and i < view.size and view.general[i] and not view.paced[i]:   # judged from the queue
            queued += 1
            waiting = [r for r in running if r.tokens < 1]
            assert view.queued(i) == tuple(waiting) and view.general[i] == len(waiting)
            assert view.decodes[i] == len(running) - len(waiting)
            assert view.context[i] == sum(r.context for r in running if r.tokens >= 1)
        if running and i < view.size and not view.general[i]:    # judged from the columns: the same state
            fast += 1
            assert view.decodes[i] == len(running)
            assert view.context[i] == sum(r.context for r in running)
            mine = view.endpoint == i
            slots = sorted(zip(view.decode_ms[mine].tolist(), view.after_first[mine].tolist(),
                               view.slo[mine].tolist()))
            assert [s for s in slots if s[2] != float("inf")] == \
                sorted((r.decode_ms, r.tokens - 1, r.tpot_slo_ms) for r in running if r.tpot_slo_ms > 0)
    return fast, queued, sum(o.harm > 0 for o in got)


def test_every_decision_judged_from_the_columns_is_the_per_request_views_to_the_last_bit():
    rng = random.Random(7)
    clock = Clock(1_000.0)
    prod = PredictedLatencyProducer(Pace(), None, streaming_mode=True, clock=clock, context_ttl=30.0)
    twin = TwinEngine(StepModel(), 2_048, 4, 4_000)
    live: dict[str, int] = {}      # request id -> tokens so far (0: no first chunk yet)
    fast = queued = harmed = 0
    for n in range(1_500):
        clock.t += rng.choice((0.0, 0.001, 0.02, 0.3))
        event = rng.random()
        if event < 0.15 or not live:                # a dispatch
            rid = f"r{n}"
            req = _request(rid, rng)
            eps = _endpoints(rng)
            prod.produce(req, eps)
            prod.pre_request(req, rng.choice(eps))
            live[rid] = 0
        else:
            rid = rng.choice(sorted(live))
            if event < 0.27:                         # done
                prod.on_complete(rid)
                del live[rid]
            elif event < 0.29:                       # retried on another endpoint
                req = InferenceRequest(request_id=rid, input_tokens=rng.randint(1, 6_000))
                eps = _endpoints(rng)
                prod.produce(req, eps)
                prod.pre_request(req, rng.choice(eps))
                live[rid] = 0
            elif live[rid] == 0:                     # its first chunk, counted or not
                prod.on_first_chunk(rid, tokens=1 if rng.random() < 0.97 else None)
                live[rid] = 1
            else:                                    # more tokens, counted or not
                k = rng.randint(1, 30)
                prod.on_chunk(rid, tokens=k if rng.random() < 0.995 else None)
                live[rid] += k
        if clock.t > 1_000.0 + 25.0 * (1 + n // 500):   # now and then, contexts expire (contextTTL)
            live = {r: k for r, k in live.items() if r in prod._cache.contexts}
        if n >= 200:        # the columns are built at the first decision that reads them, then kept
            assert (prod._columns is None) == (n == 200)
            f, q, h = _judge(prod, twin, rng, n)
            fast += f
            queued += q
            harmed += h
    # the columns judged most endpoints, many with requests waiting for their first token, and the
    # counts were not all 0
    assert fast > 1_000 and queued > 300 and harmed > 300


def _two_dispatched(clock: Clock) -> PredictedLatencyProducer:
    """A producer that dispatched two requests of 1,000 prompt tokens (TPOT SLO 20 ms) to ``a``."""
    prod = PredictedLatencyProducer(Pace(), None, streaming_mode=True, clock=clock)
    eps = [Endpoint(name="a", metrics=EndpointMetrics(0.2, 0, 0))]
    for rid in ("x", "y"):
        req = InferenceRequest(request_id=rid, headers={"x-llm-d-slo-tpot-ms": "20"}, input_tokens=1_000)
        prod.produce(req, eps)
        prod.pre_request(req, eps[0])
    return prod


def test_the_columns_follow_an_endpoints_running_requests_from_dispatch_to_completion():
    clock = Clock(50.0)
    prod = _two_dispatched(clock)
    view = prod.decoding_columns(clock())
    assert (view.general, view.decodes) == ([2], [0])      # both prefilling: judged per request
    clock.t = 50.2
    prod.on_first_chunk("x", tokens=1)
    prod.on_first_chunk("y", tokens=1)
    clock.t = 50.5
    prod.on_chunk("x", tokens=9)
    view = prod.decoding_columns(clock())
    assert (view.general, view.decodes, view.context) == ([0], [2], [2_011.0])
    live = view.slo < float("inf")
    assert sorted(zip(view.decode_ms[live].tolist(), view.after_first[live].tolist())) == \
        [(300.0, 0), (300.0, 9)]
    prod.on_chunk("y")                                      # a chunk without a count: paced, per request
    assert prod.decoding_columns(clock()).general == [1]
    prod.on_complete("y")
    view = prod.decoding_columns(clock())
    assert (view.general, view.decodes, view.context) == ([0], [1], [1_010.0])
    prod.on_complete("x")
    view = prod.decoding_columns(clock())
    assert (view.general, view.decodes, view.context) == ([0], [0], [0.0])
    assert not (view.slo < float("inf")).any()


def test_a_views_queue_is_the_one_its_decision_judged_until_a_new_view():
    """The queue of an endpoint's requests without a first token is read once per view: the
    dispatch that follows a decision (other requests' chunks may arrive in between, in the
    gateway) gets the queue the decision judged; the next decision's view has the new one."""
    clock = Clock(50.0)
    prod = _two_dispatched(clock)
    view = prod.decoding_columns(clock())
    judged = view.queued(0)
    assert [(r.tokens, r.prefill) for r in judged] == [(0, 1_000), (0, 1_000)]
    prod.on_first_chunk("x", tokens=1)
    assert view.queued(0) is judged                     # what the decision judged
    assert [r.prefill for r in prod.decoding_columns(clock()).queued(0)] == [1_000]


def test_a_producer_whose_decisions_never_read_the_columns_does_not_keep_them():
    clock = Clock(50.0)
    prod = PredictedLatencyProducer(Pace(), None, streaming_mode=True, clock=clock)
    eps = [Endpoint(name="a", metrics=EndpointMetrics(0.2, 0, 0))]
    req = InferenceRequest(request_id="x", input_tokens=1_000)
    prod.produce(req, eps)
    prod.pre_request(req, eps[0])
    prod.on_first_chunk("x", tokens=1)
    assert prod._columns is None and prod.running.columns is None


def test_endpoints_come_and_go_and_the_columns_keep_a_position_only_where_requests_run():
    rng = random.Random(5)
    clock = Clock(10.0)
    prod = PredictedLatencyProducer(Pace(), None, streaming_mode=True, clock=clock)
    twin = TwinEngine(StepModel(), 2_048, 4, 4_000)
    live: list[tuple[str, str]] = []
    for n in range(600):        # pods replaced one after another: a new name every few requests
        clock.t += 0.01
        name = f"pod-{n // 4}"
        eps = [Endpoint(name=name, metrics=EndpointMetrics(0.2, 0, 0)), Endpoint(name="steady",
                                                                                 metrics=EndpointMetrics(0.2, 0, 0))]
        req = InferenceRequest(request_id=f"r{n}", headers={"x-llm-d-slo-tpot-ms": "15"},
                               input_tokens=rng.randint(1, 3_000))
        prod.produce(req, eps)
        prod.pre_request(req, rng.choice(eps))
        prod.on_first_chunk(req.request_id, tokens=1)
        live.append(req.request_id)
        if len(live) > 12:
            prod.on_complete(live.pop(0))
        probe = InferenceRequest(request_id=f"p{n}", headers={"x-llm-d-slo-tpot-ms": "15"}, input_tokens=2_000)
        prod.produce(probe, eps)
        got = twin.placements(probe, eps, 2_000, [0, 0])
        assert got == [twin.placement(probe, e, 2_000, 0) for e in eps]
        prod.discard(probe.request_id)
        assert prod.decoding_columns(clock()).size <= 14     # at most one position per endpoint with requests
