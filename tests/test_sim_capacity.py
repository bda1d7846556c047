"""Capacity at SLO (``simulate --capacity``), the verdict at the top of report.md, and equal
footing: the heuristics behind llm-d's flow control, shed requests counted as misses."""
from __future__ import annotations

import dataclasses
import json

import pytest

from load import simulate_cli
from load.sim import bench, verdict
from load.sim.capacity import TARGET, TOLERANCE, Search, misses_allowed, search
from load.sim.scenarios import get_scenario


def _step(edge: float):
    """A policy whose attainment falls off at ``edge`` (x its capacity): 95% up to it, 60% past it."""
    def run(load: float, policy: str) -> tuple[dict, float, float]:
        return {"slo_attainment": 0.95 if load <= edge else 0.6}, 0.0, 0.0
    return run


@pytest.mark.parametrize("edge", (0.37, 0.737, 1.0, 1.61))
def test_bisection_brackets_the_edge_to_two_percent(edge):
    got = search(["p"], _step(edge), capacity_rps=10.0)["p"]
    lo, hi = got["bracket"]
    assert lo <= edge < hi and hi - lo <= TOLERANCE * lo
    assert got["capacity"] == lo and got["capacity_rps"] == pytest.approx(10 * lo)
    held = [p["load"] for p in got["probes"] if p["slo_attainment"] >= 0.9]
    assert max(held) == lo and len(got["probes"]) <= 12


def test_idle_workers_split_the_widest_gap_and_never_run_a_load_twice():
    s = Search("p", guided=False)
    assert s.next_load() == 1.0 and s.next_load([1.0]) is None    # nothing known yet: wait for the first
    s.record(1.0, {"slo_attainment": 0.95})
    assert s.next_load() == 1.25 and s.next_load([1.25]) == pytest.approx(1.5625)   # stepping up
    s.record(2.0, {"slo_attainment": 0.5})
    assert s.next_load() == 1.5
    assert s.next_load([1.5]) == 1.25 and s.next_load([1.5, 1.25]) == 1.75
    s.record(1.015, {"slo_attainment": 0.5})     # the edge is below 1.015: within 2% of 1.0, done
    assert s.next_load() is None and s.result(4.0)["capacity"] == 1.0


def test_a_guided_probe_goes_where_the_attainments_cross_the_target_within_the_bracket():
    s = Search("p")
    s.record(1.0, {"slo_attainment": 0.95})
    s.record(2.0, {"slo_attainment": 0.5})
    assert s.next_load() == pytest.approx(1.1111)     # 0.05 of the 0.45 between the ends: a ninth in
    assert s.next_load([1.1111]) == pytest.approx(1.5556, abs=1e-4)    # an idle worker halves the widest gap left
    s.record(1.1111, {"slo_attainment": 0.92})
    assert s.next_load() == pytest.approx(1.5555, abs=1e-4)     # that probe did not halve the bracket: halve it
    s.record(1.5555, {"slo_attainment": 0.6})
    # the line from (1.1111, 92%) to (1.5555, 60%) crosses 90% at 1.1389
    assert s.next_load() == pytest.approx(1.1389, abs=1e-4)
    t = Search("q")
    t.record(1.0, {"slo_attainment": 0.9001})
    t.record(1.5, {"slo_attainment": 0.7})
    assert t.next_load() == 1.0199      # the crossing is just past the lower end: 2% past it (floored), to close it
    t.record(1.0199, {"slo_attainment": 0.89})
    assert t.next_load() is None and t.result(1.0)["capacity"] == 1.0


def _smooth(edge: float):
    """A policy whose attainment falls linearly with load, through 90% at ``edge``."""
    def run(load: float, policy: str) -> tuple[dict, float, float]:
        return {"slo_attainment": min(1.0, 0.9 - 0.08 * (load - edge) / edge)}, 0.0, 0.0
    run.edge = edge
    return run


def _cliff(edge: float):
    """Attainment just over 90% up to ``edge``, then collapsing: the line through a bracket's ends
    points near the lower end, far from the edge."""
    def run(load: float, policy: str) -> tuple[dict, float, float]:
        return {"slo_attainment": 0.9005 if load <= edge else 0.2}, 0.0, 0.0
    run.edge = edge
    return run


def _probes_guided_and_bisected(policy) -> dict[bool, int]:
    """The probes of a search with and without guided narrowing, each checked to bracket the edge
    (``policy.edge``) to 2%."""
    probes = {}
    for guided in (True, False):
        s = Search("p", guided=guided)
        while (x := s.next_load()) is not None:
            m, _, _ = policy(x, "p")
            s.record(x, m)
        lo, hi = s.result(1.0)["bracket"]
        assert lo <= policy.edge < hi and hi - lo <= TOLERANCE * lo
        probes[guided] = len(s.probes)
    return probes


@pytest.mark.parametrize("edge", (0.37, 0.737, 1.0, 1.61))
def test_guided_narrowing_brackets_like_bisection_in_fewer_probes_where_attainment_falls_smoothly(edge):
    probes = _probes_guided_and_bisected(_smooth(edge))
    assert probes[True] < probes[False]


@pytest.mark.parametrize("edge", (0.37, 0.737, 1.0, 1.19, 1.61))
def test_where_the_line_misleads_every_other_probe_halves_the_bracket(edge):
    probes = _probes_guided_and_bisected(_cliff(edge))
    assert probes[True] <= 2 * probes[False]


@pytest.mark.parametrize("n", (1, 9, 10, 11, 99, 100, 12_031))
def test_misses_allowed_is_the_last_count_that_still_holds(n):
    k = misses_allowed(n)
    assert (n - k) / n >= TARGET > (n - k - 1) / n


def test_a_probe_stops_once_it_certainly_fails_and_a_held_one_runs_to_the_end():
    sc = get_scenario("standard-small")
    opts = bench.RunOptions(seed=0, limit=300)
    arrivals, cap = bench.prepare(sc, opts)
    stop = dataclasses.replace(opts, stop_below=TARGET)
    full, _, _ = bench.run_one(sc, arrivals, cap, 1.0, "round-robin", opts)
    early, _, _ = bench.run_one(sc, arrivals, cap, 1.0, "round-robin", stop)
    assert full["slo_attainment"] <= early["slo_attainment"] < TARGET    # the bound it stayed under
    assert early["known_misses"] == misses_allowed(300) + 1 and 0 < early["decided_at"] < 1
    assert early["steps"] < full["steps"]                                  # it did less of the work
    held, _, _ = bench.run_one(sc, arrivals, cap, 0.6, "llmd-token-load", opts)
    held_stop, _, _ = bench.run_one(sc, arrivals, cap, 0.6, "llmd-token-load", stop)
    assert held["slo_attainment"] >= TARGET and "decided_at" not in held_stop
    assert held_stop == held                                               # a probe that holds is the full run


def _metrics(att: float, p99_s: float, abandoned: int | None = None, shed: int = 0) -> dict:
    m = {"slo_attainment": att, "ttft_p99_ms": p99_s * 1000, "shed": shed}
    if abandoned is not None:
        m["abandoned"] = abandoned
    return m


def test_the_verdict_needs_attainment_and_a_bounded_tail_and_no_more_abandoned():
    best = _metrics(0.88, 24.0, 5)
    assert verdict.judge_load(_metrics(0.95, 30.0, 5), best) == (True, [])
    assert verdict.judge_load(_metrics(0.95, 2207.0, 5), best) == (False, ["TTFT p99 over 1.5x"])
    assert verdict.judge_load(_metrics(0.95, 30.0, 6), best) == (False, ["more abandoned"])
    assert verdict.judge_load(_metrics(0.88, 20.0, 0), best) == (False, ["attainment not higher"])
    # before abandonment is counted (no key), it is 0 on both sides
    assert verdict.judge_load(_metrics(0.95, 30.0), _metrics(0.88, 24.0)) == (True, [])


def test_the_best_heuristic_is_llm_d_s_with_or_without_flow_control():
    per = {"random": _metrics(0.99, 1.0), "llmd-default": _metrics(0.80, 29.0),
           "llmd-token-load": _metrics(0.88, 24.0), "token-load+fcfs": _metrics(0.91, 3.0, shed=40),
           "predicted": _metrics(0.95, 23.2)}
    assert verdict.best_heuristic(per) == "token-load+fcfs"         # random and the profile itself never are
    text = "\n".join(verdict.lines({"0.8": per}))
    assert "load 0.8: `predicted` **does not win** against `token-load+fcfs`" in text
    assert "TTFT p99 over 1.5x" in text and "shed 0 vs 40" in text
    del per["token-load+fcfs"]
    assert "**wins** against `llmd-token-load`" in "\n".join(verdict.lines({"0.8": per}))
    assert verdict.lines({"0.8": {"random": per["random"]}}) == []    # nothing to compare: no verdict


def test_capacity_cli_writes_the_verdict_first(tmp_path):
    out = tmp_path / "cap"
    assert simulate_cli.main(["--scenario", "standard-small", "--limit", "120", "--capacity", "--policies",
                              "predicted,llmd-token-load", "--workers", "2", "--quiet", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    for pol in ("predicted", "llmd-token-load"):
        cap = res["capacity"][pol]
        lo, hi = cap["bracket"]
        assert cap["capacity"] == lo > 0 and hi - lo <= TOLERANCE * lo
        atts = {p["load"]: p["slo_attainment"] for p in cap["probes"]}
        assert atts[lo] >= 0.9 > atts[hi]
    report = (out / "report.md").read_text()
    assert report.index("## Verdict") < report.index("| policy | capacity at SLO")
    assert "- capacity at SLO: `predicted`" in report and "the best heuristic's" in report


def test_heuristics_behind_flow_control_shed_and_each_shed_request_is_a_miss(tmp_path):
    out = tmp_path / "sweep"
    assert simulate_cli.main(["--scenario", "standard-small", "--limit", "200", "--load", "2.0", "--policies",
                              "predicted,llmd-token-load,llmd-token-load+fcfs", "--flow-ttl", "5", "--workers", "1",
                              "--no-plots", "--quiet", "--out", str(out)]) == 0
    per = json.loads((out / "results.json").read_text())["results"]["2.0"]
    fc = per["llmd-token-load+fcfs"]
    assert fc["shed"] > 0 and fc["flow_rejected-ttl-expired"] > 0
    assert fc["slo_attainment"] <= (fc["requests"] - fc["shed"]) / fc["requests"]
    report = (out / "report.md").read_text()
    best = verdict.best_heuristic(per)
    assert report.index("## Verdict") < report.index("## Load 2.0")
    assert f"against `{best}`" in report


def test_capacity_starts_from_a_sweep_with_the_same_settings_and_refuses_another(tmp_path, capsys):
    common = ["--scenario", "standard-small", "--limit", "120", "--policies", "llmd-token-load", "--workers", "1",
              "--quiet"]
    sweep = tmp_path / "sweep"
    assert simulate_cli.main([*common, "--load", "0.5,1.4", "--no-plots", "--out", str(sweep)]) == 0
    ran = json.loads((sweep / "results.json").read_text())["results"]
    out = tmp_path / "cap"
    assert simulate_cli.main([*common, "--capacity", "--from-sweep", str(sweep), "--out", str(out)]) == 0
    cap = json.loads((out / "results.json").read_text())["capacity"]["llmd-token-load"]
    reused = {p["load"]: p["slo_attainment"] for p in cap["probes"] if p.get("reused")}
    assert reused == {0.5: ran["0.5"]["llmd-token-load"]["slo_attainment"],
                      1.4: ran["1.4"]["llmd-token-load"]["slo_attainment"]}
    assert cap["reused"] == 2 and 1.0 not in {p["load"] for p in cap["probes"]}   # the sweep's bracket, not 1.0
    lo, hi = cap["bracket"]
    assert hi - lo <= TOLERANCE * lo
    capsys.readouterr()
    assert simulate_cli.main([*common, "--seed", "1", "--capacity", "--from-sweep", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert "--from-sweep: the sweep ran with other settings: " in err and "seed 0, here 1" in err
    assert simulate_cli.main([*common, "--from-sweep", str(sweep)]) == 2
    assert "--from-sweep goes with --capacity" in capsys.readouterr().err
