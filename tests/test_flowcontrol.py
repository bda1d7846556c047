"""Flow control: the fairness policies' rules, the saturation detector, the controller, and
the ``flowControl`` config section (all on a manual clock: no wall-clock assertions)."""
from __future__ import annotations

import math

import pytest

from epp_client import ConfigError
from epp_client.flowcontrol import (
    REJECTED_CAPACITY,
    REJECTED_TTL,
    BandConfig,
    ConcurrencyDetector,
    EndpointLoad,
    FlowController,
    GlobalStrictFairness,
    ProgramAwareFairness,
    QueueView,
    RoundRobinFairness,
    UtilizationDetector,
    build_flow_control,
    fairness_id,
    jains_index,
    make_detector,
)
from epp_client.framework.loader import build_scheduler


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def tp(clock, **kw):
    return ProgramAwareFairness(strategy="turn-priority", clock=clock, **kw)


def serve(policy, pid, n=1, prompt=100, completion=10):
    for _ in range(n):
        policy.on_dispatch(pid)
        policy.on_complete(pid, prompt, completion)


# ---- the fairness id --------------------------------------------------------------------
def test_fairness_id_header_alias_and_default():
    assert fairness_id({"x-llm-d-inference-fairness-id": "a", "x-gateway-inference-fairness-id": "b"}) == "a"
    assert fairness_id({"x-gateway-inference-fairness-id": "b"}) == "b"
    assert fairness_id({"x-llm-d-inference-fairness-id": ""}) == "default-flow"
    assert fairness_id({}) == "default-flow"


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


# ---- simple policies ----------------------------------------------------------------------
def test_global_strict_is_fcfs_across_flows_and_round_robin_takes_turns():
    g = GlobalStrictFairness()
    assert g.pick([QueueView("b", 3, 5.0), QueueView("a", 1, 2.0), QueueView("c", 0, 1.0)]).fairness_id == "a"
    r = RoundRobinFairness()
    views = [QueueView("b", 1, 0.0), QueueView("a", 1, 0.0), QueueView("c", 1, 0.0)]
    assert [r.pick(views).fairness_id for _ in range(4)] == ["a", "b", "c", "a"]
    assert r.pick([QueueView("a", 1, 0.0), QueueView("b", 0, 0.0)]).fairness_id == "a"


# ---- saturation ----------------------------------------------------------------------------
def test_utilization_detector_roofline_mean_and_fail_closed():
    d = UtilizationDetector()
    assert (d.queue_depth_threshold, d.kv_cache_util_threshold, d.metrics_staleness_s) == (5, 0.8, 0.2)
    now = 10.0
    fresh = now - 0.05
    assert d.saturation([EndpointLoad(5, 0.1, fresh), EndpointLoad(0, 0.4, fresh)], now) == pytest.approx(0.75)
    assert not d.saturated([EndpointLoad(2, 0.72, fresh)], now)                 # 0.9
    assert d.saturated([EndpointLoad(0, 0.8, fresh)], now)                      # kv at threshold
    # stale or missing metrics count as fully saturated; an empty pool is saturated
    assert d.saturation([EndpointLoad(0, 0.0, now - 0.5), EndpointLoad(0, 0.0, None)], now) == 1.0
    assert d.saturation([], now) == 1.0
    with pytest.raises(ConfigError, match="kvCacheUtilThreshold"):
        UtilizationDetector.from_config({"kvCacheUtilThreshold": 1.5})
    assert UtilizationDetector.from_config({"metricsStalenessThreshold": "1s"}).metrics_staleness_s == 1.0


def load(requests=0, tokens=0):
    return EndpointLoad(99, 1.0, None, requests, tokens)     # scraped metrics: ignored by this detector


def test_concurrency_detector_modes_defaults_and_pending():
    d = ConcurrencyDetector()
    assert (d.concurrency_mode, d.max_concurrency, d.max_token_concurrency, d.headroom) == ("requests", 100, 10**6, 0.0)
    # requests: in flight over the pool's capacity (endpoints x maxConcurrency); metrics age is irrelevant
    d = ConcurrencyDetector(max_concurrency=4)
    assert d.saturation([load(3), load(3)], 0.0) == pytest.approx(0.75)
    assert d.saturation([load(8), load(0)], 0.0) == 1.0 and d.saturated([load(8), load(0)], 0.0)   # aggregate
    assert not d.saturated([load(3), load(4)], 0.0)
    # released but not yet counted by any endpoint: counts as a request
    assert d.saturated([load(3), load(4)], 0.0, pending=1)
    assert d.saturation([], 0.0) == 1.0
    t = ConcurrencyDetector(concurrency_mode="tokens", max_token_concurrency=1000)
    assert t.saturation([load(50, 500), load(50, 1000)], 0.0) == pytest.approx(0.75)
    assert t.saturation([load(0, 500)], 0.0, pending=5) == pytest.approx(0.5)    # pending tokens unknown
    # hybrid: per endpoint the larger ratio, then the mean
    h = ConcurrencyDetector(concurrency_mode="hybrid", max_concurrency=4, max_token_concurrency=1000)
    assert h.saturation([load(4, 0), load(0, 500)], 0.0) == pytest.approx(0.75)
    for bad in ({"concurrencyMode": "bytes"}, {"maxConcurrency": 0}, {"maxTokenConcurrency": -1}, {"headroom": -0.1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            ConcurrencyDetector.from_config(bad)


def test_make_detector_picks_the_type_and_validates():
    assert isinstance(make_detector(None), UtilizationDetector)
    d = make_detector({"type": "concurrency-detector", "maxConcurrency": 16})
    assert isinstance(d, ConcurrencyDetector) and d.max_concurrency == 16
    assert make_detector({"queueDepthThreshold": 2}).queue_depth_threshold == 2
    with pytest.raises(ConfigError, match="type"):
        make_detector({"type": "nope"})
    with pytest.raises(ConfigError, match="maxConcurrency"):
        make_detector({"maxConcurrency": 4})            # not a utilization-detector parameter


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


# ---- the flowControl config section ------------------------------------------------------------
CONFIG = """
plugins:
- type: program-aware-fairness
  parameters: {strategy: turn-priority, turnPriorityTimeWeight: 0.25}
- name: sat
  type: utilization-detector
  parameters: {queueDepthThreshold: 3, metricsStalenessThreshold: 1s}
- type: queue-scorer
flowControl:
  maxRequests: 1k
  defaultRequestTTL: 45s
  defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness, maxRequests: 100}
  priorityBands:
  - {priority: 10, fairnessPolicyRef: round-robin-fairness-policy, orderingPolicyRef: fcfs-ordering-policy}
  saturationDetector: {pluginRef: sat}
"""


def test_flow_control_config_section():
    c = Clock()
    fc = build_flow_control(CONFIG, clock=c)
    ctl = fc.controller
    assert ctl.request_ttl_s == 45.0 and ctl.max_requests == 1000
    assert fc.detector.queue_depth_threshold == 3 and fc.detector.metrics_staleness_s == 1.0
    pol = ctl.default_band.policy
    assert isinstance(pol, ProgramAwareFairness) and pol.turn_priority_time_weight == 0.25 and pol.clock is c
    assert ctl.default_band.max_requests == 100
    assert isinstance(ctl.bands[10].policy, RoundRobinFairness) and ctl.bands[10].max_requests == 5000
    build_scheduler(CONFIG)                           # the scheduler builder skips the flow-control plugins
    assert build_flow_control("plugins: []") is None  # off when absent
    plain = build_flow_control("flowControl: {}")
    assert isinstance(plain.controller.default_band.policy, type(None)) and plain.controller.request_ttl_s == 60.0
    assert isinstance(plain.controller._band(0).policy, GlobalStrictFairness)
    assert isinstance(plain.detector, UtilizationDetector)
    conc = build_flow_control("plugins: [{type: concurrency-detector, parameters: {maxConcurrency: 8}}]\n"
                              "flowControl: {}")
    assert isinstance(conc.detector, ConcurrencyDetector) and conc.detector.max_concurrency == 8
    ref = build_flow_control("flowControl: {saturationDetector: {pluginRef: concurrency-detector}}")
    assert isinstance(ref.detector, ConcurrencyDetector) and ref.detector.max_concurrency == 100


@pytest.mark.parametrize("text,where", [
    ("flowControl: {maxBytes: 1Gi}", "flowControl.maxBytes"),
    ("flowControl: {defaultRequestTTL: soon}", "flowControl.defaultRequestTTL"),
    ("flowControl: {defaultPriorityBand: {fairnessPolicyRef: nope}}", "flowControl.defaultPriorityBand.fairnessPolicyRef"),
    ("flowControl: {priorityBands: [{fairnessPolicyRef: round-robin-fairness-policy}]}",
     "flowControl.priorityBands[0].priority"),
    ("flowControl: {defaultPriorityBand: {orderingPolicyRef: edf-ordering-policy}}",
     "flowControl.defaultPriorityBand.orderingPolicyRef"),
    ("flowControl: {defaultPriorityBand: {maxRequests: -3}}", "flowControl.defaultPriorityBand.maxRequests"),
    ("plugins: [{type: program-aware-fairness, parameters: {lasHalfLifeSeconds: -1}}]\nflowControl: {}",
     "plugins[0].parameters.lasHalfLifeSeconds"),
    ("plugins: [{type: utilization-detector}]\nflowControl: {defaultPriorityBand: {fairnessPolicyRef: utilization-detector}}",
     "flowControl.defaultPriorityBand.fairnessPolicyRef"),
    ("plugins: [{type: concurrency-detector, parameters: {concurrencyMode: bytes}}]\nflowControl: {}",
     "plugins[0].parameters.concurrencyMode"),
    ("flowControl: {saturationDetector: {pluginRef: global-strict-fairness-policy}}",
     "flowControl.saturationDetector.pluginRef"),
])
def test_flow_control_config_errors_name_the_field(text, where):
    with pytest.raises(ConfigError) as e:
        build_flow_control(text)
    assert e.value.param == where
