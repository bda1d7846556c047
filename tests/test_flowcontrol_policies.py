"""epp_client.flowcontrol.policies: the fairness id header, global-strict FCFS and round-robin turns."""
from __future__ import annotations

from epp_client.flowcontrol import (
    GlobalStrictFairness,
    QueueView,
    RoundRobinFairness,
    fairness_id,
)


# ---- the fairness id --------------------------------------------------------------------
def test_fairness_id_header_alias_and_default():
    assert fairness_id({"x-llm-d-inference-fairness-id": "a", "x-gateway-inference-fairness-id": "b"}) == "a"
    assert fairness_id({"x-gateway-inference-fairness-id": "b"}) == "b"
    assert fairness_id({"x-llm-d-inference-fairness-id": ""}) == "default-flow"
    assert fairness_id({}) == "default-flow"


# ---- simple policies ----------------------------------------------------------------------
def test_global_strict_is_fcfs_across_flows_and_round_robin_takes_turns():
    g = GlobalStrictFairness()
    assert g.pick([QueueView("b", 3, 5.0), QueueView("a", 1, 2.0), QueueView("c", 0, 1.0)]).fairness_id == "a"
    r = RoundRobinFairness()
    views = [QueueView("b", 1, 0.0), QueueView("a", 1, 0.0), QueueView("c", 1, 0.0)]
    assert [r.pick(views).fairness_id for _ in range(4)] == ["a", "b", "c", "a"]
    assert r.pick([QueueView("a", 1, 0.0), QueueView("b", 0, 0.0)]).fairness_id == "a"
