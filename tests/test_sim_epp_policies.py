"""llm-d policies in the simulated loop: epp_client's real plugins, online learning, traces."""
from __future__ import annotations

import json

import pytest

from epp_client import Endpoint, InferenceRequest, InFlightLoad
from epp_client.plugins import InFlightTokenScorer
from features.schema import parse_training_entry
from load import simulate_cli
from load.sim import bench
from load.sim.scenarios import get_scenario


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
        # under the realism defaults the index hashes the blocks of the gateway's prompt estimate (fewer when it
        # undercounts) and reads late scrapes: a smaller lead than in the idealised world, still a lead
        assert m["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.05, (pol, m["prefix_hit_rate"], rr["prefix_hit_rate"])
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
    # one prediction per scheduling: each request's, and each time a held request was scheduled again
    assert m["holds"] > 0 and m["predictions"] == 400 + m["holds"] and m["prediction_failures"] == 0
    assert m["training_entries"] >= 700                   # TTFT + TPOT sample per request
    assert m["retrain_published"] >= 1                     # a learned model was served during the run
    assert m["served_version"] != "prior-default"
    assert m["first_learned_model_at_s"] is not None
    # every request completed, abandoned at its client's deadline or refused (the filter's maxTtftMs)
    assert m["completed"] + m["abandoned"] + m["shed"] == m["requests"] and m["completed"] >= 0.9 * m["requests"]
    # in-loop accuracy of the predictions made for the chosen endpoints; the sink scores positive
    # predictions only, and a model retrained early (the live correction saw a drift) on a few
    # hundred rows may predict 0 ms (clamped) for a handful of requests
    assert m["completed"] - 8 <= m["ttft_pred_n"] <= 400
    assert 0.0 <= m["ttft_pred_coverage"] <= 1.0 and m["ttft_pred_mape"] > 0
    assert m["tpot_pred_n"] > 300


def test_epp_config_option_runs_a_user_config_and_rejects_a_bad_one(tmp_path, capsys):
    predicted_deps("training_server.worker")
    from epp_client.profiles import RECOMMENDED_CONFIG

    good = tmp_path / "mine.yaml"
    good.write_text(RECOMMENDED_CONFIG)
    out = tmp_path / "o"
    assert simulate_cli.main(["--scenario", "standard-small", "--limit", "120", "--policies", "predicted",
                              "--load", "0.8", "--epp-config", str(good), "--out", str(out), "--no-plots",
                              "--quiet"]) == 0
    res = json.loads((out / "results.json").read_text())
    r = res["results"]["0.8"]["predicted"]
    assert r["predictions"] == 120 + r.get("holds", 0)      # one per scheduling, held requests' again too
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

    from epp_client.profiles import PREDICTED_LATENCY_SLO_CONFIG
    from prediction_server.app import create_app as prediction_app
    from prediction_server.settings import Settings as PSettings
    from support.servers import run_app
    from training_server.app import create_app as training_app
    from training_server.settings import Settings as TSettings

    tset = TSettings.from_env({}, data_dir=str(tmp_path / "train"), retraining_interval_sec=0.5,
                              min_samples_for_retrain=50)
    with run_app(training_app(tset)) as turl:
        pset = PSettings.from_env({}, training_server_url=turl, sync_interval_sec=0.5)
        with run_app(prediction_app(pset)) as purl:
            # llm-d's wiring: the recommended profile holds requests, each hold a prediction call more
            m = _run("predicted", limit=150, load=0.8, predictor_url=purl, training_url=turl,
                     epp_config=PREDICTED_LATENCY_SLO_CONFIG)
            assert m["completed"] == 150
            assert m["predictions"] + m["prediction_failures"] == 150
            assert m["predictions"] >= 140          # the 50 ms deadline may rarely fall back on a busy machine
            status = httpx.get(f"{turl}/data/status", timeout=10).json()
            # the reporter flushed every TTFT and TPOT sample on close
            assert status["rows_with_target"]["ttft"] == 150
            assert status["rows_with_target"]["tpot"] >= 120


# -- predicted = the recommended profile, predicted-llmd = llm-d's; per-request opt-in ---------------------------
KEYS = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p90_ms", "slo_attainment", "prefix_hit_rate", "completed")


def _same(a: dict, b: dict) -> dict:
    return {k: (a[k], b[k]) for k in KEYS if a[k] != b[k]}


def test_predicted_runs_the_recommended_profile_and_predicted_llmd_the_llmd_config():
    from epp_client.profiles import PREDICTED_LATENCY_SLO_CONFIG, RECOMMENDED_CONFIG
    from load.sim import epp_routers

    assert epp_routers.PREDICTED_CONFIGS["predicted"][0] == RECOMMENDED_CONFIG
    assert epp_routers.PREDICTED_CONFIGS["predicted-llmd"][0] == PREDICTED_LATENCY_SLO_CONFIG
    assert epp_routers.PREDICTED_CONFIGS["predicted-upstream"][0] == PREDICTED_LATENCY_SLO_CONFIG
    for policy, picker in (("predicted", "MaxScorePicker"), ("predicted-llmd", "WeightedRandomPicker")):
        router = bench.make_router(policy, bench.RunOptions(), 4)
        sched = router._factory(router.rng, lambda: 0.0, lambda: 0.0)
        assert type(sched.profiles[0].picker).__name__ == picker
        router.close()
    assert "predicted-llmd" in bench.known_policies()


def test_opt_in_share_0_is_the_heuristic_and_share_1_the_predicted_policy(tmp_path):
    predicted_deps("training_server.worker")
    from epp_client.plugins.handler.opt_in import with_opt_in
    from epp_client.profiles import RECOMMENDED_CONFIG

    kw = {"limit": 150, "load": 0.8, "retrain_interval_s": 20.0}
    # the profile's prefix index sized as the simulator's llm-d policies size theirs (fixed), the
    # heuristic requests are routed exactly as llmd-default routes them
    fixed = with_opt_in(RECOMMENDED_CONFIG.replace("- type: approx-prefix-cache-producer\n",
                                                   "- type: approx-prefix-cache-producer\n  parameters:\n"
                                                   "    autoTune: false\n    maxPrefixBlocksToMatch: 2147483647\n"))
    none = _run("predicted", opt_in_share=0.0, epp_config=fixed, **kw)
    assert _same(none, _run("llmd-default", **kw)) == {}
    assert (none["routed_predicted"], none["routed_warm_up"], none["routed_heuristic"]) == (0, 0, 150)
    # share 1 without the warm-up rule routes every request as the plain policy does
    always = with_opt_in(RECOMMENDED_CONFIG, heuristic_while_warming_up=False)
    every = _run("predicted", opt_in_share=1.0, epp_config=always, **kw)
    assert _same(every, _run("predicted", **kw)) == {}
    assert every["routed_predicted"] + every["shed"] == 150     # a request refused past maxTtftMs is not routed
    # with it (the default), the first requests take the heuristic until a learned model answers
    warm = _run("predicted", opt_in_share=1.0, **kw)
    assert warm["routed_heuristic"] == 0 and warm["routed_warm_up"] > 0 and warm["routed_predicted"] > 0
    assert warm["routed_warm_up"] + warm["routed_predicted"] == 150


def test_opt_in_share_draws_a_fixed_growing_set_per_seed():
    from load.sim.driver import opt_in_draw

    draws = [opt_in_draw(0, rid) for rid in range(2000)]
    assert draws == [opt_in_draw(0, rid) for rid in range(2000)]
    assert 0.45 < sum(d < 0.5 for d in draws) / 2000 < 0.55
    assert draws != [opt_in_draw(1, rid) for rid in range(2000)]
    m = _run("predicted-llmd", seed=3, limit=200, opt_in_share=0.5, retrain_interval_s=20.0)
    opted = sum(opt_in_draw(3, rid) < 0.5 for rid in range(200))
    assert m["routed_predicted"] + m["routed_warm_up"] == opted and m["routed_heuristic"] == 200 - opted


def test_opt_in_share_option_is_validated_and_reported(tmp_path, capsys):
    predicted_deps("training_server.worker")
    assert simulate_cli.main(["--policies", "predicted", "--opt-in-share", "1.5"]) == 2
    assert "--opt-in-share: must be in [0, 1]" in capsys.readouterr().err
    assert simulate_cli.main(["--policies", "llmd-default", "--opt-in-share", "0.5"]) == 2
    assert "needs a predicted policy" in capsys.readouterr().err
    out = tmp_path / "o"
    assert simulate_cli.main(["--scenario", "standard-small", "--limit", "60", "--policies", "llmd-default,predicted",
                              "--load", "0.8", "--opt-in-share", "0.5", "--workers", "1", "--out", str(out),
                              "--no-plots", "--quiet"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["opt_in_share"] == 0.5
    assert "routed_heuristic" in res["results"]["0.8"]["predicted"]
    assert "routed_heuristic" not in res["results"]["0.8"]["llmd-default"]
    assert "x-prediction-based-scheduling" in res["meta"]["policy_notes"]["predicted"]
