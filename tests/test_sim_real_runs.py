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
from load.sim_realism.fit import (MIN_PREFILL_SCALE, fit_continued, fit_latency, fit_prefill_scale, fit_step_floor,
                                  fit_timeout)
from load.sim_realism.lost import fill_lost
from load.sim_realism.replay import policy_for, replay, requests_of
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
    share, target, got, _ = fit_continued(run, spec, 2, "random")
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


def test_lost_requests_are_put_back_from_the_fixed_sequence_and_the_timeout_is_fitted():
    runs = {(r.stack[:4], r.qps): r for r in fill_lost(load_folder(EXP2, ("sharegpt",), (0.5, 2.0)))}
    lost2, full2 = runs[("llm-", 2.0)], runs[("vllm", 2.0)]
    assert len(lost2.rows) == 203 and len(lost2.lost) == 49 and not full2.lost
    sent = lost2.sent()                                 # the workload's sequence, every 0.5 s
    assert [r.prompt_tokens for r in sent] == [r.prompt_tokens for r in full2.rows]
    assert [r.arrival_s for r in sent] == pytest.approx([i / 2.0 for i in range(252)], abs=0.05)
    assert fit_timeout(runs[("llm-", 0.5)]) == 30.0     # 4 lost; every recorded request under 30 s
    assert fit_timeout(runs[("vllm", 0.5)]) is None


def test_the_timeout_abandons_requests_and_only_finished_ones_are_measured():
    run = fill_lost(load_folder(EXP2, ("sharegpt",), (2.0,)))[0]
    run = replace(run, rows=tuple(r for r in run.rows if r.arrival_s < 40),
                  lost=tuple(r for r in run.lost if r.arrival_s < 40))
    spec = get_70b_preset("llama31-70b-a100-tp2")
    free = replay(run, spec, 1, "random", 0.0)
    cut = replay(run, spec, 1, "random", 0.0, timeout_s=20.0, latency_s=0.5)
    assert free.completed == len(run.sent()) and 0 < cut.completed < free.completed
    for r in cut.requests:
        if r.abandoned:
            assert r.finish_t < 0
        else:
            assert r.e2e_ms <= 19_500 + 1e-6           # the latency outside the engine counts too
    assert cut.stats["ttft_p50"] >= 0.5                # measured as its client sees it


def test_the_latency_outside_the_engine_is_larger_behind_the_gateway():
    spec = get_70b_preset("llama31-70b-a100-tp2")
    lat = {}
    for run in load_folder(EXP2, ("short_input",), (0.5,)):
        rp = replay(run, spec, 2, policy_for(run.stack, {}), 0.0)
        lat[run.stack[:4]] = fit_latency(run, rp)
        shifted = replay(run, spec, 2, policy_for(run.stack, {}), 0.0, latency_s=lat[run.stack[:4]])
        assert shifted.stats["ttft_p50"] == pytest.approx(float(np.median([r.ttft_s for r in run.rows])))
    assert 0 < lat["vllm"] < 0.015 and lat["llm-"] > lat["vllm"] + 0.01


def test_the_step_floor_is_fitted_to_the_lowest_run_tpot():
    spec = get_70b_preset("llama31-70b-a100-tp2")
    run = next(r for r in load_folder(EXP2, ("short_input",), (0.5,)) if r.stack.startswith("vllm"))
    fitted = fit_step_floor(run, spec, 2, "random")
    assert 0 <= fitted.c_fix < spec.c_fix                 # vLLM's decode step is faster than the preset's
    assert replace(fitted, c_fix=spec.c_fix) == spec      # nothing else moves
    measured = float(np.median([r.tpot_ms for r in run.rows]))
    assert replay(run, fitted, 2, "random").stats["tpot_p50"] == pytest.approx(measured, rel=0.02)
    assert replay(run, spec, 2, "random").stats["tpot_p50"] > 1.1 * measured


def test_a_stack_faster_to_first_token_than_the_preset_gets_a_cheaper_prefill_and_no_other_one_does():
    spec = get_70b_preset("llama31-70b-a100-tp2")
    runs = {r.stack[:4]: replace(r, rows=r.rows[:100]) for r in load_folder(EXP2, ("sharegpt",), (0.5,))}
    run = runs["llm-"]     # LMCache's CPU tier: prompts of earlier runs load instead of computing
    floor = fit_step_floor(run, spec, 2, "llmd-default")
    before = replay(run, floor, 2, "llmd-default", 0.3)
    measured = float(np.median([r.ttft_s for r in run.rows]))
    assert before.stats["ttft_p50"] > 1.15 * measured
    fitted, k, after = fit_prefill_scale(run, floor, 2, "llmd-default", 0.3, before)
    assert MIN_PREFILL_SCALE < k < 0.9
    assert after.stats["ttft_p50"] == pytest.approx(measured, rel=0.03)
    assert fitted.a_att == pytest.approx(floor.a_att * k) and fitted.c_tok == pytest.approx(floor.c_tok * k)
    assert fitted.lin_ms[0] == floor.lin_ms[0] and fitted.lin_ms[-1] < floor.lin_ms[-1]   # the slope, not the floor
    kept = ("a_kv", "c_attn", "kv_capacity_tokens", "max_num_batched_tokens")
    assert [getattr(fitted, f) for f in kept] == [getattr(floor, f) for f in kept]
    assert fit_latency(run, after) == pytest.approx(0.0, abs=0.01)
    # where the simulated first token is as late as the measured or earlier, nothing changes
    short = next(r for r in load_folder(EXP2, ("short_input",), (0.5,)) if r.stack.startswith("vllm"))
    rp = replay(short, spec, 2, "random", 0.0)
    assert rp.stats["ttft_p50"] < float(np.median([r.ttft_s for r in short.rows]))
    assert fit_prefill_scale(short, spec, 2, "random", 0.0, rp) == (spec, 1.0, rp)
