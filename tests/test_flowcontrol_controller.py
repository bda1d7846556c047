"""epp_client.flowcontrol.controller: holding while saturated, bands, the band policy, TTL and capacity
rejections (on a manual clock)."""
from __future__ import annotations

import pytest

from epp_client.flowcontrol import (
    REJECTED_CAPACITY,
    REJECTED_TTL,
    BandConfig,
    FlowController,
    ProgramAwareFairness,
)
from support.flow import Clock, serve, tp


# ---- the controller --------------------------------------------------------------------------
def test_controller_holds_everything_while_saturated_then_dispatches():
    c = Clock()
    fc = FlowController(clock=c)
    fc.enqueue("r1", "a")
    assert fc.dispatch_next(1.0) is None and fc.dispatch_next(3.2) is None
    assert fc.dispatch_next(0.99).request_id == "r1"
    assert fc.dispatch_next(0.0) is None and fc.size == 0


def test_controller_higher_bands_strictly_first_fifo_within_a_flow():
    c = Clock()
    fc = FlowController(clock=c)
    for rid, prio in (("low1", -1), ("mid1", 0), ("high1", 10), ("mid2", 0), ("high2", 10)):
        c.t += 1.0
        fc.enqueue(rid, "f", prio)
    order = [fc.dispatch_next(0.0).request_id for _ in range(5)]
    assert order == ["high1", "high2", "mid1", "mid2", "low1"]


def test_controller_band_policy_picks_the_flow():
    c = Clock()
    pol = tp(c)
    serve(pol, "deep", 6)
    fc = FlowController(BandConfig(pol), clock=c)
    fc.enqueue("shallow-1", "new")
    c.t += 0.5
    fc.enqueue("deep-7", "deep")
    assert fc.dispatch_next(0.0).request_id == "deep-7"        # FCFS would pick shallow-1
    assert pol.turn_number("deep") == 8                         # on_dispatch counted it
    fcfs = FlowController(clock=c)
    fcfs.enqueue("shallow-1", "new")
    c.t += 0.5
    fcfs.enqueue("deep-7", "deep")
    assert fcfs.dispatch_next(0.0).request_id == "shallow-1"


def test_controller_ttl_expiry_and_capacity_rejections():
    c = Clock()
    fc = FlowController(BandConfig(max_requests=2), request_ttl_s=30.0, clock=c)
    assert fc.enqueue("a", "x")[1] == "" and fc.enqueue("b", "y")[1] == ""
    assert fc.enqueue("c", "x") == (None, REJECTED_CAPACITY)
    c.t += 10.0
    fc.enqueue("d", "z", priority=5)                # another band: its own capacity
    c.t += 20.0                                      # a and b waited 30 s
    assert sorted(i.request_id for i in fc.expire()) == ["a", "b"]
    assert fc.next_expiry() == pytest.approx(c.t + 10.0)
    assert fc.rejected == {REJECTED_CAPACITY: 1, REJECTED_TTL: 2}
    g = FlowController(max_requests=1, clock=c)
    g.enqueue("a", "x", 3)
    assert g.enqueue("b", "y", 7) == (None, REJECTED_CAPACITY)
    assert FlowController(request_ttl_s=0.0, clock=c).expire() == []


def test_controller_remove_and_completion_reaches_the_band_policy():
    c = Clock()
    pol = ProgramAwareFairness(strategy="las", las_half_life_s=0.0, clock=c)
    fc = FlowController(BandConfig(pol), clock=c)
    item, _ = fc.enqueue("r", "p")
    assert fc.remove(item) and not fc.remove(item) and fc.size == 0
    fc.enqueue("r2", "p")
    fc.dispatch_next(0.0)
    fc.on_complete("p", 100, 50)
    assert pol.attained_service() == {"p": 200.0} and pol.programs["p"].in_flight == 0
