"""``latency-predictor evaluate``: the §1 protocol on a real trace, JSON shape, plots, bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest

from features.matrix import REGIME_NAMES
from latency_cli.main import main as cli_main
from training_server import evaluate

from conftest import SHAREGPT, load_jsonl


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    p = tmp_path_factory.mktemp("traces") / "sharegpt-part.jsonl"
    rows = load_jsonl(SHAREGPT, limit=600)
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p, rows


@pytest.mark.parametrize("protocol", ["forward", "random"])
def test_json_output_has_the_issue_format(small_trace, tmp_path, capsys, protocol):
    path, rows = small_trace
    plots = tmp_path / "plots"
    rc = cli_main(["evaluate", str(path), "--protocol", protocol, "--seeds", "2", "--json", "--plots", str(plots)])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["protocol"] == protocol
    assert set(doc) == {"protocol", "traces"} and set(doc["traces"]) == {"sharegpt-part"}
    per = doc["traces"]["sharegpt-part"]
    assert set(per) == {"ttft", "tpot"}
    for t, key in (("ttft", "actual_ttft_ms"), ("tpot", "actual_tpot_ms")):
        r = per[t]
        assert set(r) == {"n", "pinball", "pinball_std", "coverage", "coverage_by_regime", "n_by_regime", "mape",
                          "reference", "baselines"}
        assert r["n"] == sum(1 for row in rows if row[key] > 0)
        assert r["pinball"] > 0 and r["pinball_std"] >= 0
        assert 0 <= r["coverage"] <= 100 and set(r["coverage_by_regime"]) <= set(REGIME_NAMES)
        assert set(r["n_by_regime"]) == set(r["coverage_by_regime"]) and all(k > 0 for k in r["n_by_regime"].values())
        scored = sum(int(sum(rows[i][key] > 0 for i in np.flatnonzero(test)))
                     for _, _, test in evaluate.folds(len(rows), protocol, 2))
        assert sum(r["n_by_regime"].values()) == scored  # every scored row, in exactly one regime
        assert set(r["baselines"]) == {"upstream", "linear"}
        for b in r["baselines"].values():
            assert set(b) == {"pinball", "coverage"} and b["pinball"] > 0 and 0 <= b["coverage"] <= 100
        assert r["reference"] == r["baselines"]["upstream"]
        for kind in ("calibration", "reliability"):
            png = plots / f"sharegpt-part-{t}-{kind}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_forward_folds_train_on_the_past_blocks_and_predict_the_next():
    f = evaluate.folds(1003, "forward")
    assert [k for k, _, _ in f] == list(range(2, 10))
    for k, train, test in f:
        lo, hi = k * 1003 // 10, (k + 1) * 1003 // 10
        assert np.flatnonzero(train).tolist() == list(range(lo))
        assert np.flatnonzero(test).tolist() == list(range(lo, hi))
    r = evaluate.folds(1000, "random", seeds=3)
    assert len(r) == 3 and all(te.sum() == 100 and not (tr & te).any() and (tr | te).all() for _, tr, te in r)


def test_forward_scores_are_the_mean_over_the_eight_folds(small_trace):
    """The reported figures are the mean over folds of the served bundle's pinball/coverage
    on the rows of block k whose target is > 0."""
    path, _ = small_trace
    tr = evaluate.read_trace(path)
    res = evaluate.evaluate_trace(tr, reference=False, keep_predictions=True)
    pins, covs, n = [], [], 0
    pred, act = res["ttft"]["_pred"], res["ttft"]["_actual"]
    for _, _, test in evaluate.folds(len(tr), "forward"):
        y = tr.ttft[test]
        k = int((y > 0).sum())
        p, a = pred[n:n + k], act[n:n + k]
        np.testing.assert_array_equal(a, y[y > 0])
        d = a - p
        pins.append(np.mean(np.maximum(0.9 * d, -0.1 * d)))
        covs.append(np.mean(a <= p) * 100)
        n += k
    assert n == len(act)
    assert res["ttft"]["pinball"] == pytest.approx(np.mean(pins))
    assert res["ttft"]["coverage"] == pytest.approx(np.mean(covs))
    assert "reference" not in res["ttft"] and "baselines" not in res["ttft"]


def test_table_says_whether_the_target_is_met():
    from training_server.evaluate_report import format_table

    row = {"n": 10, "pinball": 8.0, "pinball_std": 1.0, "coverage": 90.5, "mape": 5.0,
           "coverage_by_regime": {"idle_lowkv": 90.5},
           "baselines": {"upstream": {"pinball": 20.0, "coverage": 80.0}, "linear": {"pinball": 10.0, "coverage": 91.0}}}
    miss = dict(row, coverage=85.0)
    lines = format_table({"a": {"ttft": row}, "b": {"ttft": miss}}, 0.9).splitlines()
    assert " met " in lines[1] and "0.800" in lines[1]
    assert "MISS" in lines[2]


def test_random_protocol_scores_match_a_direct_computation(small_trace):
    """The reported figures are the pinball/coverage of the served bundle on the 10% splits."""
    path, _ = small_trace
    tr = evaluate.read_trace(path)
    res = evaluate.evaluate_trace(tr, seeds=1, reference=False, keep_predictions=True, protocol="random")
    test = evaluate.split(len(tr), 0)
    y = tr.ttft[test]
    assert len(res["ttft"]["_actual"]) == int((y > 0).sum())
    pred, act = res["ttft"]["_pred"], res["ttft"]["_actual"]
    d = act - pred
    assert res["ttft"]["pinball"] == pytest.approx(np.mean(np.maximum(0.9 * d, -0.1 * d)))
    assert res["ttft"]["coverage"] == pytest.approx(np.mean(act <= pred) * 100)


def test_absent_target_is_omitted(small_trace, tmp_path, capsys):
    _, rows = small_trace
    p = tmp_path / "ttft-only.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows if r["actual_ttft_ms"] > 0))
    assert cli_main(["evaluate", str(p), "--protocol", "random", "--seeds", "1", "--json"]) == 0
    per = json.loads(capsys.readouterr().out)["traces"]["ttft-only"]
    assert set(per) == {"ttft"}


@pytest.mark.parametrize("line, needle", [
    ('{"kv_cache_percentage": 2.0}', "kv_cache_percentage"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
])
def test_malformed_line_fails_clearly(small_trace, tmp_path, capsys, line, needle):
    _, rows = small_trace
    p = tmp_path / "bad.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows[:5]) + line + "\n")
    assert cli_main(["evaluate", str(p), "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{p}:6" in err and needle in err


def test_params_and_ablation_reach_our_recipe_only(small_trace, monkeypatch, capsys):
    path, _ = small_trace
    seen = []
    real = evaluate.evaluate_trace

    def spy(trace, **kw):
        seen.append(kw["config"])
        return real(trace, **kw)

    monkeypatch.setattr(evaluate, "evaluate_trace", spy)
    assert cli_main(["evaluate", str(path), "--seeds", "1", "--json", "--param", "max_depth=3",
                     "--param", "learning_rate=0.2", "--no-monotone"]) == 0
    cfg = seen[-1]
    assert cfg.params == {"max_depth": 3, "learning_rate": 0.2} and cfg.monotone is False
    assert json.loads(capsys.readouterr().out)["traces"]["sharegpt-part"]["ttft"]["reference"]


@pytest.mark.parametrize("bad, message", [
    ("max_depth", "--param 'max_depth': expected NAME=VALUE"),
    ("=3", "--param '=3': expected NAME=VALUE"),
    ("max_depth=", "--param 'max_depth=': expected NAME=VALUE"),
    # a typo names the parameter and the known ones, instead of being ignored
    ("maxdepth=6", "--param maxdepth: unknown hyper-parameter; known: colsample_bytree, gamma, learning_rate, "
                   "max_bin, max_depth, min_child_weight, n_estimators, reg_alpha, reg_lambda, subsample, tree_method"),
    ("max_depth=abc", "--param max_depth=abc: must be an integer (the recipe uses 4)"),
    ("learning_rate=fast", "--param learning_rate=fast: must be a number (the recipe uses 0.1)"),
])
def test_bad_param_is_one_line_naming_it(small_trace, capsys, bad, message):
    path, _ = small_trace
    assert cli_main(["evaluate", str(path), "--model-type", "xgboost", "--param", bad]) == 2
    assert capsys.readouterr().err == f"latency-predictor evaluate: {message}\n"


def test_a_param_the_model_library_refuses_is_one_line(small_trace, capsys):
    path, _ = small_trace
    assert cli_main(["evaluate", str(path), "--model-type", "xgboost", "--seeds", "1", "--protocol", "random",
                     "--param", "max_depth=-1"]) == 2
    assert capsys.readouterr().err == ("latency-predictor evaluate: xgboost refused --param max_depth=-1: "
                                       "value -1 for Parameter max_depth should be greater equal to 0\n")
