"""Foreign engines (``simulate --engine``): other physics under the same router, never told."""
from __future__ import annotations

import json

import pytest

from load import simulate_cli
from load.sim import bench, engines
from load.sim.request import SimRequest
from load.sim.scenarios import SCENARIOS, get_scenario
from load.sim.server import ModelServer
from load.sim.stepmodel import get_preset
from load.sim.steptable import splitwise_curves
from load.sim.workloads import capacity_rps

BASE = get_preset("llama3-8b-a100")
#: (tokens, decode context, decodes, prefill pairs): a decode batch, a fresh chunk, a chunk deep in a prompt
STEPS = ((33, 32 * 2_000, 32, 1.0), (2_048, 0.0, 0, 2_048 * 1_024.0), (2_048, 0.0, 0, 2_048 * (8_192 - 1_024.0)))


def _on(name: str, **params):
    return engines.engine_spec(BASE, engines.get_engine(name), params)


def test_slow_and_fast_scale_every_step_reshaped_changes_the_shape():
    base = [BASE.step_ms(*s) for s in STEPS]
    assert [_on("slow").step_ms(*s) for s in STEPS] == pytest.approx([2 * t for t in base])
    assert [_on("fast").step_ms(*s) for s in STEPS] == pytest.approx([t / 2 for t in base])
    assert [_on("default").step_ms(*s) for s in STEPS] == base
    ratio = [_on("reshaped").step_ms(*s) / t for s, t in zip(STEPS, base)]
    # a fresh chunk is cheaper (per-token cost halved), a chunk deep in a long prompt dearer (attention 3x)
    assert ratio[1] < 0.7 and ratio[2] > 1.1
    spec = _on("budget8k")
    assert (spec.max_num_batched_tokens, spec.max_num_seqs) == (8_192, 64)
    assert _on("decode-first").batching_order == "decode-first"
    assert _on("slow", speed_scale=0.25).step_ms(*STEPS[0]) == pytest.approx(4 * base[0])   # a parameter


def test_the_splitwise_engine_interpolates_the_published_table():
    px, py, dx, dy = splitwise_curves()
    spec = _on("splitwise")
    i, j = px.index(1024.0), dx.index(8.0)
    assert spec.step_ms(1_024, 0.0, 0, 1_024 * 512.0) == pytest.approx(py[i])          # a prompt alone
    assert spec.step_ms(8, 8 * 600.0, 8, 0.0) == pytest.approx(dy[j])                  # a decode batch
    # between the table's points: linear in the prompt length
    mid = spec.step_ms(1_536, 0.0, 0, 1_536 * 768.0)
    assert mid == pytest.approx((py[i] + py[i + 1]) / 2)
    # a mixed step pays the weights once: decodes + chunk < decode step + chunk alone
    assert spec.step_ms(1_032, 8 * 600.0, 8, 1_024 * 512.0) < dy[j] + py[i]
    # the table engine has no formula coefficients to set
    with pytest.raises(ValueError, match="'a_att' is not a coefficient of engine splitwise; known: speed_scale"):
        _on("splitwise", a_att=1e-6)


def test_engine_parameters_are_checked_and_named():
    with pytest.raises(ValueError, match=r"'warp' is not a coefficient of engine slow; known: .*_scale"):
        _on("slow", warp=2)
    with pytest.raises(ValueError, match="max_num_seqs: expected a positive whole number"):
        _on("default", max_num_seqs=2.5)
    with pytest.raises(ValueError, match="batching_order: 'random' is not one of"):
        _on("default", batching_order="random")
    with pytest.raises(ValueError, match="unknown engine 'warp'; known: default, slow"):
        engines.get_engine("warp")


def _req(rid: int, prompt: int, out: int = 200) -> SimRequest:
    return SimRequest(rid, 0.0, prompt, out, ((f"k{rid}", prompt),))


def _decoding_with_a_prompt_ahead() -> tuple[ModelServer, SimRequest, SimRequest]:
    """A server running a request that decodes and a long prompt still prefilling, the prompt
    first in the running list (as when a preempted prompt is re-admitted ahead of a decode)."""
    srv = ModelServer(0, BASE)
    dec, long = _req(1, 100), _req(2, 20_000)
    srv.add(dec, 0.0)
    t = 0.0
    while dec.generated < 2:
        t += srv.plan_step(t)
        srv.finish_step(t, None, None)
    srv.add(long, t)
    t += srv.plan_step(t)
    srv.finish_step(t, None, None)
    assert long.computed < long.target and srv.running == [dec, long]
    srv.running.reverse()
    return srv, long, dec


@pytest.mark.parametrize("order", ("default", "decode-first", "prefill-first"))
def test_the_batching_order_decides_who_gets_the_budget(order):
    # the long prompt takes the whole budget when it is batched first
    srv, long, dec = _decoding_with_a_prompt_ahead()
    srv.spec = BASE.with_overrides({"batching_order": order})
    srv.plan_step(1.0)
    batched = [r for r, _ in srv._batch]
    if order == "decode-first":
        assert batched == [dec, long]
    else:    # admission order, or prompts first: the prompt's chunk takes the budget, the decode waits
        assert batched == [long]


def test_mixed_pools_and_every_scenario_on_every_engine():
    pool = engines.pool(get_scenario("standard").servers, "default:4,slow:4")
    assert [s.engine for s in pool] == ["default"] * 4 + ["slow"] * 4
    assert [s.speed for s in pool] == [1.0] * 4 + [0.5] * 4
    with pytest.raises(ValueError, match="the counts add up to 7 servers, the pool has 8"):
        engines.pool(get_scenario("standard").servers, "default:4,slow:3")
    with pytest.raises(ValueError, match="every engine a count"):
        engines.pool(get_scenario("standard").servers, "default:4,slow")
    arrivals = get_scenario("standard").workload(0)[:300]
    for sc in SCENARIOS.values():
        for name in engines.ENGINES:
            moved = engines.apply(sc, name)
            assert len(moved.servers) == len(sc.servers) and {s.engine for s in moved.servers} == {name}
            assert capacity_rps(arrivals, moved.servers) > 0
    # the analytic capacity follows the engine: slow halves it, a mixed pool sits between
    sc = get_scenario("standard")
    base = capacity_rps(arrivals, sc.servers)
    assert capacity_rps(arrivals, engines.apply(sc, "slow").servers) == pytest.approx(base / 2)
    assert capacity_rps(arrivals, engines.apply(sc, "default:4,slow:4").servers) == pytest.approx(0.75 * base)


@pytest.mark.parametrize("scenario,engine,policy", (("standard-small", "reshaped", "llmd-token-load"),
                                                   ("pd", "budget8k", "pd-prefix-5"),
                                                   ("agentic", "splitwise", "least-queue"),
                                                   ("multi-lora", "prefill-first", "llmd-lora")))
def test_scenarios_of_every_kind_run_on_a_foreign_engine(scenario, engine, policy):
    sc = engines.apply(get_scenario(scenario), engine)
    opts = bench.RunOptions(seed=0, limit=30)
    arr, cap = bench.prepare(sc, opts)
    m, _, _ = bench.run_one(sc, arr, cap, 0.8, policy, opts)
    assert m["requests"] > 0 and m["completed"] > 0


def test_simulate_on_an_engine_changes_the_world_not_the_router(tmp_path, capsys):
    base = ["--scenario", "standard-small", "--limit", "150", "--load", "0.8", "--policies", "llmd-token-load",
            "--no-plots", "--quiet", "--workers", "1"]
    runs = {}
    for engine in ("default", "slow", "decode-first"):
        out = tmp_path / engine
        assert simulate_cli.main([*base, "--engine", engine, "--out", str(out)]) == 0
        runs[engine] = json.loads((out / "results.json").read_text())
    # same load share of each pool's own capacity; slow's capacity is half, its requests/s too
    assert runs["slow"]["meta"]["capacity_rps"] == pytest.approx(runs["default"]["meta"]["capacity_rps"] / 2)
    assert "every step 2x slower" in runs["slow"]["meta"]["engine"]
    ttft = {e: r["results"]["0.8"]["llmd-token-load"]["ttft_p50_ms"] for e, r in runs.items()}
    assert ttft["slow"] > 1.5 * ttft["default"]
    assert simulate_cli.main([*base, "--engine", "slow", "--engine-param", "warp=2"]) == 2
    assert "'warp' is not a coefficient of engine slow; known:" in capsys.readouterr().err
    assert simulate_cli.main([*base, "--engine", "default:3,slow:2"]) == 2
    assert "the pool has 4" in capsys.readouterr().err
