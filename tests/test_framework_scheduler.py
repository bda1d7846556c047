"""epp_client.framework.scheduler: producer → admitters → filters → weighted scorers → picker,
sync and async, with the fallback and admission behaviour of A.2.2 / A.2.8 and the request
hooks in one order."""
from __future__ import annotations

import asyncio
import random
from collections import Counter

from epp_client import Endpoint, EndpointMetrics, InferenceRequest
from epp_client.framework.loader import build_scheduler
from epp_client.framework.profile import SchedulingProfile
from epp_client.framework.scheduler import Scheduler
from epp_client.plugins import (
    MaxScorePicker,
)
from epp_client.plugins.producer.inflight_load import InFlightTracker
from epp_client.profiles import REFERENCE_CONFIG
from epp_client.training import ListSink
from support.scheduling import cluster, prior_predictor, ref


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
    for _i in range(300):
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

        def on_complete(self, request_id, now=None, *, status=200, aborted=False, output_tokens=None, prompt_tokens=None):
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
