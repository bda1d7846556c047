"""epp_client.heuristics: the heuristic policies on the request lifecycle (round-robin, least
requests, least load), with the in-flight accounting they read."""
from __future__ import annotations

import random

from epp_client import Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.heuristics import LeastLoadScheduler, LeastRequestsScheduler, RoundRobinScheduler


def eps(n=3):
    return [Endpoint(name=f"e{i}", metrics=EndpointMetrics()) for i in range(n)]


def test_round_robin_takes_turns_and_no_endpoint_is_503():
    s = RoundRobinScheduler()
    assert [s.schedule(InferenceRequest(), eps()).picked[0].name for _ in range(4)] == ["e0", "e1", "e2", "e0"]
    res = s.schedule(InferenceRequest(), [])
    assert res.status == 503 and res.reason == "rejected-no-endpoints" and res.picked == []


def test_least_requests_follows_the_in_flight_count_through_the_lifecycle():
    s = LeastRequestsScheduler(rng=random.Random(1))
    cluster = eps(2)
    first = InferenceRequest(request_id="r1")
    res = s.schedule(first, cluster)
    s.pre_request(first, res)
    busy = res.picked[0].name
    assert s.inflight.load(busy).requests == 1
    assert all(s.schedule(InferenceRequest(), cluster).picked[0].name != busy for _ in range(5))
    s.on_complete("r1")
    assert s.inflight.load(busy).requests == 0


def test_least_load_ranks_by_prefix_minus_in_flight_and_queue():
    s = LeastLoadScheduler(rng=random.Random(1))
    a, b, c = eps()
    a.metrics.waiting_queue_size = 4
    c.prefix_match = PrefixMatch(8, 10)
    assert [e.name for e in s.rank([a, b, c])] == ["e2", "e1", "e0"]
    assert s.schedule(InferenceRequest(), [a, b, c]).picked[0].name == "e2"
