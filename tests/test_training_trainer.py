"""Trainer on the recorded sharegpt-h200 entries: real XGBoost/LightGBM models, calibration,
fitted prior, E2E mode, the upstream recipe, bundles and in-process LoadedBundle."""

import numpy as np
import pytest

from features.bundle import read_bundle, validate_manifest, write_bundle
from features.loaded import LoadedBundle
from features.prior import LINKS
from features.schema import parse_training_entry
from features.scoring import evaluate_bundle, evaluate_predictions
from load.data import load_entries
from training_server import trainer
from training_server.trainer import TrainConfig, train_models


@pytest.fixture(scope="module")
def data():
    entries = [parse_training_entry(e) for e in load_entries()]
    raw = np.array([e.raw for e in entries])
    ttft = np.array([e.actual_ttft_ms for e in entries])
    tpot = np.array([e.actual_tpot_ms for e in entries])
    test = np.random.default_rng(3).random(len(raw)) < 0.15
    return raw, ttft, tpot, test


def test_evaluate_predictions_by_hand():
    r = evaluate_predictions(np.array([10.0, 20.0]), np.array([12.0, 15.0]), 0.9)
    # under-prediction of 5 costs 0.9*5, over-prediction of 2 costs 0.1*2
    assert r["pinball"] == pytest.approx((0.2 + 4.5) / 2)
    assert r["coverage"] == 50.0 and r["n"] == 2
    assert r["mape"] == pytest.approx((0.2 + 0.25) / 2 * 100)
    assert trainer.conformal_offset(np.arange(1.0, 101.0), 0.9) == 91.0
    # a near-zero actual (the fuzzer sends them) stays out of the MAPE instead of overflowing it
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = evaluate_predictions(np.array([10.0, 1e-310]), np.array([12.0, 1e300]), 0.9)
    assert r["mape"] == pytest.approx(20.0) and r["n"] == 2


def test_default_recipe_is_calibrated_and_bundles_roundtrip(data, tmp_path):
    raw, ttft, tpot, test = data
    result = train_models(raw[~test], ttft[~test], tpot[~test], config=TrainConfig(seed=1))
    assert set(result.models) == {"ttft", "tpot"} and result.mode == "streaming"
    assert result.n_train["ttft"] == int((ttft[~test] > 0).sum())
    for t in ("ttft", "tpot"):
        cal = result.calibration[t]
        assert cal["offset_ms"] == 0.0 and 0.5 < cal["scale"] < 3.0  # multiplicative conformal
        assert all(w >= 0 for w in result.prior[t]["coef"].values())  # non-negative quantile fit
        base = result.base[t]  # the prior is the base: same coefficients, plus the range seen
        assert base["coef"] == result.prior[t]["coef"] and base["link"] in LINKS
        assert set(base["upper"]) == set(base["coef"])
    bundle = trainer.loaded_bundle(result)
    scores = evaluate_bundle(bundle, raw[test], ttft[test], tpot[test])
    for t in ("ttft", "tpot"):
        assert 80.0 <= scores[t]["coverage"] <= 97.0, scores[t]
        assert "idle_lowkv" in scores[t]["by_regime"]
    # calibrated beats the uncalibrated model's coverage gap and the fitted prior beats nothing
    prior_only = LoadedBundle.builtin_prior()
    prior_scores = evaluate_bundle(prior_only, raw[test], ttft[test], tpot[test])
    assert scores["tpot"]["pinball"] < prior_scores["tpot"]["pinball"]
    # bundle on disk: verified, loadable, identical predictions
    manifest, files = trainer.build_bundle(result, "v000007-20261202T000000Z", metrics=scores)
    path = write_bundle(tmp_path, manifest.to_json(), files)
    m2, f2 = read_bundle(path)
    assert validate_manifest(m2)["models"]["ttft"]["format"] == "xgboost-ubj"
    assert m2["metrics"]["ttft"]["n"] == int((ttft[test] > 0).sum())
    again = LoadedBundle.from_files(m2, f2)
    for a, b in zip(again.predict(raw[test]), bundle.predict(raw[test])):
        np.testing.assert_allclose(a, b)


def test_upstream_recipe_uses_the_reference_hyper_parameters(data):
    raw, ttft, tpot, test = data
    import xgboost as xgb

    result = train_models(raw, ttft, tpot, config=TrainConfig(recipe="upstream"))
    assert result.calibration == {}
    booster = xgb.Booster()
    booster.load_model(bytearray(result.models["ttft"]))
    assert booster.num_boosted_rounds() == 200
    assert booster.feature_names == list(trainer.FEATURE_SETS["upstream"]["ttft"])
    # the parameters actually given to XGBoost (a loaded model does not keep them)
    params, rounds = trainer._xgb_params(TrainConfig(recipe="upstream"), booster.feature_names, "ttft")
    assert rounds == 200 and "monotone_constraints" not in params
    assert {k: params[k] for k in ("objective", "quantile_alpha", "max_depth", "learning_rate", "subsample",
                                   "colsample_bytree", "min_child_weight", "gamma", "reg_alpha", "reg_lambda",
                                   "tree_method", "nthread")} == {
        "objective": "reg:quantileerror", "quantile_alpha": 0.9, "max_depth": 6, "learning_rate": 0.05,
        "subsample": 0.8, "colsample_bytree": 0.8, "min_child_weight": 5, "gamma": 0.2, "reg_alpha": 0.01,
        "reg_lambda": 0.1, "tree_method": "hist", "nthread": 1}


def test_lightgbm_and_mean_objective(data):
    raw, ttft, tpot, test = data
    # trees for both targets (on this trace the TPOT base alone can win the selection)
    res = train_models(raw, ttft, tpot, config=TrainConfig(model_type="lightgbm", base_alone={}))
    manifest, files = trainer.build_bundle(res, "v000001-20261202T000000Z")
    assert manifest.models["tpot"].format == "lightgbm-text" and files["tpot.txt"].startswith(b"tree")
    b = LoadedBundle.from_files(manifest, files)
    assert b.model_kind == "lightgbm" and np.isfinite(b.predict(raw[:5])[0]).all()
    mean = train_models(raw, ttft, tpot, config=TrainConfig(objective="mean", params={"n_estimators": 30}))
    assert mean.calibration == {}  # conformal offsets are for quantile models


def test_e2e_data_trains_ttft_only(data):
    raw, ttft, tpot, _ = data
    m = ttft > 0
    result = train_models(raw[m], ttft[m], np.zeros(int(m.sum())), config=TrainConfig())
    assert set(result.models) == {"ttft"} and result.mode == "e2e"
    manifest, files = trainer.build_bundle(result, "v000001-20261202T000000Z")
    assert manifest.mode == "e2e" and set(manifest.models) == {"ttft"}
    b = LoadedBundle.from_files(manifest, files)
    assert b.has_model("ttft") and not b.has_model("tpot")


def test_too_few_rows_and_bad_targets():
    raw = np.zeros((10, 11))
    with pytest.raises(ValueError, match="no model"):
        trainer.build_bundle(train_models(raw, np.ones(10), np.zeros(10)), "v000001-20261202T000000Z")
    with pytest.raises(ValueError, match="finite"):
        train_models(raw, np.full(10, np.inf), np.zeros(10))


def test_training_stops_promptly_when_asked(data):
    raw, ttft, tpot, _ = data
    polls: list[int] = []

    def stop() -> bool:  # says "stop" from its 20th poll on
        polls.append(len(polls))
        return len(polls) >= 20

    with pytest.raises(trainer.TrainingStopped):
        train_models(raw, ttft, tpot, config=TrainConfig(params={"n_estimators": 100_000}), stop=stop)
    assert len(polls) <= 21  # it stopped at the first poll that said so, not after 100k rounds


def _linear_ramp(n: int = 2000, seed: int = 5):
    """Latency that is a linear function of queued work plus noise, load ramping up in time."""
    from features.schema import COL, RAW_COLUMNS

    rng = np.random.default_rng(seed)
    raw = np.zeros((n, len(RAW_COLUMNS)))
    raw[:, COL["num_request_waiting"]] = rng.poisson(1 + 20 * np.linspace(0, 1, n))
    raw[:, COL["num_request_running"]] = rng.integers(1, 30, n)
    raw[:, COL["kv_cache_percentage"]] = rng.uniform(0.1, 0.9, n)
    raw[:, COL["input_token_length"]] = rng.integers(100, 4000, n)
    raw[:, COL["num_tokens_generated"]] = rng.integers(1, 200, n)
    ttft = 40 + 0.2 * raw[:, COL["input_token_length"]] + 150 * raw[:, COL["num_request_waiting"]] \
        + rng.exponential(30, n)
    tpot = 15 + 0.5 * raw[:, COL["num_request_running"]] + rng.exponential(2, n)
    return raw, ttft, tpot


def test_the_base_alone_is_served_where_it_beats_the_trees_on_the_newest_rows(tmp_path):
    """Latency linear in queued work, load ramping: on the newest held-out rows the linear base
    alone beats trees over it, so both targets ship as base alone (no model file), calibrated,
    through the bundle on disk; without the option (or with a forced link) trees are kept."""
    from features.bundle import make_version
    from features.matrix import model_matrix

    raw, ttft, tpot = _linear_ramp()
    default = train_models(raw, ttft, tpot, config=TrainConfig(base_alone={}))  # off: trees answer (they can)
    assert set(default.models) == {"ttft", "tpot"} and default.targets == ("ttft", "tpot")
    # among the additive links (trees x base, link "ratio", ties the line on a line)
    additive = ("beyond", "add")
    res = train_models(raw, ttft, tpot, config=TrainConfig(base_alone={"ttft": True, "tpot": True},
                                                           auto_links={"ttft": additive, "tpot": additive}))
    assert res.models == {} and res.targets == ("ttft", "tpot")
    assert {t: b["link"] for t, b in res.base.items()} == {"ttft": "add", "tpot": "add"}
    assert set(res.calibration) == {"ttft", "tpot"}
    manifest, files = trainer.build_bundle(res, make_version(4))
    assert files == {} and manifest.learned_targets == ("ttft", "tpot") and manifest.mode == "streaming"
    served = LoadedBundle.from_files(*read_bundle(write_bundle(tmp_path, manifest.to_json(), files)))
    assert served.source == "learned" and served.has_model("ttft") and served.has_model("tpot")
    cal = res.calibration["ttft"]
    b = res.base["ttft"]
    names = manifest.feature_names("ttft")
    x = model_matrix(raw[-100:], "ttft", names)
    linear = b["intercept"] + sum(x[:, names.index(n)] * w for n, w in b["coef"].items())
    assert "by_regime" not in cal  # one factor: the prediction is the base times it
    np.testing.assert_allclose(served.predict(raw[-100:])[0], linear * cal["scale"] + cal["offset_ms"])
    # covered on the newest rows as calibrated, and rising with the queue
    assert 0.8 <= float((ttft[-400:] <= served.predict(raw[-400:])[0]).mean()) <= 1.0
    for cfg in (TrainConfig(base_alone={"ttft": False}), TrainConfig(base_link="add", base_alone={"ttft": True,
                                                                                                "tpot": True})):
        assert set(train_models(raw, ttft, tpot, config=cfg).models) == {"ttft", "tpot"}
