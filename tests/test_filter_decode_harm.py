"""decode-harm-filter (and the count it shares with decode-harm-scorer): the requests a
placement's prefill pushes over their TPOT SLO and the request's own miss, from the engine twin
run over the producer's per-request state (``LatencyPrediction.decoding``)."""
from __future__ import annotations

import pytest

from epp_client import Endpoint, EndpointMetrics, HoldRequest, InferenceRequest, PrefixMatch, ShedRequest
from epp_client.engine.twin import Running
from epp_client.framework.profile import SchedulingProfile
from epp_client.framework.scheduler import Scheduler
from epp_client.plugins import PredictedLatencyProducer
from epp_client.plugins.filter.decode_harm import DecodeHarmFilter
from support.harm import FLAT
from support.harm import harm_request as _request
from support.harm import running_endpoint as _endpoint
from test_producer_predicted_latency import Clock, TablePredictor


def test_filter_keeps_the_endpoints_where_the_prefill_harms_fewest():
    # 10 ms a token so far against 10.2 ms: a 4,096-token prefill (two ~30 ms steps) pushes it over
    tight = Running(1_000.0, 101, 10.2, 3_000)
    a = _endpoint("a", [tight, tight])
    b = _endpoint("b", [Running(1_000.0, 101, 100.0, 3_000)])
    c = _endpoint("c", [])
    f = DecodeHarmFilter.from_config(FLAT)
    req = _request(tpot_slo=20)
    assert f.scores(req, [a, b, c]) == {"a": 2, "b": 0, "c": 0}
    assert [e.name for e in f.filter(req, [a, b, c])] == ["b", "c"]
    assert f.filtered == 1
    # where the prompt is cached, it prefills in one short step and harms nobody
    cached = _endpoint("a", [tight, tight], matched_blocks=63)
    assert f.scores(req, [cached, c]) == {"a": 0, "c": 0}


def test_the_requests_own_miss_counts_one_and_far_past_its_slo_it_is_a_last_resort():
    f = DecodeHarmFilter.from_config(FLAT)
    queued = _endpoint("a", [Running(0.0, 0, 0.0, 20_480, 20_480)])     # 10 steps of prefill ahead
    idle = _endpoint("b", [])
    assert f.scores(_request(ttft_slo=200), [queued, idle]) == {"a": 1, "b": 0}     # TTFT 376 ms there: 1.9x
    assert f.scores(_request(ttft_slo=1_000), [queued, idle]) == {"a": 0, "b": 0}
    assert f.scores(_request(tpot_slo=8), [idle]) == {"b": 1}                        # 10 ms a token: 1.25x
    # however late: 1 (TTFT 375.79 ms: 9.4x; 61 ms: 1.5x)
    assert f.scores(_request(ttft_slo=40), [queued, idle]) == {"a": 1, "b": 1}
    # over maxLateness times its SLO: 1,000 per unit of lateness, so such an endpoint only when
    # every endpoint is, the least late of them
    capped = DecodeHarmFilter.from_config({**FLAT, "maxLateness": 4})
    far = capped.scores(_request(ttft_slo=40), [queued, idle])
    assert far["b"] == 1 and far["a"] == pytest.approx(1_000 * 375.79 / 40)
    assert [e.name for e in capped.filter(_request(ttft_slo=40), [queued, idle])] == ["b"]
    assert capped.scores(_request(ttft_slo=200), [queued, idle]) == {"a": 1, "b": 0}
    # beyond the twin's horizon (maxSteps): a miss, and past any maxLateness
    assert DecodeHarmFilter.from_config({**FLAT, "maxSteps": 5}).scores(_request(), [queued]) == {"a": 1}
    assert DecodeHarmFilter.from_config({**FLAT, "maxSteps": 5, "maxLateness": 4}).scores(
        _request(), [queued]) == {"a": float("inf")}
    assert DecodeHarmFilter.from_config({**FLAT, "countOwnMiss": False}).scores(
        _request(ttft_slo=200), [queued, idle]) == {"a": 0, "b": 0}
    # the engine speed divides every step: twice as fast, the queued endpoint meets 200 ms
    assert DecodeHarmFilter.from_config({**FLAT, "engineSpeed": 2.0}).scores(
        _request(ttft_slo=200), [queued, idle]) == {"a": 0, "b": 0}


def test_past_max_ttft_an_endpoint_is_a_last_resort_whatever_the_slo():
    """A prompt is not queued where its first token would come after its client has left: past
    ``maxTtftMs`` the own miss counts 1,000 times the TTFT over the bound, SLO or not."""
    queued = _endpoint("a", [Running(0.0, 0, 0.0, 20_480, 20_480)])     # twin TTFT 375.79 ms there
    deeper = _endpoint("c", [Running(0.0, 0, 0.0, 40_960, 40_960)])
    idle = _endpoint("b", [])
    plain = DecodeHarmFilter.from_config(FLAT)
    capped = DecodeHarmFilter.from_config({**FLAT, "maxTtftMs": 300})
    assert plain.scores(_request(), [queued, idle]) == {"a": 0, "b": 0}          # no SLO: no own miss
    assert capped.scores(_request(), [queued, idle]) == {"a": pytest.approx(1_000 * 375.79 / 300), "b": 0}
    assert [e.name for e in capped.filter(_request(), [queued, idle])] == ["b"]
    # with an SLO it is missed anyway, it counts the larger of the two
    assert capped.scores(_request(ttft_slo=200), [queued])["a"] == pytest.approx(1_000 * 375.79 / 300)
    # over the bound everywhere: the soonest first token
    assert [e.name for e in capped.filter(_request(), [deeper, queued])] == ["a"]
    assert capped.scores(_request(), [idle, queued, deeper])["b"] == 0 < capped.scores(_request(), [queued])["a"]


def test_over_max_ttft_shed_places_by_the_count_and_refuses_what_would_wait_past_the_bound():
    queued = _endpoint("a", [Running(0.0, 0, 0.0, 20_480, 20_480)])     # twin TTFT 375.79 ms there
    deeper = _endpoint("c", [Running(0.0, 0, 0.0, 40_960, 40_960)])
    idle = _endpoint("b", [])
    # the harm first: "busy" harms nobody but its queue is past the bound; "harmed" has a decode to slow
    busy = _endpoint("busy", [Running(0.0, 0, 0.0, 20_480, 20_480)])
    harmed = _endpoint("harmed", [Running(1_000.0, 101, 10.2, 3_000)])
    shed = DecodeHarmFilter.from_config({**FLAT, "maxTtftMs": 300, "overMaxTtft": "shed"})
    plain = DecodeHarmFilter.from_config(FLAT)
    req = _request(tpot_slo=20)
    assert shed.scores(req, [busy, harmed]) == plain.scores(req, [busy, harmed]) == {"busy": 0, "harmed": 1}
    with pytest.raises(ShedRequest) as refused:      # any priority: this one is 0
        shed.filter(req, [busy, harmed])
    assert refused.value.reason == "shed-ttft-over-bound" and shed.shed == 1 and req.priority == 0
    # the avoiding mode places it on the harmed endpoint instead
    avoid = DecodeHarmFilter.from_config({**FLAT, "maxTtftMs": 300})
    assert [e.name for e in avoid.filter(req, [busy, harmed])] == ["harmed"]
    # an endpoint kept within the bound: placed, not refused
    assert [e.name for e in shed.filter(_request(), [queued, idle])] == ["a", "b"] and shed.shed == 1
    with pytest.raises(ShedRequest):
        shed.filter(_request(), [queued, deeper])
    assert shed.shed == 2


def test_an_adapter_load_counts_where_the_pool_serves_adapters():
    def lora_endpoint(name, active, max_lora=2):
        e = _endpoint(name, [])
        e.metrics = EndpointMetrics(0.3, 0, 0, frozenset(active), frozenset(), max_lora)
        return e

    req = InferenceRequest(request_id="q", target_model="sql-lora", input_tokens=4096,
                           headers={"x-llm-d-slo-ttft-ms": "5000", "x-llm-d-slo-tpot-ms": "100"})
    eps = [lora_endpoint("a", {"sql-lora"}), lora_endpoint("b", {"x"}), lora_endpoint("c", {"x", "y"})]
    assert DecodeHarmFilter().scores(req, eps) == {"a": 0, "b": 2, "c": 2}
    assert DecodeHarmFilter.from_config({"adapterLoadCount": 0.5}).scores(req, eps) == {"a": 0, "b": 0.5, "c": 0.5}
    assert [e.name for e in DecodeHarmFilter().filter(req, eps)] == ["a"]
    # no adapter slots anywhere (a base-model pool): nothing added
    assert DecodeHarmFilter().scores(req, [lora_endpoint("a", set(), 0), lora_endpoint("b", set(), 0)]) == {
        "a": 0, "b": 0}


def test_a_kv_cache_near_full_counts_one_more():
    full, roomy = _endpoint("a", []), _endpoint("b", [])
    full.metrics = EndpointMetrics(0.97, 0, 0)
    assert DecodeHarmFilter().scores(_request(), [full, roomy]) == {"a": 1, "b": 0}
    assert DecodeHarmFilter.from_config({"kvUsageThreshold": 1.0}).scores(_request(), [full, roomy]) == {"a": 0, "b": 0}


def test_filter_without_predictions_changes_nothing():
    f = DecodeHarmFilter()
    eps = [Endpoint(name="a"), Endpoint(name="b")]
    assert f.filter(_request(), eps) == eps
    one = [_endpoint("a", [Running(1_000.0, 17, 100.0, 500)])]
    assert f.filter(_request(), one) == one


def test_producer_reports_each_running_request_as_the_twin_sees_it():
    clock = Clock(100.0)
    prod = PredictedLatencyProducer(TablePredictor([(200.0, 40.0), (300.0, 50.0)]), None, streaming_mode=True,
                                    clock=clock)
    eps = [Endpoint(name="a", metrics=EndpointMetrics(0.1, 0, 0), prefix_match=PrefixMatch(1, 2, 64)),
           Endpoint(name="b", metrics=EndpointMetrics(0, 0, 0))]
    r = InferenceRequest(request_id="r1", headers={"x-llm-d-slo-tpot-ms": "80"}, input_tokens=100)
    prod.produce(r, eps)
    prod.pre_request(r, eps[0])
    # dispatched, no first token yet: to prefill, the one of its two 64-token blocks not cached on "a"
    assert prod.decoding("a", clock()) == (Running(0.0, 0, 80.0, 100, 64),)
    clock.t = 100.5
    prod.on_first_chunk("r1", tokens=1)
    clock.t = 101.5
    # no token counts after the first chunk: the TPOT predicted at dispatch (40 ms) stands for its pace
    prod.on_chunk("r1")
    assert prod.decoding("a", clock()) == (Running(pytest.approx(1_000.0), 26, 80.0, 126),)
    prod2 = PredictedLatencyProducer(TablePredictor([(200.0, 40.0)]), None, streaming_mode=True, clock=clock)
    prod2.produce(r, eps[:1])
    prod2.pre_request(r, eps[0])
    clock.t = 102.0
    prod2.on_first_chunk("r1", tokens=1)
    clock.t = 103.0
    prod2.on_chunk("r1", tokens=20)                                  # counted tokens: 21 so far
    assert prod2.decoding("a", clock()) == (Running(pytest.approx(1_000.0), 21, 80.0, 121),)
    # a request without a TPOT SLO loads the engine too (SLO 0: never counted as harmed); dispatch order
    free = InferenceRequest(request_id="r2", input_tokens=10)
    prod2.produce(free, eps[:1])
    prod2.pre_request(free, eps[0])
    assert [x.tpot_slo_ms for x in prod2.decoding("a", clock())] == [80.0, 0.0]
    # the next request's predictions carry it
    prod2.produce(InferenceRequest(request_id="r3", input_tokens=10), eps[:1])
    assert eps[0].prediction.running_decodes() == prod2.decoding("a", clock())
    prod2.on_complete("r1", output_tokens=21)
    prod2.on_complete("r2", output_tokens=2)
    assert prod2.decoding("a", clock()) == ()
    assert prod.decoding("b", clock()) == ()


def test_filter_holds_a_request_that_harms_wherever_it_goes_while_it_has_slack():
    tight = Running(1_000.0, 101, 10.2, 3_000)         # a 4,096-token prefill (two ~30 ms steps) pushes it over
    a, b = _endpoint("a", [tight]), _endpoint("b", [tight, tight])
    hold = DecodeHarmFilter.from_config({**FLAT, "holdSlackMs": 300, "maxHoldSloShare": 1.0})
    with pytest.raises(HoldRequest) as held:
        hold.filter(_request(tpot_slo=20), [a, b])      # TTFT ~61 ms of 5,000: plenty of slack
    assert held.value.retry_after_s == pytest.approx(0.15) and hold.holds == 1
    # not without holdSlackMs (the default), nor where some endpoint takes it without harm
    assert [e.name for e in DecodeHarmFilter.from_config(FLAT).filter(_request(tpot_slo=20), [a, b])] == ["a"]
    assert [e.name for e in hold.filter(_request(tpot_slo=20), [a, b, _endpoint("c", [])])] == ["c"]
    # nor once the wait has used the slack: 5,000 - 4,650 ms left, less ~61 ms, is under 300 + 150
    late = _request(tpot_slo=20)
    late.waited_ms = 4_650.0
    assert late.ttft_slo_ms == pytest.approx(350.0)
    assert [e.name for e in hold.filter(late, [a, b])] == ["a"]
    late.waited_ms = 4_400.0                              # 600 ms left: held again
    with pytest.raises(HoldRequest):
        hold.filter(late, [a, b])
    # nor without a TTFT SLO (nothing says how long it may wait)
    no_slo = InferenceRequest(request_id="q", input_tokens=4_096, headers={"x-llm-d-slo-tpot-ms": "20"})
    assert [e.name for e in hold.filter(no_slo, [a, b])] == ["a"]
    assert hold.holds == 2


def test_the_scheduler_answers_a_hold_and_places_the_request_when_it_is_scheduled_again():
    clock = Clock(100.0)
    prod = PredictedLatencyProducer(TablePredictor([(200.0, 10.0)] * 2), None, streaming_mode=True, clock=clock)
    sched = Scheduler(producer=prod, profiles=[SchedulingProfile(
        filters=[DecodeHarmFilter.from_config({**FLAT, "holdSlackMs": 300, "holdRetryMs": 20})])])
    eps = [Endpoint(name=n, metrics=EndpointMetrics(0.1, 0, 1)) for n in ("a", "b")]
    for i, e in enumerate(eps):       # one request decoding on each at 10 ms a token, SLO 10.2 ms
        r = InferenceRequest(request_id=f"d{i}", input_tokens=100, headers={"x-llm-d-slo-tpot-ms": "10.2"})
        res = sched.schedule(r, [e], now=clock())
        sched.pre_request(r, res, now=clock())
        sched.on_first_chunk(r.request_id, now=clock(), tokens=1)
    clock.t = 101.0
    for i in range(2):
        sched.on_chunk(f"d{i}", now=clock(), tokens=100)
    big = _request(tpot_slo=20)
    res = sched.schedule(big, eps, now=clock())
    assert res.held and not res.ok and res.status == 429 and res.reason == "held"
    assert res.retry_after_s == pytest.approx(0.02) and sched.held == 1
    assert [x.tpot_slo_ms for x in prod.decoding("a", clock())] == [10.2]     # nothing of it was kept
    big.waited_ms = 4_700.0
    res = sched.schedule(big, eps, now=clock())
    assert res.ok and not res.held and res.endpoint.name in ("a", "b")


def test_no_request_is_held_past_its_bound_and_the_last_retry_comes_at_it():
    tight = Running(1_000.0, 101, 10.2, 3_000)         # harmed wherever the 4,096-token prompt goes
    a, b = _endpoint("a", [tight]), _endpoint("b", [tight, tight])
    # default bound: half of the 5,000 ms TTFT SLO (under maxHoldMs, 10 s)
    hold = DecodeHarmFilter.from_config({**FLAT, "holdSlackMs": 300, "holdRetryMs": 400})
    req = _request(tpot_slo=20)
    assert hold.hold_bound_ms(req) == 2_500.0
    waits = []
    while True:                                         # the caller's loop: wait what the hold says
        try:
            kept = hold.filter(req, [a, b])
            break
        except HoldRequest as h:
            waits.append(h.retry_after_s)
            req.waited_ms += h.retry_after_s * 1000.0
    assert [e.name for e in kept] == ["a"]              # placed at the bound, though still harming
    assert waits == [0.4] * 6 + [pytest.approx(0.1)]    # the last retry shortened to land on the bound
    assert req.waited_ms == pytest.approx(2_500.0) and hold.holds == 7
    # maxHoldMs caps it, with or without a TTFT SLO; maxHoldSloShare 0 never holds
    assert DecodeHarmFilter.from_config({"maxHoldMs": 800}).hold_bound_ms(req) == 800.0
    no_slo = InferenceRequest(request_id="q", input_tokens=4_096, headers={"x-llm-d-slo-tpot-ms": "20"})
    assert DecodeHarmFilter.from_config({"maxHoldMs": 800}).hold_bound_ms(no_slo) == 800.0
    never = DecodeHarmFilter.from_config({**FLAT, "holdSlackMs": 300, "maxHoldSloShare": 0.0})
    assert [e.name for e in never.filter(_request(tpot_slo=20), [a, b])] == ["a"] and never.holds == 0
    with pytest.raises(ValueError, match="maxHoldMs"):
        DecodeHarmFilter.from_config({"maxHoldMs": 0})


def test_a_request_late_everywhere_goes_where_it_is_least_late_or_is_shed_when_sheddable():
    # "busy": 10 steps of prefill ahead, nobody to harm; "harmed": a short queue, one decode it would slow
    busy = _endpoint("busy", [Running(0.0, 0, 0.0, 20_480, 20_480)])
    harmed = _endpoint("harmed", [Running(1_000.0, 101, 10.2, 3_000)])
    req = _request(ttft_slo=40, tpot_slo=20)           # ~61 ms at best: late on both
    count = DecodeHarmFilter.from_config({**FLAT, "hopelessPlacement": "count"})
    assert count.scores(req, [busy, harmed]) == {"busy": 1, "harmed": 2}
    assert [e.name for e in count.filter(req, [busy, harmed])] == ["busy"]     # parked behind the queue
    f = DecodeHarmFilter.from_config(FLAT)              # least-late, the default
    assert [e.name for e in f.filter(req, [busy, harmed])] == ["harmed"] and f.hopeless == 1
    # a request some endpoint serves in time is placed by the count, as before
    assert [e.name for e in f.filter(_request(ttft_slo=1_000, tpot_slo=20), [busy, harmed])] == ["busy"]
    assert f.hopeless == 1
    # shedWhenHopeless refuses only sheddable requests (priority < 0)
    shed = DecodeHarmFilter.from_config({**FLAT, "shedWhenHopeless": True})
    sheddable = _request(ttft_slo=40, tpot_slo=20)
    sheddable.priority = -1
    with pytest.raises(ShedRequest) as refused:
        shed.filter(sheddable, [busy, harmed])
    assert refused.value.reason == "shed-slo-unreachable" and shed.shed == 1
    assert [e.name for e in shed.filter(req, [busy, harmed])] == ["harmed"] and shed.shed == 1
    sheddable_in_time = _request(ttft_slo=1_000, tpot_slo=20)
    sheddable_in_time.priority = -1
    assert [e.name for e in shed.filter(sheddable_in_time, [busy, harmed])] == ["busy"]


def test_the_scheduler_answers_a_shed_request_429_with_the_reason_and_does_not_keep_it():
    clock = Clock(100.0)
    prod = PredictedLatencyProducer(TablePredictor([(200.0, 10.0)] * 2), None, streaming_mode=True, clock=clock)
    sched = Scheduler(producer=prod, profiles=[SchedulingProfile(
        filters=[DecodeHarmFilter.from_config({**FLAT, "shedWhenHopeless": True})])])
    eps = [Endpoint(name=n, metrics=EndpointMetrics(0.1, 0, 0)) for n in ("a", "b")]
    req = _request(ttft_slo=20, tpot_slo=100)           # a 4,096-token prefill takes ~61 ms anywhere
    req.priority = -1
    res = sched.schedule(req, eps, now=clock())
    assert not res.ok and not res.held and res.status == 429 and res.reason == "shed-slo-unreachable"
    assert sched.shed == 1 and prod.decoding("a", clock()) == () and prod.decoding("b", clock()) == ()
    req.priority = 0                                    # not sheddable: placed
    assert sched.schedule(req, eps, now=clock()).ok
