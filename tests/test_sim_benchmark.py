"""The benchmark: workloads, determinism, report/CLI."""
from __future__ import annotations

import json

import pytest

from load import simulate_cli
from load.sim import bench
from load.sim import workloads as W
from load.sim.report import KEYS
from load.sim.scenarios import get_scenario


def test_mooncake_replay_keeps_hash_blocks_and_scales_time():
    arr = W.load_mooncake("conversation", limit=300)
    assert len(arr) == 300
    assert all(sum(n for _, n in a.segments) == a.input_len for a in arr)
    assert all(a.segments[0][0] == 0 for a in arr)       # every request starts with block id 0
    assert all(n == W.SEG for a in arr for _, n in a.segments[:-1])
    scaled = W.scale_to_rate(arr, 10.0)
    rate = (len(scaled) - 1) / (scaled[-1].time_s - scaled[0].time_s)
    assert rate == pytest.approx(10.0)
    assert [a.input_len for a in scaled] == [a.input_len for a in arr]
    assert W.ideal_hit_tokens(arr)[0] == 0 and sum(W.ideal_hit_tokens(arr)) > 0


def test_azure_replay_marks_synthetic_prefixes():
    arr = W.load_azure("code", limit=200, seed=1)
    assert len(arr) == 200 and arr[0].time_s == 0.0
    shared = sum(1 for a in arr if a.segments[0][0] < (3 << 40) and a.input_len >= W.SEG)
    assert shared > 50      # most requests got a synthetic system prompt


def test_sessions_grow_context_and_share_prefixes():
    arr = W.synthetic_sessions(30, seed=3)
    hits = W.ideal_hit_tokens(arr)
    assert sum(hits) > 0.3 * sum(a.input_len for a in arr)
    assert W.synthetic_sessions(30, seed=3) == arr and W.synthetic_sessions(30, seed=4) != arr


def test_slo_classes_are_drawn_per_request():
    arr = W.synthetic_poisson(400, seed=1)
    classes = [W.SloClass(share=1, ttft_ms=500, tpot_ms=50, name="a"),
               W.SloClass(share=1, ttft_ms=5000, tpot_ms=200, priority=-1, name="b")]
    reqs = W.make_requests(arr, classes, seed=1)
    prios = [r.priority for r in reqs]
    assert 100 < prios.count(-1) < 300
    assert {r.ttft_slo_ms for r in reqs} == {500, 5000}


def _run(policy, seed, limit=250, load=0.9):
    sc = get_scenario("standard-small")
    opts = bench.RunOptions(seed=seed, limit=limit)
    arr, cap = bench.prepare(sc, opts)
    m, _, _ = bench.run_one(sc, arr, cap, load, policy, opts)
    return m


@pytest.mark.parametrize("policy", ["random", "least-queue", "oracle", "oracle-harm"])
def test_same_seed_same_results(policy):
    a, b = _run(policy, 5), _run(policy, 5)
    assert a == b
    assert a["completed"] + a["shed"] + a["abandoned"] == a["requests"] == 250


def test_different_seed_differs():
    assert _run("random", 1) != _run("random", 2)


def test_missed_slos_add_up_to_the_misses():
    """Every completed request that fails its SLO misses TTFT, TPOT or both; shed ones count as
    misses of neither (they never completed)."""
    m = _run("random", 0, limit=400, load=1.2)
    missed = 1.0 - m["slo_attainment"] - m["shed"] / m["requests"]
    assert m["ttft_miss_share"] > 0 and m["tpot_miss_share"] >= 0
    assert max(m["ttft_miss_share"], m["tpot_miss_share"]) <= missed + 1e-9
    assert missed <= m["ttft_miss_share"] + m["tpot_miss_share"] + 1e-9


def test_harm_aware_oracle_keeps_running_requests_within_their_tpot_slo():
    """Counting the requests a placement pushes over their TPOT SLO (oracle-harm) instead of only
    the request's own latency (oracle): far fewer TPOT misses, many more requests within SLO."""
    plain, harm = _run("oracle", 0, limit=300), _run("oracle-harm", 0, limit=300)
    assert harm["tpot_miss_share"] < 0.5 * plain["tpot_miss_share"]
    assert harm["slo_attainment"] > plain["slo_attainment"] + 0.1
    assert 0 < harm["oracle_placements_with_a_miss"] < harm["requests"]


def test_oracle_beats_random_on_ttft():
    o, r = _run("oracle", 0, limit=400, load=1.0), _run("random", 0, limit=400, load=1.0)
    assert o["ttft_p90_ms"] < r["ttft_p90_ms"]


def test_cli_writes_results_report_and_plots(tmp_path, capsys):
    out = tmp_path / "o"
    rc = simulate_cli.main(["--scenario", "standard-small", "--limit", "150", "--policies", "random,least-queue",
                            "--load", "0.5,1.0", "--seed", "3", "--out", str(out), "--quiet"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["scenario"] == "standard-small" and res["seed"] == 3
    assert set(res["results"]) == {"0.5", "1.0"}
    for per in res["results"].values():
        assert set(per) == {"random", "least-queue"}
        for m in per.values():
            assert set(KEYS) <= set(m)
            assert 0.0 <= m["slo_attainment"] <= 1.0
    report = (out / "report.md").read_text()
    assert "## Load 0.5" in report and "| least-queue |" in report
    for png in ("latency_vs_load.png", "slo_vs_load.png", "ttft_cdf.png", "tpot_cdf.png"):
        assert (out / png).stat().st_size > 1000


def test_cli_rejects_bad_arguments(capsys):
    assert simulate_cli.main(["--scenario", "nope"]) == 2
    assert simulate_cli.main(["--policies", "random,bogus"]) == 2
    assert simulate_cli.main(["--load", "0.5,abc"]) == 2
    assert "abc" in capsys.readouterr().err
    assert simulate_cli.main(["--policies", "random", "--record-trace", "/tmp/x.jsonl"]) == 2
    assert "--record-trace" in capsys.readouterr().err
    assert simulate_cli.main(["--list"]) == 0
    assert "standard" in capsys.readouterr().out


def test_identical_results_across_processes_and_hash_seeds(tmp_path):
    """The CLI run twice in fresh interpreters (different PYTHONHASHSEED) writes the same results."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    outs = []
    for hseed in ("1", "2"):
        out = tmp_path / f"run{hseed}"
        env = {**os.environ, "PYTHONHASHSEED": hseed}
        subprocess.run([sys.executable, "-m", "load.simulate_cli", "--scenario", "standard-small", "--limit", "150",
                        "--policies", "random,llmd-default,llmd-token-load,oracle", "--load", "0.9", "--seed", "7",
                        "--out", str(out), "--no-plots", "--quiet"], cwd=repo, env=env, check=True, timeout=300,
                       capture_output=True)
        outs.append(json.loads((out / "results.json").read_text())["results"])
    assert outs[0] == outs[1]


def test_workers_give_the_sequential_results_in_sweep_order(tmp_path, capsys):
    """--workers 2 (forked processes, longest runs first) writes the figures and the order of a
    sequential run; a count below 1 is refused."""
    res = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        assert simulate_cli.main(["--scenario", "standard-small", "--limit", "120", "--policies",
                                  "random,llmd-token-load,oracle", "--load", "1.0,0.5", "--seed", "4",
                                  "--workers", workers, "--out", str(out), "--no-plots", "--quiet"]) == 0
        res.append(json.loads((out / "results.json").read_text()))
    seq, par = res
    assert json.dumps(seq["results"]) == json.dumps(par["results"])     # same figures, same key order
    assert list(par["results"]) == ["1.0", "0.5"] and list(par["results"]["0.5"]) == ["random", "llmd-token-load",
                                                                                       "oracle"]
    assert list(par["meta"]["wall_s"]) == list(seq["meta"]["wall_s"])
    assert simulate_cli.main(["--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err
