"""epp_client.flowcontrol.program_aware: turn-priority and LAS fairness, eviction, program metrics and
parameters (on a manual clock: no wall-clock assertions)."""
from __future__ import annotations

import math

import pytest

from epp_client import ConfigError
from epp_client.flowcontrol import (
    ProgramAwareFairness,
    QueueView,
    jains_index,
)
from support.flow import Clock, serve, tp


# ---- turn-priority ----------------------------------------------------------------------
def test_turn_priority_no_waiting_flow_picks_nothing():
    c = Clock()
    p = tp(c)
    assert p.pick([]) is None
    assert p.pick([QueueView("a", 0, c.t - 5)]) is None


def test_turn_priority_single_waiting_flow_is_dispatched_without_scoring():
    c = Clock()
    p = tp(c)
    serve(p, "deep", 10)
    # the deep program's queue is empty: the only waiting flow goes, however shallow
    only = QueueView("new", 1, c.t)
    assert p.pick([QueueView("deep", 0, c.t - 100), only]) is only


def test_turn_priority_prefers_deeper_program_under_contention():
    c = Clock()
    p = tp(c)
    serve(p, "deep", 4)                         # turn 5 next
    serve(p, "mid", 2)                          # turn 3 next
    views = [QueueView("new", 1, c.t - 1.0), QueueView("mid", 1, c.t - 1.0), QueueView("deep", 1, c.t - 1.0)]
    assert p.pick(views).fairness_id == "deep"
    assert p.turn_number("deep") == 5 and p.turn_number("new") == 1


def test_turn_priority_ageing_lets_a_waiting_shallow_program_overtake():
    c = Clock()
    p = tp(c, turn_priority_time_weight=0.5)
    serve(p, "deep", 5)                         # turn 6: score 6 + 0.5 x its wait
    deep = QueueView("deep", 1, c.t)
    # new program: 1 + 0.5 x 9 = 5.5 < 6 -> deep wins
    assert p.pick([QueueView("new", 1, c.t - 9.0), deep]) is deep
    # waited 11 s: 1 + 5.5 = 6.5 > 6 -> the shallow one overtakes
    assert p.pick([QueueView("new", 1, c.t - 11.0), deep]).fairness_id == "new"
    # weight 0 orders on depth alone, however long the wait
    p0 = tp(c, turn_priority_time_weight=0.0)
    serve(p0, "deep", 5)
    assert p0.pick([QueueView("new", 1, c.t - 1e6), deep]) is deep


def test_turn_count_resets_when_the_idle_program_is_evicted():
    c = Clock()
    p = tp(c, eviction_ttl_s=100.0, eviction_sweep_s=10.0)
    serve(p, "a", 7)
    assert p.turn_number("a") == 8
    c.t += 50.0                                  # idle, within the TTL: keeps its depth
    p.pick([])
    assert p.turn_number("a") == 8
    c.t += 60.0                                  # idle 110 s > TTL; the lazy sweep runs at this call
    p.pick([])
    assert p.turn_number("a") == 1 and "a" not in p.programs


def test_eviction_spares_programs_in_flight_and_waits_for_the_sweep_interval():
    c = Clock()
    p = tp(c, eviction_ttl_s=100.0, eviction_sweep_s=300.0)
    p.on_dispatch("busy")                        # in flight, never completes
    serve(p, "idle", 3)
    c.t += 200.0                                 # past the TTL but before the first sweep
    p.pick([])
    assert p.turn_number("idle") == 4
    c.t += 100.0                                 # 300 s since the last sweep: it runs
    p.pick([])
    assert "idle" not in p.programs and p.turn_number("busy") == 2
    # evictionTtlSeconds 0 disables eviction
    q = tp(c, eviction_ttl_s=0.0, eviction_sweep_s=1.0)
    serve(q, "x", 2)
    c.t += 1e6
    q.pick([])
    assert q.turn_number("x") == 3


# ---- LAS --------------------------------------------------------------------------------
def test_las_service_is_prompt_plus_twice_completion_and_decays_with_half_life():
    c = Clock()
    p = ProgramAwareFairness(strategy="las", las_half_life_s=60.0, clock=c)
    p.on_dispatch("a")
    p.on_complete("a", 1000, 250)                # cost 1500
    assert p.attained_service()["a"] == pytest.approx(1500.0)
    c.t += 60.0                                  # one half-life: 750 pending decay, folded before adding
    p.on_dispatch("a")
    p.on_complete("a", 100, 0)
    assert p.attained_service()["a"] == pytest.approx(750.0 + 100.0)
    c.t += 120.0
    p._decayed(p.programs["a"], c.t)
    assert p.programs["a"].service == pytest.approx(850.0 / 4)
    # half-life 0: no decay at all (eviction off, so the idle program is kept)
    q = ProgramAwareFairness(strategy="las", las_half_life_s=0.0, eviction_ttl_s=0.0, clock=c)
    q.on_complete("a", 10, 5)
    c.t += 1e5
    q.on_complete("a", 10, 5)
    assert q.attained_service()["a"] == pytest.approx(40.0)


def test_las_scores_normalise_over_the_waiting_flows():
    c = Clock()
    p = ProgramAwareFairness(strategy="las", las_weight_service=0.8, las_weight_head_wait=0.2,
                             las_half_life_s=0.0, clock=c)
    p.on_complete("heavy", 10_000, 0)
    p.on_complete("light", 100, 0)
    # heavy waited longest: 0.8 x 0 + 0.2 x 1 = 0.2; light: 0.8 x 1 + 0.2 x 0 = 0.8
    v = [QueueView("heavy", 1, c.t - 10.0), QueueView("light", 1, c.t - 1.0)]
    assert p.pick(v).fairness_id == "light"
    # only the waiting flows count: an empty queue's service does not stretch the range
    p.on_complete("huge", 10**9, 0)
    assert p.pick(v + [QueueView("huge", 0, c.t)]).fairness_id == "light"
    # equal service -> norm 0.5 each, the head wait decides
    e = ProgramAwareFairness(strategy="las", clock=c)
    assert e.pick([QueueView("x", 1, c.t - 1.0), QueueView("y", 1, c.t - 2.0)]).fairness_id == "y"
    # all equal: the first one given
    assert e.pick([QueueView("x", 1, c.t), QueueView("y", 1, c.t)]).fairness_id == "x"
    # a service weight that dominates beats any wait
    w = ProgramAwareFairness(strategy="las", las_weight_service=1.0, las_weight_head_wait=0.0, clock=c)
    w.on_complete("heavy", 500, 0)
    assert w.pick([QueueView("heavy", 1, c.t - 1e4), QueueView("light", 1, c.t)]).fairness_id == "light"


def test_program_metrics_wait_means_and_jains_index():
    c = Clock()
    p = ProgramAwareFairness(clock=c)
    for pid, wait in (("a", 2.0), ("a", 4.0), ("b", 3.0)):
        v = QueueView(pid, 1, c.t - wait)
        assert p.pick([v]) is v
        p.on_dispatch(pid)
    assert p.avg_wait_ms() == {"a": pytest.approx(3000.0), "b": pytest.approx(3000.0)}
    assert p.jains_index() == pytest.approx(1.0)
    assert jains_index([1.0, 3.0]) == pytest.approx(16 / 20)
    assert jains_index([5.0]) == 1.0 and jains_index([0.0, 0.0]) == 1.0
    assert p.programs["a"].in_flight == 2 and p.programs["a"].dispatched == 2


@pytest.mark.parametrize("kw,name", [
    ({"strategy": "srpt"}, "strategy"), ({"eviction_ttl_s": -1}, "evictionTtlSeconds"),
    ({"eviction_sweep_s": 0}, "evictionSweepSeconds"), ({"las_weight_service": -0.1}, "lasWeightService"),
    ({"las_weight_head_wait": -1}, "lasWeightHeadWait"), ({"las_half_life_s": -5}, "lasHalfLifeSeconds"),
    ({"turn_priority_time_weight": -0.5}, "turnPriorityTimeWeight"), ({"las_half_life_s": "x"}, "lasHalfLifeSeconds"),
    ({"turn_priority_time_weight": math.inf}, "turnPriorityTimeWeight")])
def test_program_aware_parameter_validation_names_the_parameter(kw, name):
    with pytest.raises(ConfigError) as e:
        ProgramAwareFairness(**kw)
    assert name in e.value.param


def test_program_aware_defaults_and_from_config():
    p = ProgramAwareFairness()
    assert (p.strategy, p.eviction_ttl_s, p.eviction_sweep_s, p.las_weight_service, p.las_weight_head_wait,
            p.las_half_life_s, p.turn_priority_time_weight) == ("las", 3600.0, 300.0, 0.8, 0.2, 60.0, 0.5)
    q = ProgramAwareFairness.from_config({"strategy": "turn-priority", "turnPriorityTimeWeight": 2,
                                          "evictionTtlSeconds": 0})
    assert q.strategy == "turn-priority" and q.turn_priority_time_weight == 2.0 and q.eviction_ttl_s == 0.0
    with pytest.raises(ConfigError, match="turnPriorityInactivitySeconds"):
        ProgramAwareFairness.from_config({"turnPriorityInactivitySeconds": 120})
