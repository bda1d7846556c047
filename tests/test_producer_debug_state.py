"""The ``predicted-latency-producer``'s debug state: the busiest endpoints first, capped."""
from __future__ import annotations

from epp_client.plugins.producer.debug_state import dump_state
from epp_client.plugins.producer.request_state import RunningQueue


def test_busiest_endpoints_first_with_their_lowest_tpot_slo_and_truncation():
    q = RunningQueue()
    for ep, rid, slo in (("a", "a1", 20.0), ("b", "b1", 9.0), ("b", "b2", 30.0), ("c", "c1", 0.0)):
        q.add(ep, rid, slo)
    state = dump_state(q, tracked_requests=7)
    assert state == {"endpoints": [{"endpoint": "b", "runningRequests": 2, "minTpotSlo": 9.0},
                                   {"endpoint": "a", "runningRequests": 1, "minTpotSlo": 20.0},
                                   {"endpoint": "c", "runningRequests": 1, "minTpotSlo": 0.0}],
                     "totalEndpoints": 3, "maxEndpoints": 100, "truncated": False, "trackedRequests": 7}
    short = dump_state(q, tracked_requests=7, max_endpoints=2)
    assert [e["endpoint"] for e in short["endpoints"]] == ["b", "a"]
    assert short["truncated"] and short["totalEndpoints"] == 3
    assert dump_state(RunningQueue(), 0)["endpoints"] == []
