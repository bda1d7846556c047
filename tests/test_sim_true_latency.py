"""``simulate --true-latencies``: the predicted policies decide on the simulator's true latencies."""
from __future__ import annotations

import json

import pytest

from epp_client.profiles import RECOMMENDED_CONFIG
from load import simulate_cli
from load.sim import bench
from load.sim.scenarios import get_scenario
from load.sim.true_latency import TrueLatencyPredictor

#: the recommended profile without holds: one prediction per request (a held request is scheduled,
#: and with true latencies simulated forward on every candidate, again every 50 ms)
NO_HOLDS = RECOMMENDED_CONFIG.replace("    holdSlackMs: 300\n", "    holdSlackMs: 0\n")


def _run(true_latencies: bool, limit: int = 150):
    sc = get_scenario("standard-small")
    assert NO_HOLDS != RECOMMENDED_CONFIG
    opts = bench.RunOptions(seed=0, limit=limit, true_latencies=true_latencies, epp_config=NO_HOLDS)
    arr, cap = bench.prepare(sc, opts)
    return bench.run_one(sc, arr, cap, 1.0, "predicted", opts)


def test_every_decision_is_answered_from_the_simulation():
    m, _, router = _run(True)
    predictor = router.lifecycle.producer.predictor
    assert isinstance(predictor, TrueLatencyPredictor)
    assert predictor.calls == m["predictions"] == 150 and m["prediction_failures"] == 0
    assert "first_learned_model_at_s" not in m          # no models trained or asked
    # the answer for the chosen endpoint is its TTFT: only arrivals after the decision (which the probe
    # cannot know) move the actual away from it, by about 2% here; the learned p90 models are off by > 100%
    learned, _, _ = _run(False)
    assert m["ttft_pred_mape"] < 0.05 < learned["ttft_pred_mape"]


def test_rows_must_be_the_whole_pool_of_a_bound_router():
    p = TrueLatencyPredictor()
    with pytest.raises(RuntimeError, match="outside a scheduling decision"):
        p.predict_bulk([{}])
    _, _, router = _run(True, limit=5)
    p.bind(router)
    router.current = object()     # a decision in progress (the row count is checked before the request is used)
    with pytest.raises(RuntimeError, match="rows for a pool of 4 servers"):
        p.predict_bulk([{}, {}])


def test_cli_records_true_latencies_in_the_results(tmp_path):
    out = tmp_path / "o"
    rc = simulate_cli.main(["--scenario", "standard-small", "--policies", "predicted", "--true-latencies",
                            "--limit", "30", "--load", "0.5", "--out", str(out), "--quiet", "--no-plots"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["true_latencies"] is True
    assert "true latencies" in res["meta"]["policy_notes"]["predicted"]
    r = res["results"]["0.5"]["predicted"]
    assert r["predictions"] == 30 + r.get("holds", 0)        # a held request is predicted again


def test_cli_rejects_true_latencies_without_a_predicted_policy_or_with_servers(capsys):
    rc = simulate_cli.main(["--scenario", "standard-small", "--policies", "random", "--true-latencies",
                            "--limit", "10", "--quiet"])
    assert rc == 2 and "--true-latencies needs a predicted policy" in capsys.readouterr().err
    rc = simulate_cli.main(["--scenario", "standard-small", "--policies", "predicted", "--true-latencies",
                            "--predictor", "http://127.0.0.1:1", "--training-url", "http://127.0.0.1:2",
                            "--limit", "10", "--quiet"])
    assert rc == 2 and "does not go with --predictor" in capsys.readouterr().err
