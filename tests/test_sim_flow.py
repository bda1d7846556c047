"""Flow control and the agentic scenario in the real simulator: closed-loop turns, deferred
dispatch on simulated time, TTL rejections, and the benchmark's policy names."""
from __future__ import annotations

import json

import pytest

from load import simulate_cli
from load.sim import bench, epp_routers
from load.sim.agentic import AgenticDriver, programs, scaled, summarize_programs
from load.sim.driver import BaseRouter
from load.sim.engine import ClusterConfig, Simulation
from load.sim.flowsim import FlowSimRouter, make, split
from load.sim.routers import LeastQueueRouter
from load.sim.scenarios import get_scenario
from load.sim.stepmodel import get_preset
from load.sim.workloads import SEG, SloClass

SPEC = get_preset("llama3-8b-a100", kv_capacity_tokens=60_000)


def run(policy: str, progs, n_servers: int = 1, ttl: float = 60.0):
    inner = LeastQueueRouter(0)
    router = make(policy, inner, ttl) if "+" in policy else FlowSimRouter(inner)
    driver = AgenticDriver(progs, SloClass(), SPEC)
    router.driver = driver
    sim = Simulation(ClusterConfig([SPEC] * n_servers), driver.initial_requests(), router)
    res = sim.run()
    return res, driver, router


def test_agentic_programs_grow_their_context_and_share_the_previous_turn():
    for p in programs(30, seed=3):
        assert 1 <= len(p.turns) <= 48 and len(p.thinks) == len(p.turns) - 1
        for a, b in zip(p.turns, p.turns[1:]):
            assert b.input_len > a.input_len + a.output_len                  # + answer + tool result
            full = a.input_len // SEG
            assert [k for k, _ in b.segments[:full]] == [k for k, _ in a.segments[:full]]   # shared prefix
    assert max(len(p.turns) for p in programs(300, seed=0)) >= 20            # "a few to dozens"


def test_closed_loop_turns_follow_each_other_and_all_programs_finish():
    progs = scaled(programs(12, seed=1), 0.5)
    res, driver, _ = run("least-queue", progs)
    assert len(res.requests) == sum(len(p.turns) for p in progs)           # turns were injected as they came
    assert all(r.done and not r.shed for r in res.requests)
    by_prog: dict = {}
    for r in sorted(driver.requests, key=lambda r: r.arrival):
        by_prog.setdefault(r.session, []).append(r)
    for p in progs:
        turns = by_prog[p.pid]
        assert turns[0].arrival == pytest.approx(p.arrival)
        for k in range(1, len(turns)):                                     # next turn = end + think time
            assert turns[k].arrival == pytest.approx(turns[k - 1].finish_t + p.thinks[k - 1])
        assert p.end == pytest.approx(turns[-1].finish_t) and not p.failed
    hits = sum(max(0, r.hit_tokens) for r in res.requests if driver.turn_of[r.rid][1] > 0)
    assert hits > 0                                                        # later turns reuse the cached prefix


def test_flow_control_holds_requests_while_saturated_and_is_deterministic():
    progs = scaled(programs(40, seed=2), 2.0)                              # far more than one small server serves
    res, driver, router = run("x+turn-priority", progs)
    waits = [r.dispatch_t - r.arrival for r in res.requests if r.dispatch_t >= 0]
    assert max(waits) > 0.5                                                # the gateway queue held requests
    assert router.flow.controller.dispatched == len(waits)
    assert all(r.done for r in res.requests if not r.shed)
    res2, _, _ = run("x+turn-priority", scaled(programs(40, seed=2), 2.0))
    assert [r.finish_t for r in res.requests] == [r.finish_t for r in res2.requests]
    # FCFS orders differently from turn-priority on the same arrivals
    res3, _, _ = run("x+fcfs", scaled(programs(40, seed=2), 2.0))
    assert [r.finish_t for r in res3.requests] != [r.finish_t for r in res.requests]


def test_ttl_expiry_rejects_and_ends_the_program():
    progs = scaled(programs(40, seed=2), 2.0)
    res, driver, router = run("x+fcfs", progs, ttl=0.2)
    assert router.rejected["rejected-ttl-expired"] > 0
    failed = [p for p in driver.progs.values() if p.failed]
    assert failed and all(p.end >= 0 for p in failed)
    shed = [r for r in res.requests if r.shed]
    assert all(r.dispatch_t < 0 for r in shed) and all(not r.done for r in shed)
    # a rejected request's queue wait (arrival to rejection, >= the TTL) is part of the wait statistics
    m = summarize_programs(driver)
    assert m["queue_wait_max_s"] >= 0.2
    assert all(max(p.waits) >= 0.2 for p in failed)


CONC = {"type": "concurrency-detector", "maxConcurrency": 2}


def test_concurrency_detector_caps_the_pool_and_the_flow_queue_holds_the_rest():
    opts = bench.RunOptions(seed=0)
    progs = scaled(programs(40, seed=2), 2.0)
    inner = epp_routers.make("llmd-token-load", opts, 2)
    router = make("token-load+fcfs", inner, 60.0, CONC)
    driver = AgenticDriver(progs, SloClass(), SPEC)
    router.driver = driver
    sim = Simulation(ClusterConfig([SPEC] * 2), driver.initial_requests(), router)
    in_servers: list[int] = []
    forward = router.on_dispatch

    def on_dispatch(req, idx, now):              # requests on the servers right after each dispatch
        forward(req, idx, now)
        in_servers.append(sum(len(s.running) + len(s.waiting) for s in sim.servers))

    router.on_dispatch = on_dispatch
    res = sim.run()
    assert max(in_servers) == 4                  # 2 servers x maxConcurrency 2: never more, in one burst or not
    waits = [r.dispatch_t - r.arrival for r in res.requests if r.dispatch_t >= 0]
    assert max(waits) > 1.0                      # the rest waited in the flow-control queue
    assert all(r.done for r in res.requests if not r.shed)


def test_concurrency_detector_needs_in_flight_accounting_and_the_scenario_chooses_its_detector():
    class Bare(BaseRouter):                      # routes, but counts nothing in flight
        def route(self, req, now):
            return 0

    with pytest.raises(ValueError, match="in-flight accounting"):
        Simulation(ClusterConfig([SPEC]), [], make("x+fcfs", Bare(), 60.0, CONC)).run()
    sc = get_scenario("agentic")
    assert dict(sc.flow_detector)["type"] == "concurrency-detector"
    progs, cap = bench.prepare(sc, bench.RunOptions(seed=0, limit=8))
    _, _, router = bench.run_one(sc, progs, cap, 1.0, "token-load+fcfs", bench.RunOptions(seed=0, limit=8))
    assert router.flow.detector.max_concurrency == dict(sc.flow_detector)["maxConcurrency"]
    opts = bench.RunOptions(seed=0, limit=8, flow_detector={"type": "utilization-detector"})
    _, _, router = bench.run_one(sc, progs, cap, 1.0, "token-load+fcfs", opts)
    assert router.flow.detector.TYPE == "utilization-detector"       # an explicit detector wins


def test_policy_names_and_the_agentic_benchmark_metrics():
    assert split("token-load+las") == ("llmd-token-load", "las") and split("predicted") is None
    with pytest.raises(ValueError, match="ordering"):
        split("token-load+srpt")
    assert bench.is_known("predicted+turn-priority") and not bench.is_known("nope+fcfs")
    opts = bench.RunOptions(seed=0, limit=25)
    sc = get_scenario("agentic")
    progs, cap = bench.prepare(sc, opts)
    assert len(progs) == 25 and cap > 0
    m, _, router = bench.run_one(sc, progs, cap, 1.0, "token-load+turn-priority", opts)
    for key in ("program_completion_mean_s", "program_completion_p90_s", "ttft_turn_1_mean_ms", "prefix_hit_rate",
                "queue_wait_mean_s", "queue_wait_p99_s", "jain_index", "programs_completed"):
        assert key in m
    assert m["programs_completed"] + m["programs_failed"] == 25
    assert 0 < m["jain_index"] <= 1.0


def test_cli_runs_the_agentic_scenario_and_rejects_unknown_orderings(capsys):
    assert simulate_cli.main(["--scenario", "agentic", "--policies", "token-load+fcfs", "--load", "1.0",
                              "--limit", "10", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "completion mean" in out and "token-load+fcfs" in out
    assert simulate_cli.main(["--scenario", "agentic", "--policies", "token-load+edf", "--quiet"]) == 2


def test_seeds_report_has_the_program_table_and_the_acceptance_checks():
    from load.sim import seeds
    from load.sim.agentic import acceptance

    def m(ct, p99, mx, jain):
        return {"program_completion_mean_s": ct, "queue_wait_p99_s": p99, "queue_wait_max_s": mx, "jain_index": jain}

    per = {"token-load+fcfs": [m(200.0, 20.0, 25.0, 0.40)], "token-load+turn-priority": [m(160.0, 18.0, 30.0, 0.30)],
           "token-load+las": [m(170.0, 40.0, 50.0, 0.35)]}
    [line] = acceptance(per, first_seed=3)
    assert line.startswith("token-load seed 3: FCFS completion 200.0 s")
    assert "reduction +20.0%" in line and "max wait 30.0 s = 1.50x FCFS p99 20.0 s" in line
    assert "Jain FCFS 0.400 LAS 0.350 (-0.050)" in line
    text = seeds.report("agentic", 3, 1, seeds.aggregate({"1.0": per}), per_seed={"1.0": per})
    assert "| token-load+turn-priority | 160.0 ± 0.0 s |" in text and "reduction +20.0%" in text


def test_flow_params_reach_the_program_aware_policy_and_are_validated(capsys, tmp_path):
    params = {"lasWeightService": 0.0, "lasWeightHeadWait": 1.0, "lasHalfLifeSeconds": 10}
    router = make("x+las", LeastQueueRouter(0), 60.0, None, params)
    [pol] = router.flow.controller.policies()
    assert (pol.strategy, pol.las_weight_service, pol.las_weight_head_wait, pol.las_half_life_s) == ("las", 0, 1, 10)
    tp = make("x+turn-priority", LeastQueueRouter(0), 60.0, None, {"turnPriorityTimeWeight": 0.1})
    assert tp.flow.controller.policies()[0].turn_priority_time_weight == 0.1
    # LAS weighing only the head wait is FCFS across flows: the same dispatch order on the same arrivals
    progs = programs(40, seed=2)
    fcfs, _, _ = run("x+fcfs", scaled(progs, 2.0))
    inner = LeastQueueRouter(0)
    las = make("x+las", inner, 60.0, None, params)
    las.driver = AgenticDriver(scaled(progs, 2.0), SloClass(), SPEC)
    res = Simulation(ClusterConfig([SPEC]), las.driver.initial_requests(), las).run()
    default_las, _, _ = run("x+las", scaled(progs, 2.0))
    assert [r.dispatch_t for r in res.requests] == [r.dispatch_t for r in fcfs.requests]
    assert [r.dispatch_t for r in default_las.requests] != [r.dispatch_t for r in fcfs.requests]
    base = ["--scenario", "agentic", "--policies", "token-load+las", "--load", "1.0", "--limit", "4", "--quiet"]
    for bad, named in (("lasWeightHeadWait=-1", "lasWeightHeadWait"), ("strategy=turn-priority", "strategy"),
                       ("lasWeight", "NAME=VALUE"), ("halfLife=10", "halfLife")):
        assert simulate_cli.main([*base, "--flow-param", bad]) == 2
        assert named in capsys.readouterr().err
    assert simulate_cli.main([*base, "--flow-param", "lasHalfLifeSeconds=10", "--seeds", "2", "--out",
                              str(tmp_path)]) == 0
    assert json.loads((tmp_path / "results.json").read_text())["flow_params"] == {"lasHalfLifeSeconds": 10}
    assert "lasHalfLifeSeconds=10" in (tmp_path / "report.md").read_text()     # the run says what it tuned


def test_jains_index_is_over_every_programs_mean_wait_including_programs_that_never_waited():
    driver = AgenticDriver(programs(3, seed=0), SloClass(), SPEC)
    for p, waits in zip(driver.progs.values(), ([1.0, 3.0], [4.0], [0.0, 0.0, 0.0])):
        p.waits = waits                        # a rejected turn's wait is in here too (test above)
    m = summarize_programs(driver)
    assert m["jain_index"] == pytest.approx((2 + 4 + 0) ** 2 / (3 * (2 ** 2 + 4 ** 2 + 0)))   # 0.6: per-program means
    assert m["queue_wait_mean_s"] == pytest.approx(8 / 6)                                   # per request


def test_a_failed_programs_turns_that_never_arrived_are_misses():
    """Agentic attainment is over every turn of every program: ending programs early (a shed or
    abandoned turn) takes their later turns out of the load, and must not raise attainment."""
    progs = scaled(programs(40, seed=2), 2.0)
    res, driver, _ = run("x+fcfs", progs, ttl=0.2)
    failed = [p for p in driver.progs.values() if p.failed]
    assert failed
    m = summarize_programs(driver)
    planned = sum(len(p.turns) for p in driver.progs.values())
    never = sum(len(p.turns) for p in failed) - sum(1 for r in res.requests if r.session in {p.pid for p in failed})
    assert never > 0 and m["turns_not_issued"] == never == planned - len(res.requests)
    met = sum(1 for r in res.requests if r.meets_slo())
    assert m["slo_attainment"] == pytest.approx(met / planned)
    assert m["slo_attainment"] < met / len(res.requests)          # over the arrivals alone it would read higher
