"""Scheduler and profiles: producer → admitters → filters → weighted scorers → picker,
built from Python objects or an EndpointPickerConfig (B2.8 reference wiring), sync and
async, with the fallback and admission behaviour of A.2.2 / A.2.8."""
from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from epp_client import ConfigError, Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.framework.loader import build_scheduler
from epp_client.framework.profile import SchedulingProfile
from epp_client.framework.scheduler import Scheduler
from epp_client.plugins import (
    KVCacheUtilizationScorer,
    LatencyScorer,
    LatencySloAdmitter,
    MaxScorePicker,
    PredictedLatencyProducer,
    PrefixCacheAffinityFilter,
    QueueScorer,
    SloHeadroomTierFilter,
    WeightedRandomPicker,
)
from epp_client.plugins.producer.inflight_load import InFlightTracker
from epp_client.predictor import InProcessPredictor
from epp_client.profiles import PREDICTED_LATENCY_SLO_CONFIG, REFERENCE_CONFIG
from epp_client.training import ListSink
from features.loaded import LoadedBundle


def cluster(n=8):
    # load grows with the index: queue, running, KV use
    return [Endpoint(name=f"pod{i}-rank-0", address="10.0.0.%d" % i, port=8000,
                     metrics=EndpointMetrics(kv_cache_usage=min(0.9, 0.1 * i), waiting_queue_size=i // 2,
                                             running_requests_size=i), prefix_match=PrefixMatch(0, 50))
            for i in range(n)]


def prior_predictor():
    bundle = LoadedBundle.builtin_prior()
    return InProcessPredictor(lambda: bundle)


def ref(predictor=None, sink=None, seed=1, config=REFERENCE_CONFIG):
    return build_scheduler(config, predictor=predictor if predictor is not None else prior_predictor(),
                           sink=sink if sink is not None else ListSink(), rng=random.Random(seed))


def test_reference_wiring_loads_as_it_is():
    s = ref()
    assert isinstance(s.producer, PredictedLatencyProducer) and not s.producer.streaming_mode
    (prof,) = s.profiles
    assert [type(f).__name__ for f in prof.filters] == ["PrefixCacheAffinityFilter", "SloHeadroomTierFilter",
                                                        "PrefixCacheAffinityFilter"]
    strict, _, loose = prof.filters
    assert (strict.affinity_threshold, strict.ttft_source, strict.max_ttft_penalty_ms) == (0.99, "latencyPredictor", 5000)
    assert loose.affinity_threshold == 0.80
    assert [(type(sc).__name__, w) for sc, w in prof.scorers] == [("LatencyScorer", 1.0)]
    assert isinstance(prof.picker, WeightedRandomPicker)
    assert [type(a).__name__ for a in s.admitters] == ["LatencySloAdmitter"]
    slo = ref(config=PREDICTED_LATENCY_SLO_CONFIG)
    assert slo.producer.streaming_mode
    assert slo.profiles[0].filters[0].ttft_source == "prefillThroughput"
    assert slo.profiles[0].filters[0].max_ttft_penalty_ms == 18000


def test_schedule_returns_pick_scores_admission_and_leaves_caller_endpoints_untouched():
    s = ref()
    eps = cluster()
    r = InferenceRequest(headers={"x-llm-d-slo-ttft-ms": "400"}, input_tokens=800)
    res = s.schedule(r, eps)
    assert res.ok and res.admission.admitted and len(res.picked) == 1
    assert r.request_id and r.headers["x-request-id"] == r.request_id == res.request_id
    r2 = InferenceRequest(headers={"x-request-id": "from-header"})
    assert s.schedule(r2, eps).request_id == "from-header" == r2.request_id
    assert set(res.scores) <= {e.name for e in eps} and res.picked[0].name in res.scores
    assert all(c.prediction is not None for c in res.candidates)
    assert all(e.prediction is None for e in eps)  # candidates are per-request clones


def test_slo_headers_change_the_choice():
    eps = cluster()
    no_slo, with_slo = Counter(), Counter()
    s1, s2 = ref(seed=3), ref(seed=3)
    for i in range(300):
        no_slo[s1.schedule(InferenceRequest(input_tokens=800), eps).picked[0].name] += 1
        r = InferenceRequest(input_tokens=800, headers={"x-llm-d-slo-ttft-ms": "600"})
        with_slo[s2.schedule(r, eps).picked[0].name] += 1
    preds = {c.name: c.prediction.ttft_ms for c in s2.schedule(InferenceRequest(input_tokens=800), eps).candidates}
    fastest = min(preds, key=preds.get)
    under = {n for n, t in preds.items() if t < 600}
    closest = max(under, key=preds.get)
    assert 0 < len(under) < len(eps) and closest != fastest
    # without SLO: everyone is negative and idle -> least |headroom| = the fastest endpoint wins most
    assert no_slo.most_common(1)[0][0] == fastest
    # with SLO: only endpoints predicted under it (1 % negative exploration aside), closest to the SLO first
    assert sum(v for k, v in with_slo.items() if k in under) >= 0.95 * 300
    # least headroom first: the two nearest the SLO take most picks, the fastest almost none
    nearest2 = sorted(under, key=preds.get)[-2:]
    assert closest in nearest2 and sum(with_slo[n] for n in nearest2) >= 0.5 * 300
    assert with_slo[fastest] < 0.05 * 300 < no_slo[fastest]


def test_profile_clamps_scores_and_applies_weights():
    class Raw:
        def __init__(self, values):
            self.values = values

        def score(self, request, endpoints):
            return dict(self.values)

    eps = [Endpoint(name="a"), Endpoint(name="b")]
    prof = SchedulingProfile("p", [], [(Raw({"a": 1.01, "b": -3.0}), 2.0), (Raw({"a": 0.25, "b": float("nan")}), 4.0)],
                             MaxScorePicker(rng=random.Random(1)))
    res = Scheduler(profiles=prof).schedule(InferenceRequest(), eps)
    assert res.scores == {"a": 2.0 + 1.0, "b": 0.0} and res.picked[0].name == "a"


def test_default_profile_without_config():
    s = build_scheduler(None)
    (prof,) = s.profiles
    assert [(type(sc).__name__, w) for sc, w in prof.scorers] == [
        ("QueueScorer", 2.0), ("KVCacheUtilizationScorer", 2.0), ("PrefixCacheScorer", 3.0)]
    assert isinstance(prof.picker, MaxScorePicker)
    res = s.schedule(InferenceRequest(), cluster())
    assert res.picked[0].name == "pod0-rank-0"


def test_a22_denied_admission_is_429_and_not_dispatched():
    s = ref()
    eps = cluster()
    for e in eps:
        e.metrics.kv_cache_usage = max(0.5, e.metrics.kv_cache_usage)
        e.metrics.running_requests_size += 1
    r = InferenceRequest(headers={"x-llm-d-slo-ttft-ms": "1"}, priority=-1, input_tokens=800)
    res = s.schedule(r, eps)
    assert not res.ok and res.status == 429 and res.picked == []
    assert res.admission.reason == "no valid endpoint available to serve the request"
    assert s.producer.tracked_requests() == 0  # a denied request leaves no state behind
    # the same request, not sheddable, is scheduled
    assert s.schedule(InferenceRequest(headers={"x-llm-d-slo-ttft-ms": "1"}, input_tokens=800), eps).ok


def test_empty_endpoints_and_filters_emptying_the_set():
    s = ref()
    res = s.schedule(InferenceRequest(), [])
    assert res.status == 503 and res.reason == "rejected-no-endpoints"

    class DropAll:
        def filter(self, request, endpoints):
            return []

    s2 = Scheduler(profiles=SchedulingProfile("d", [DropAll()], [], MaxScorePicker()))
    res = s2.schedule(InferenceRequest(), cluster())
    assert res.status == 429 and res.reason == "rejected-saturated" and res.picked == []


def test_fallback_to_composite_when_predictions_fail():
    class Down:
        def predict_bulk(self, rows):
            return None

        async def apredict_bulk(self, rows):
            return None

    class Broken:
        def predict_bulk(self, rows):
            raise RuntimeError("boom")

        async def apredict_bulk(self, rows):
            raise RuntimeError("boom")

    eps = cluster()
    for pred in (Down(), Broken()):
        s = ref(predictor=pred)
        res = s.schedule(InferenceRequest(headers={"x-llm-d-slo-ttft-ms": "100"}, priority=-1), eps)
        assert res.ok and all(c.prediction is None for c in res.candidates)
        scorer = s.profiles[0].scorers[0][0]
        assert scorer.fallbacks == 1
        # composite: the least loaded endpoint (KV 0, no queue) has the top score
        assert max(res.scores, key=res.scores.get) == "pod0-rank-0"
    assert s.producer_errors == 1


def test_async_schedule_and_producer_timeout():
    class Slow:
        def predict_bulk(self, rows):
            raise AssertionError("sync path not used")

        async def apredict_bulk(self, rows):
            await asyncio.sleep(5)

    async def main():
        s = ref()
        res = await s.aschedule(InferenceRequest(input_tokens=100), cluster())
        assert res.ok and all(c.prediction is not None for c in res.candidates)
        slow = ref(predictor=Slow())
        slow.producer_timeout_s = 0.05
        res = await slow.aschedule(InferenceRequest(input_tokens=100), cluster())
        assert res.ok and all(c.prediction is None for c in res.candidates) and slow.producer_errors == 1

    asyncio.run(main())


def test_lifecycle_through_the_scheduler_updates_inflight_and_trains():
    sink = ListSink()
    t = [10.0]
    s = build_scheduler(REFERENCE_CONFIG, predictor=prior_predictor(), sink=sink, rng=random.Random(2),
                        clock=lambda: t[0])
    eps = cluster()
    r = InferenceRequest(request_id="abc", input_tokens=800)  # 50 uncached blocks of 16
    res = s.schedule(r, eps)
    s.pre_request(r, res)
    name = res.picked[0].name
    assert s.inflight.load(name).requests == 1 and s.inflight.load(name).tokens == 800
    # the next request sees this one in flight
    res2 = s.schedule(InferenceRequest(request_id="n2", input_tokens=10), eps)
    assert next(c for c in res2.candidates if c.name == name).inflight.requests == 1
    t[0] += 0.25
    s.on_first_chunk("abc")
    assert s.inflight.load(name).tokens == 0 and s.inflight.load(name).requests == 1
    t[0] += 0.25
    s.on_complete("abc")
    assert s.inflight.load(name).requests == 0
    (entry,) = sink.entries
    assert entry["actual_ttft_ms"] == 500 and entry["num_request_running"] == 0


@pytest.mark.parametrize("config,bad", [
    ("plugins: [{type: no-such-plugin}]", "plugins[0].type"),
    ("plugins: [{type: latency-scorer, parameters: {ttftWeight: fast}}]", "plugins[0].parameters.ttftWeight"),
    ("plugins: [{type: prefix-cache-affinity-filter, parameters: {affinityThreshold: 2}}]",
     "plugins[0].parameters.affinityThreshold"),
    ("plugins: [{type: latency-scorer, color: red}]", "plugins[0].color"),
    ("plugins: [{type: latency-scorer}, {type: latency-scorer}]", "plugins[1].name"),
    ("plugins: [{type: latency-scorer}]\nschedulingProfiles: [{name: p, plugins: [{pluginRef: nope}]}]",
     "schedulingProfiles[0].plugins[0].pluginRef"),
    ("plugins: [{type: latency-scorer}]\nschedulingProfiles: [{name: p, plugins: [{pluginRef: latency-scorer, "
     "weight: heavy}]}]", "schedulingProfiles[0].plugins[0].weight"),
    ("plugins: [{type: max-score-picker}, {type: random-picker}]\nschedulingProfiles: [{name: p, plugins: "
     "[{pluginRef: max-score-picker}, {pluginRef: random-picker}]}]", "schedulingProfiles[0].plugins[1].pluginRef"),
    ("plugins: [{type: predicted-latency-producer, name: a}, {type: predicted-latency-producer, name: b}]", "plugins"),
    ("plugin: []", "plugin"),
    ("plugins: [unclosed", "config"),
    ("[1, 2]", "config"),
])
def test_invalid_configs_name_the_parameter(config, bad):
    with pytest.raises(ConfigError) as ei:
        build_scheduler(config)
    assert ei.value.param == bad


def test_config_defaults_picker_and_implicit_profile():
    cfg = {"plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"},
                       {"name": "wr", "type": "weighted-random-picker", "parameters": {"maxNumOfEndpoints": 2}},
                       {"type": "single-profile-handler"}],
           "schedulingProfiles": [{"name": "a", "plugins": [{"pluginRef": "queue-scorer", "weight": 3}]}]}
    s = build_scheduler(cfg, rng=random.Random(1))
    assert s.profiles[0].picker.max_num_of_endpoints == 2  # first configured picker
    assert len(s.schedule(InferenceRequest(), cluster()).picked) == 2
    implicit = build_scheduler({"plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}]})
    assert [type(sc).__name__ for sc, _ in implicit.profiles[0].scorers] == ["QueueScorer", "KVCacheUtilizationScorer"]
    assert isinstance(implicit.profiles[0].picker, MaxScorePicker)


def test_python_composition_equals_config():
    rng1, rng2 = random.Random(5), random.Random(5)
    pred = prior_predictor()
    by_hand = Scheduler(
        producer=PredictedLatencyProducer(pred, ListSink()), admitters=[LatencySloAdmitter()],
        profiles=SchedulingProfile("default", [
            PrefixCacheAffinityFilter(0.99, ttft_source="latencyPredictor", max_ttft_penalty_ms=5000, rng=rng1),
            SloHeadroomTierFilter(rng=rng1),
            PrefixCacheAffinityFilter(0.80, ttft_source="latencyPredictor", max_ttft_penalty_ms=5000, rng=rng1)],
            [(LatencyScorer(), 1.0)], WeightedRandomPicker(rng=rng1)), inflight=InFlightTracker())
    from_cfg = build_scheduler(REFERENCE_CONFIG, predictor=pred, sink=ListSink(), rng=rng2)
    eps = cluster()
    for i in range(50):
        h = {"x-llm-d-slo-ttft-ms": str(300 + 20 * i)}
        a = by_hand.schedule(InferenceRequest(request_id=f"r{i}", headers=h, input_tokens=500), eps)
        b = from_cfg.schedule(InferenceRequest(request_id=f"r{i}", headers=h, input_tokens=500), eps)
        assert a.picked[0].name == b.picked[0].name and a.scores == b.scores


def test_queue_and_kv_scorers_in_a_profile():
    prof = SchedulingProfile("h", [], [(QueueScorer(), 2.0), (KVCacheUtilizationScorer(), 2.0)],
                             MaxScorePicker(rng=random.Random(1)))
    res = Scheduler(profiles=[prof]).schedule(InferenceRequest(), cluster(4))
    # queues 0, 0, 1, 1 and KV 0, 0.1, 0.2, 0.3
    assert res.scores == pytest.approx({"pod0-rank-0": 4.0, "pod1-rank-0": 3.8, "pod2-rank-0": 1.6, "pod3-rank-0": 1.4})
    assert res.picked[0].name == "pod0-rank-0"


def test_prometheus_collector_exposes_the_counters():
    from prometheus_client import CollectorRegistry, generate_latest

    from epp_client.metrics import EppCollector

    pred = prior_predictor()
    s = ref(predictor=pred)
    for i in range(5):
        r = InferenceRequest(request_id=f"m{i}", input_tokens=100)
        res = s.schedule(r, cluster())
        s.pre_request(r, res)
    registry = CollectorRegistry()
    registry.register(EppCollector(scheduler=s, predictor=pred))
    text = generate_latest(registry).decode()
    assert "epp_prediction_calls_total 5.0" in text and "epp_prediction_successes_total 5.0" in text
    assert 'epp_producer_events_total{event="predictions"} 5.0' in text
    assert sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("epp_inflight_requests{")) == 5


def test_every_plugin_with_request_hooks_follows_the_request_in_one_order():
    """RequestHooks: the in-flight accounting, then each profile plugin that has the hooks, then
    the producer, for every call; a denied request is discarded by all of them."""
    from epp_client import Admission
    from epp_client.framework.protocols import RequestHooks, RequestHooksBase
    from epp_client.plugins import MaxScorePicker

    calls: list[tuple[str, str]] = []

    class Recorder(RequestHooksBase):
        def __init__(self, name):
            self.name = name

        def pre_request(self, request, picks, now=None):
            calls.append((self.name, "pre_request:" + ",".join(e.name for e in picks.values())))

        def on_chunk(self, request_id, now=None, tokens=None):
            calls.append((self.name, "on_chunk"))

        def on_complete(self, request_id, now=None, *, status=200, aborted=False, output_tokens=None):
            calls.append((self.name, f"on_complete:{status}"))

        def discard(self, request_id):
            calls.append((self.name, "discard"))

    class HookedScorer(Recorder):
        def score(self, request, endpoints):
            return {e.name: 1.0 for e in endpoints}

    class HookedTracker(Recorder, InFlightTracker):
        def __init__(self):
            InFlightTracker.__init__(self)
            self.name = "inflight"

        def pre_request(self, request, picks, now=None):
            InFlightTracker.pre_request(self, request, picks, now)
            Recorder.pre_request(self, request, picks, now)

    class HookedProducer(Recorder):
        def produce(self, request, endpoints, now=None):
            pass

        async def aproduce(self, request, endpoints, now=None):
            pass

    scorer, producer, tracker = HookedScorer("scorer"), HookedProducer("producer"), HookedTracker()
    assert isinstance(scorer, RequestHooks) and isinstance(tracker, RequestHooks)
    sched = Scheduler(producer, [], [SchedulingProfile("default", [], [(scorer, 1.0)], MaxScorePicker())], tracker)
    eps = [Endpoint(name="a", metrics=EndpointMetrics())]
    req = InferenceRequest(request_id="r1", input_tokens=10)
    res = sched.schedule(req, eps)
    sched.pre_request(req, res)
    assert tracker.load("a").requests == 1               # the tracker still counts
    sched.on_chunk("r1")
    sched.on_complete("r1", status=503)
    order = ["inflight", "scorer", "producer"]
    assert calls == [(n, "pre_request:a") for n in order] + [(n, "on_chunk") for n in order] + [
        (n, "on_complete:503") for n in order]
    calls.clear()

    class Deny:
        def admit(self, request, endpoints):
            return Admission(False, "denied", 429)

    strict = Scheduler(producer, [Deny()], [SchedulingProfile("default", [], [(scorer, 1.0)], MaxScorePicker())],
                       tracker)
    denied = strict.schedule(InferenceRequest(request_id="r2"), eps)
    assert denied.status == 429 and calls == [(n, "discard") for n in order]
