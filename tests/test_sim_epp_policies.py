"""llm-d policies in the simulated loop: epp_client's real plugins, online learning, traces."""
from __future__ import annotations

import json

import pytest

from features.schema import parse_training_entry
from load import simulate_cli
from load.sim import bench
from epp_client.plugins import InFlightTokenScorer
from load.sim.scenarios import get_scenario
from epp_client import Endpoint, InFlightLoad, InferenceRequest


def _run(policy, seed=0, limit=300, load=0.9, scenario="standard-small", **kw):
    sc = get_scenario(scenario)
    opts = bench.RunOptions(seed=seed, limit=limit, **kw)
    arr, cap = bench.prepare(sc, opts)
    m, _, router = bench.run_one(sc, arr, cap, load, policy, opts)
    return m


def test_inflight_token_scorer_prefers_least_tokens():
    eps = [Endpoint(name="a", inflight=InFlightLoad(tokens=100)), Endpoint(name="b", inflight=InFlightLoad(tokens=0)),
           Endpoint(name="c", inflight=InFlightLoad(tokens=50))]
    s = InFlightTokenScorer().score(InferenceRequest(), eps)
    assert s == {"a": 0.0, "b": 1.0, "c": 0.5}
    assert set(InFlightTokenScorer().score(InferenceRequest(), eps[:1]).values()) == {1.0}


def test_prefix_aware_llmd_policies_get_more_cache_hits_than_round_robin():
    rr = _run("round-robin", scenario="sessions", limit=400)
    for pol in ("llmd-default", "llmd-token-load"):
        m = _run(pol, scenario="sessions", limit=400)
        assert m["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.08, (pol, m["prefix_hit_rate"], rr["prefix_hit_rate"])
        assert m["completed"] == m["requests"]


@pytest.mark.parametrize("policy", ["llmd-default", "llmd-token-load"])
def test_llmd_policies_are_deterministic(policy):
    assert _run(policy, seed=4, limit=200) == _run(policy, seed=4, limit=200)


def test_record_trace_writes_wire_format_training_entries(tmp_path):
    trace = tmp_path / "t.jsonl"
    rc = simulate_cli.main(["--scenario", "sessions", "--limit", "200", "--policies", "llmd-default", "--load", "0.8",
                            "--record-trace", str(trace), "--quiet"])
    assert rc == 0
    lines = trace.read_text().splitlines()
    entries = [parse_training_entry(json.loads(line)) for line in lines]
    ttft = [e for e in entries if e.actual_ttft_ms > 0]
    tpot = [e for e in entries if e.actual_tpot_ms > 0]
    assert len(ttft) == 200 and 150 <= len(tpot) <= 200          # one TTFT (and TPOT) sample per request
    assert any(e.raw[5] > 0.5 for e in ttft)                       # prefix_cache_score seen on a prefix-heavy trace
    assert all(e.timestamp is not None for e in entries)


predicted_deps = pytest.importorskip  # alias for readability below


def test_predicted_policy_learns_online_and_routes_with_predictions():
    predicted_deps("training_server.worker")
    m = _run("predicted", limit=400, load=0.9, retrain_interval_s=20.0)
    assert m["predictions"] == 400 and m["prediction_failures"] == 0
    assert m["training_entries"] >= 700                   # TTFT + TPOT sample per request
    assert m["retrain_published"] >= 1                     # a learned model was served during the run
    assert m["served_version"] != "prior-default"
    assert m["first_learned_model_at_s"] is not None
    assert m["completed"] == m["requests"]
    # in-loop accuracy of the predictions made for the chosen endpoints; the sink scores positive
    # predictions only, and a model retrained early (the live correction saw a drift) on a few
    # hundred rows may predict 0 ms (clamped) for a handful of requests
    assert 392 <= m["ttft_pred_n"] <= 400 and 0.0 <= m["ttft_pred_coverage"] <= 1.0 and m["ttft_pred_mape"] > 0
    assert m["tpot_pred_n"] > 300


def test_epp_config_option_runs_a_user_config_and_rejects_a_bad_one(tmp_path, capsys):
    predicted_deps("training_server.worker")
    from pathlib import Path

    good = Path(__file__).resolve().parents[1] / "load" / "scenarios" / "predicted-most-headroom.yaml"
    out = tmp_path / "o"
    assert simulate_cli.main(["--scenario", "standard-small", "--limit", "120", "--policies", "predicted",
                              "--load", "0.8", "--epp-config", str(good), "--out", str(out), "--no-plots",
                              "--quiet"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["results"]["0.8"]["predicted"]["predictions"] == 120
    assert "--epp-config" in (out / "report.md").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("headroomSelectionStrategy", "headroomStrategyTypo"))
    assert simulate_cli.main(["--policies", "predicted", "--epp-config", str(bad)]) == 2
    assert "headroomStrategyTypo" in capsys.readouterr().err


def test_predicted_upstream_uses_the_upstream_recipe_and_is_deterministic():
    predicted_deps("training_server.worker")
    keys = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p90_ms", "slo_attainment", "prefix_hit_rate")
    a = _run("predicted-upstream", seed=2, limit=250, retrain_interval_s=20.0)
    b = _run("predicted-upstream", seed=2, limit=250, retrain_interval_s=20.0)
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert a["retrain_published"] >= 1


def test_predicted_policy_against_real_servers_on_loopback(tmp_path):
    """--predictor/--training-url mode: epp_client's PredictorClient and TrainingReporter
    talk to a real training server and a real prediction server (uvicorn on 127.0.0.1)."""
    predicted_deps("training_server.app")
    import httpx

    from prediction_server.app import create_app as prediction_app
    from prediction_server.settings import Settings as PSettings
    from training_server.app import create_app as training_app
    from training_server.settings import Settings as TSettings
    from support.servers import run_app

    tset = TSettings.from_env({}, data_dir=str(tmp_path / "train"), retraining_interval_sec=0.5,
                              min_samples_for_retrain=50)
    with run_app(training_app(tset)) as turl:
        pset = PSettings.from_env({}, training_server_url=turl, sync_interval_sec=0.5)
        with run_app(prediction_app(pset)) as purl:
            m = _run("predicted", limit=150, load=0.8, predictor_url=purl, training_url=turl)
            assert m["completed"] == 150
            assert m["predictions"] + m["prediction_failures"] == 150
            assert m["predictions"] >= 140          # the 50 ms deadline may rarely fall back on a busy machine
            status = httpx.get(f"{turl}/data/status", timeout=10).json()
            # the reporter flushed every TTFT and TPOT sample on close
            assert status["rows_with_target"]["ttft"] == 150
            assert status["rows_with_target"]["tpot"] >= 120
