"""The ``predicted-latency-producer``'s per-request state: the running queue per endpoint
ordered by TPOT SLO, and the request contexts with their expiry."""
from __future__ import annotations

from epp_client.plugins import PredictedLatencyProducer
from epp_client.plugins.producer.request_state import ContextCache, RequestContext, RunningQueue


def test_running_queue_rejects_empty_duplicate_and_negative():
    q = PredictedLatencyProducer().running
    assert not q.add("a", "", 1.0) and not q.add("a", "x", -1.0)
    assert q.add("a", "x", 0.0) and not q.add("b", "x", 3.0)
    assert q.size("a") == 1 and q.min_tpot("a") == 0.0
    assert q.remove("x") and not q.remove("x")
    # lazily deleted heap entries stay bounded while the endpoint never drains
    q.add("a", "keep", 5.0)
    for i in range(1000):
        q.add("a", f"r{i}", 10.0)
        q.remove(f"r{i}")
    assert q.size("a") == 1 and q.heap_size("a") <= 18 and q.min_tpot("a") == 5.0


def test_running_queue_orders_by_tpot_slo_and_drops_drained_endpoints():
    q = RunningQueue()
    for rid, slo in (("a1", 30.0), ("a2", 10.0), ("a3", 20.0)):
        assert q.add("a", rid, slo)
    q.add("b", "b1", 50.0)
    assert (q.min_tpot("a"), q.size("a"), len(q)) == (10.0, 3, 4)
    assert q.requests("a") == {"a1": 30.0, "a2": 10.0, "a3": 20.0}
    q.remove("a2")
    assert q.min_tpot("a") == 20.0
    q.remove("a1")
    q.remove("a3")
    assert q.endpoints() == ["b"] and q.min_tpot("a") == 0.0 and q.requests("a") == {}


def test_contexts_expire_after_their_ttl_since_last_use_and_beyond_the_cap_oldest_first():
    running = RunningQueue()
    cache = ContextCache(running, ttl=10.0, max_contexts=2)
    cache.store(RequestContext("r1", 100), now=0.0)
    running.add("a", "r1", 5.0)
    cache.store(RequestContext("r2", 100), now=1.0)
    assert cache.get("r1", now=9.0) is not None          # touched: lives until 19
    assert cache.get("r2", now=11.5) is None              # untouched since 1: expired
    assert len(cache) == 1 and cache.expired == 1
    cache.store(RequestContext("r3", 100), now=12.0)
    cache.store(RequestContext("r4", 100), now=12.0)      # three kept > 2: the oldest (r1) goes
    assert list(cache.contexts) == ["r3", "r4"] and running.size("a") == 0 and cache.expired == 2
    assert cache.discard("r3") and not cache.discard("r3") and len(cache) == 1
