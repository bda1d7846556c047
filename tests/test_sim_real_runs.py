"""Simulated realism against real vLLM runs (``load.sim_realism``) and the Llama-3.1-70B presets."""
from __future__ import annotations

import gzip
import json
from dataclasses import replace

import numpy as np
import pytest

from load.data import data_root
from load.sim.presets_70b import PRESETS_70B, SPLITWISE, get_70b_preset, kv_capacity_tokens
from load.sim.server import ModelServer
from load.sim.workloads import isolated_prefill_ms
from load.sim_realism import compare as C
from load.sim_realism.__main__ import main
from load.sim_realism.fit import fit_continued
from load.sim_realism.replay import replay, requests_of
from load.sim_realism.runs import RunsError, load_folder, read_run
from tests.test_sim_realism import _req

EXP2 = data_root() / "llm-d-benchmark-exp2"


def _decode_ms(spec, batch, ctx):
    srv = ModelServer(0, spec.with_overrides({"max_num_batched_tokens": 1 << 20}))
    for i in range(batch):
        srv.add(_req(i, ctx, 4), 0.0)
    t = srv.plan_step(0.0)
    srv.finish_step(t, None, None)
    return srv.plan_step(t) * 1000.0


@pytest.mark.parametrize("name", sorted(PRESETS_70B))
def test_presets_reproduce_the_splitwise_figures_they_come_from(name):
    spec = get_70b_preset(name)
    d1, p1k, p8k = SPLITWISE[name.removeprefix("llama31-70b-")]
    assert _decode_ms(spec, 1, 576) == pytest.approx(d1, rel=0.05)
    unchunked = spec.with_overrides({"max_num_batched_tokens": 8192})
    assert isolated_prefill_ms(unchunked, 1024) == pytest.approx(p1k, rel=0.12)
    assert isolated_prefill_ms(unchunked, 8192) == pytest.approx(p8k, rel=0.15)


def test_kv_capacity_follows_the_memory_budget():
    a100 = kv_capacity_tokens(2, 0.95)
    assert 50_000 < a100 < 60_000                       # 8.3 GiB per GPU at 160 KiB per token
    assert kv_capacity_tokens(2, 0.9) < a100 < kv_capacity_tokens(4, 0.95)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_capacity_tokens(2, 0.8)                      # the weights alone exceed the budget
    assert get_70b_preset("llama31-70b-a100-tp2", 0.95).kv_capacity_tokens == a100


def test_shipped_runs_load_with_their_recorded_rows():
    runs = load_folder(EXP2, ("sharegpt",), (2.0,))
    by_stack = {r.stack: r for r in runs}
    assert sorted(by_stack) == ["llm-d-70b-2replicas", "vllm-70b-2replicas"]
    assert len(by_stack["vllm-70b-2replicas"].rows) == 252 and len(by_stack["llm-d-70b-2replicas"].rows) == 203
    first = by_stack["vllm-70b-2replicas"].rows[0]
    assert (first.prompt_tokens, first.arrival_s) == (689, 0.0)


def test_a_malformed_run_is_refused_naming_the_column(tmp_path):
    stack = tmp_path / "s"
    stack.mkdir()
    bad = stack / "LMBench_sharegpt_output_1.csv.gz"
    with gzip.open(bad, "wt") as f:
        f.write("prompt_tokens,generation_tokens,ttft,launch_time\n10,5,0.1,1.0\n")
    with pytest.raises(RunsError, match="generation_time"):
        read_run(bad, "s")
    assert main([str(tmp_path), "--preset", "llama31-70b-a100-tp2"]) == 2
    cols = "prompt_tokens,generation_tokens,ttft,generation_time,launch_time\n"
    partial = stack / "LMBench_sharegpt_output_2.csv"
    partial.write_text(cols + "10,5,,,3.0\n10,0,0.1,0.0,4.0\n10,5,0.2,0.4,5.0\n")
    run = read_run(partial, "s")                        # incomplete requests are not recorded rows
    assert [(r.arrival_s, r.ttft_s, r.tpot_ms) for r in run.rows] == [(0.0, 0.2, pytest.approx(100.0))]
    partial.write_text(cols + "10,5,abc,0.4,5.0\n")
    with pytest.raises(RunsError, match="'ttft'"):
        read_run(partial, "s")
    assert main([str(tmp_path / "missing"), "--preset", "llama31-70b-a100-tp2"]) == 2
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--preset", "llama31-70b-a100-tp2", "--policy", "no-equals-sign"])


def test_continued_prompts_reuse_cached_kv_and_the_fit_finds_them():
    full = load_folder(EXP2, ("sharegpt",), (0.5,))[1]
    run = replace(full, rows=full.rows[:100])
    spec = get_70b_preset("llama31-70b-a100-tp2")
    cold = replay(run, spec, 2, "random", 0.0)
    warm = replay(run, spec, 2, "random", 0.6)
    assert sum(max(0, r.hit_tokens) for r in cold.requests) == 0
    assert sum(max(0, r.hit_tokens) for r in warm.requests) > 0
    assert warm.stats["ttft_p50"] < cold.stats["ttft_p50"]
    assert [r.segments for r in requests_of(run, 16, 0.6, 3)] == [r.segments for r in requests_of(run, 16, 0.6, 3)]
    share, target, got = fit_continued(run, spec, 2, "random")
    assert 0 < share and abs(got - target) < 0.05


def _pt(qps, ttft_p90_m, ttft_p90_s, ratio=1.0):
    m = {k: 1.0 for k in C.STATS}
    s = {k: ratio for k in C.STATS}
    m["ttft_p90"], s["ttft_p90"] = ttft_p90_m, ttft_p90_s
    return C.Point(qps, 100, m, s)


def test_judge_applies_the_bands_below_saturation_and_the_one_step_rule():
    s = C.Series("a", "w", "random", [_pt(1, 1, 1, 1.14), _pt(2, 1.1, 1.1, 1.16), _pt(3, 10, 1.2), _pt(4, 20, 9)])
    C.judge(s)
    assert s.points[0].verdict["ttft_p50"] == "PASS" and s.points[0].verdict["tpot_p99"] == "PASS"
    assert s.points[1].verdict["ttft_p50"] == "FAIL" and s.points[1].verdict["tpot_p99"] == "PASS"
    assert set(s.points[2].verdict.values()) == {"-"}   # at and past the measured saturation point
    assert s.saturation == {"measured_qps": 3, "simulated_qps": 4, "verdict": "PASS"}
    late = C.Series("a", "w", "random", [_pt(1, 1, 1), _pt(2, 10, 1), _pt(3, 10, 1), _pt(4, 10, 9)])
    C.judge(late)
    assert late.saturation["verdict"] == "FAIL"


def test_cli_table_and_json_on_a_small_sample(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = [str(EXP2), "--preset", "llama31-70b-a100-tp2", "--workload", "sharegpt", "--qps", "0.5,2",
            "--limit", "60", "--continued", "0.4", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "vllm-70b-2replicas / sharegpt" in text and "summary:" in text
    res = json.loads(out.read_text())
    assert [s["stack"] for s in res["series"]] == ["llm-d-70b-2replicas", "vllm-70b-2replicas"]
    pt = res["series"][1]["points"][0]
    rows = load_folder(EXP2, ("sharegpt",), (0.5,))[1].rows[:60]
    assert pt["measured"]["ttft_p50"] == pytest.approx(float(np.percentile([r.ttft_s for r in rows], 50)))
    assert pt["completed"] == 60 and set(pt["verdict"].values()) <= {"PASS", "FAIL", "-"}
    assert {g["stat"] for g in res["gaps"]} == set(C.GAP_STATS)
    assert main(argv) == 0                                          # deterministic per seed
    assert json.loads(out.read_text()) == res
