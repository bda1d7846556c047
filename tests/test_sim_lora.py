"""LoRA adapters in the simulator (slots, load time, LRU eviction, waiting adapters, mixing
cost, scraped metrics), the lora-v1 filter tree, and the multi-LoRA policies end to end."""
from __future__ import annotations

import pytest

from epp_client.framework.loader import build_scheduler
from load.sim import workloads as W
from load.sim.adapters import AdapterSlots, LoraSpec
from load.sim.bench import RunOptions, run_one
from load.sim.lora_v1 import v1_candidates
from load.sim.lora_workloads import LoraSetup, zipf_adapters
from load.sim.request import SimRequest
from load.sim.scenarios import Scenario, _pool
from load.sim.server import Metrics, ModelServer
from load.sim.stepmodel import get_preset

SPEC = get_preset("llama3-8b-a100")


def _req(rid, n_in, n_out, lora="", t=0.0):
    segs = tuple((("u", rid, j), min(512, n_in - j * 512)) for j in range(-(-n_in // 512)))
    r = SimRequest(rid, t, n_in, n_out, segs)
    r.lora = lora
    return r


def _server(max_loras=2, load_ms=100.0, step_ms=1.0, mix_ms=0.25):
    srv = ModelServer(0, SPEC)
    srv.adapters = AdapterSlots(LoraSpec(max_loras, load_ms, step_ms, mix_ms))
    return srv


def _drain(srv, t=0.0):
    while srv.has_work():
        t += srv.plan_step(t)
        srv.finish_step(t, None, None)
    return t


def test_load_time_delays_first_step_and_mixing_costs_per_distinct_adapter():
    base = ModelServer(0, SPEC)
    base.add(_req(0, 100, 2), 0.0)
    plain = base.plan_step(0.0)
    base.finish_step(plain, None, None)
    plain2 = base.plan_step(plain)
    srv = _server(load_ms=100.0)
    srv.add(_req(0, 100, 2, "a"), 0.0)
    d1 = srv.plan_step(0.0)
    assert d1 == pytest.approx(plain + (100.0 + 1.0) / 1000.0)   # adapter load + LoRA step cost
    srv.finish_step(d1, None, None)
    assert srv.running[0].first_token_t == d1                    # no token before the load is over
    # second step: resident, no load; one adapter: the fixed LoRA step cost only
    assert srv.plan_step(d1) == pytest.approx(plain2 + 1.0 / 1000.0)
    assert srv.adapters.loads == 1
    two = _server(max_loras=4, load_ms=0.0)
    two.add(_req(0, 100, 2, "a"), 0.0)
    two.add(_req(1, 100, 2, "b"), 0.0)
    both = ModelServer(0, SPEC)
    both.add(_req(0, 100, 2), 0.0)
    both.add(_req(1, 100, 2), 0.0)
    assert two.plan_step(0.0) == pytest.approx(both.plan_step(0.0) + (1.0 + 0.25) / 1000.0)


def test_full_slots_make_adapters_wait_and_later_requests_go_first():
    srv = _server(max_loras=2, load_ms=0.0)
    for i, a in enumerate(("a", "b", "c", "a")):
        srv.add(_req(i, 100, 50, a), 0.0)
    srv.plan_step(0.0)
    assert [r.lora for r in srv.running] == ["a", "b", "a"]      # "c" skipped, the later "a" went first
    assert [r.lora for r in srv.waiting] == ["c"] and srv.adapters.skips >= 1
    m = srv.metrics(0.0)
    assert m.active_lora == {"a", "b"} and m.waiting_lora == {"c"} and m.max_lora == 2
    t = _drain(srv)
    assert all(r.done for r in [*srv.running, *srv.waiting]) and srv.metrics(t).waiting_lora == frozenset()


def test_lru_eviction_of_idle_adapters():
    s = AdapterSlots(LoraSpec(max_loras=2, load_ms=10.0, step_ms=0.0, mix_ms=0.0))
    assert s.step_extra_ms(["a"]) == 10.0 and s.step_extra_ms(["b"]) == 10.0
    assert s.step_extra_ms(["a"]) == 0.0                  # resident: a is now the most recent
    assert s.step_extra_ms(["c"]) == 10.0                 # evicts b, the least recently used
    assert list(s.resident) == ["a", "c"] and s.evictions == 1
    assert s.step_extra_ms(["a", "b"]) == 10.0            # b evicts c, never a (in the batch)
    assert set(s.resident) == {"a", "b"}


def test_metrics_without_adapters_are_unchanged():
    srv = ModelServer(0, SPEC)
    srv.add(_req(0, 100, 2, "a"), 0.0)
    m = srv.metrics(0.0)
    assert (m.waiting_lora, m.max_lora) == (frozenset(), 0)


# ------------------------------------------------------------------------ lora-v1 tree
def _m(q=0, kv=0.0, running=(), waiting=(), max_lora=4):
    return Metrics(kv, q, 0, frozenset(running), 0.0, frozenset(waiting), max_lora)


def test_v1_critical_prefers_affinity_then_least_queue_then_least_kv():
    ms = [_m(q=0, kv=0.5, running={"x"}), _m(q=0, kv=0.1, running={"sql"}), _m(q=3, kv=0.0, running={"sql"}),
          _m(q=0, kv=0.2, waiting={"sql"})]
    # affinity: 1, 2, 3 (waiting counts as active in v1); least queue within (3-0)//3 = 1 -> 1, 3; least KV -> 1
    assert v1_candidates([0, 1, 2, 3], ms, "sql", True, 0.5) == [1]
    # the 0.1 % draw takes the servers with a free slot instead (only 0)
    assert v1_candidates([0, 1, 2, 3], ms, "sql", True, 0.9995) == [0]
    # all queues >= 128: least queue first (130 + 70 // 3 keeps 1, 2; the affinity server 0 is out),
    # then the free-slot servers 1, 2, then least KV (0.1 + 0.2 / 2 keeps 2)
    busy = [_m(q=200, running={"sql"}), _m(q=130, kv=0.3), _m(q=131, kv=0.1)]
    assert v1_candidates([0, 1, 2], busy, "sql", True, 0.5) == [2]


def test_v1_sheddable_needs_capacity_else_dropped():
    ms = [_m(q=6, kv=0.1), _m(q=5, kv=0.81), _m(q=5, kv=0.8)]
    assert v1_candidates([0, 1, 2], ms, "a", False, 0.5) == [2]
    assert v1_candidates([0, 1], ms, "a", False, 0.5) == []


# ------------------------------------------------------------------------ end to end
def test_policies_run_on_a_lora_scenario_and_history_tracks_dispatches():
    arrivals = W.synthetic_poisson(150, rate=4.0, seed=3, input_median=800, output_median=60)
    sc = Scenario("tiny-lora", "test", lambda seed: arrivals, _pool("llama3-8b-a100", 3),
                  lora=LoraSetup(LoraSpec(max_loras=2), zipf_adapters(6)))
    cap = W.capacity_rps(arrivals, sc.servers)
    out = {}
    for pol in ("lora-v1", "llmd-lora", "llmd-lora-history"):
        m, _, router = run_one(sc, arrivals, cap, 0.6, pol, RunOptions(seed=1))
        out[pol] = m
        assert m["adapter_loads"] >= 1 and m["shed"] == 0
        if pol == "llmd-lora-history":
            scorer = router.lifecycle.lifecycle_plugins[0]
            assert scorer.history.reconciles >= 1
            # every request completed: nothing is left counted
            assert all(not scorer.history.adapters(e.name) for e in router.endpoints)
    assert all(0 < m["slo_attainment"] <= 1 for m in out.values())


def test_seeds_aggregate_mean_and_std_and_cli_validation(capsys):
    from load.sim.seeds import aggregate, table
    from load.simulate_cli import main

    per_seed = {"0.5": {"p": [{"slo_attainment": 0.8, "ttft_p90_ms": 100.0, "note": "x"},
                              {"slo_attainment": 0.6, "ttft_p90_ms": float("nan"), "note": "y"}]}}
    agg = aggregate(per_seed)["0.5"]["p"]
    assert agg["slo_attainment"]["mean"] == pytest.approx(0.7)
    assert agg["slo_attainment"]["std"] == pytest.approx(0.1414, abs=1e-3)
    assert agg["ttft_p90_ms"] == {"mean": 100.0, "std": 0.0, "n": 1} and "note" not in agg
    assert "| p | 70.0 ± 14.1% |" in table({"p": agg})
    assert main(["--scenario", "multi-lora", "--seeds", "0"]) == 2
    assert "--seeds" in capsys.readouterr().err


_DETERMINISM = """
import json
from load.sim import workloads as W
from load.sim.adapters import LoraSpec
from load.sim.bench import RunOptions, run_one
from load.sim.lora_workloads import LoraSetup, zipf_adapters
from load.sim.scenarios import Scenario, _pool
arr = W.synthetic_poisson(300, rate=6.0, seed=2, input_median=600, output_median=40, system_prompt_share=0.0)
sc = Scenario("t", "t", lambda s: arr, _pool("llama3-8b-a100", 2),
              lora=LoraSetup(LoraSpec(max_loras=3), zipf_adapters(12, s=0.3)))
cap = W.capacity_rps(arr, sc.servers)
out = {p: run_one(sc, arr, cap, 1.2, p, RunOptions(seed=3))[0] for p in ("lora-v1", "llmd-lora", "llmd-lora-history")}
print(json.dumps(out, sort_keys=True, default=str))
"""


def test_lora_runs_identical_across_hash_seeds():
    """Adapter loads, evictions and the LoRA policies do not depend on set order (PYTHONHASHSEED)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    outs = []
    for hseed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hseed, "PYTHONPATH": str(repo)}
        r = subprocess.run([sys.executable, "-c", _DETERMINISM], cwd=repo, env=env, check=True, timeout=300,
                           capture_output=True, text=True)
        outs.append(json.loads(r.stdout))
    assert outs[0] == outs[1] and outs[0]["llmd-lora"]["adapter_loads"] > 0


def test_adapters_load_in_batch_order():
    srv = _server(max_loras=4, load_ms=1.0)
    for i, a in enumerate(("d", "a", "c", "b")):
        srv.add(_req(i, 100, 2, a), 0.0)
    assert srv.plan_step(0.0) > 0
    assert list(srv.adapters.resident) == ["d", "a", "c", "b"] and srv.adapters.loads == 4


def test_predicted_lora_history_is_the_recommended_profile_with_the_history_scorer():
    from epp_client.plugins import KVCacheUtilizationScorer, LatencyScorer, LoraAffinityScorer
    from epp_client.profiles import RECOMMENDED_CONFIG
    from load.sim.epp_routers import PREDICTED_CONFIGS, PREDICTED_LORA_HISTORY_CONFIG

    assert PREDICTED_CONFIGS["predicted-lora-history"][0] == PREDICTED_LORA_HISTORY_CONFIG
    (rec,) = build_scheduler(RECOMMENDED_CONFIG).profiles
    (prof,) = build_scheduler(PREDICTED_LORA_HISTORY_CONFIG).profiles
    kinds = {type(sc): w for sc, w in prof.scorers}
    assert kinds == {LatencyScorer: 1.0, LoraAffinityScorer: 0.75, KVCacheUtilizationScorer: 1.0}
    lora = next(sc for sc, _ in prof.scorers if isinstance(sc, LoraAffinityScorer))
    assert lora.request_history
    # the recommended profile itself has llm-d's metric-only scorer at the same weight
    assert {type(sc): w for sc, w in rec.scorers} == kinds
    assert not next(sc for sc, _ in rec.scorers if isinstance(sc, LoraAffinityScorer)).request_history
    # everything else is the recommended profile's
    assert [type(f) for f in prof.filters] == [type(f) for f in rec.filters]
    assert type(prof.picker) is type(rec.picker)
