"""The forward calibration of training_server.target_fit: the drift step (a conformal factor that
grew across the newest calibration rows is carried forward to the rows the served model answers
next; steady or falling factors are left alone), TPOT's pooled calibration rows, and candidates
whose calibration no manifest accepts."""
from __future__ import annotations

import numpy as np

from features.schema import COL
from test_training_trainer import _linear_ramp
from training_server import target_fit
from training_server.calibration import conformal_offset
from training_server.trainer import TrainConfig, loaded_bundle, train_models


def test_drift_factor_rises_only_when_the_newer_half_needs_more():
    rng = np.random.default_rng(0)
    pred = np.full(400, 100.0)
    ratio = rng.uniform(0.5, 1.0, 400)
    old, new = ratio[:200], ratio[200:] * 1.5       # the newer half misses by 1.5x more
    grown = np.concatenate([old, new])
    k = target_fit.drift_factor(grown * pred, pred, 0.9, 0.5)
    expected = (conformal_offset(new, 0.9) / conformal_offset(old, 0.9)) ** 0.5
    assert k > 1.1 and np.isclose(k, expected)
    assert np.isclose(target_fit.drift_factor(grown * pred, pred, 0.9, 1.0), expected ** 2)
    # steady (the same errors in both halves), shrinking, switched off, too few rows: no step
    same = np.concatenate([old, old])
    assert target_fit.drift_factor(same * pred, pred, 0.9, 0.5) == 1.0
    assert target_fit.drift_factor(grown[::-1] * pred, pred, 0.9, 0.5) == 1.0
    assert target_fit.drift_factor(grown * pred, pred, 0.9, 0.0) == 1.0
    assert target_fit.drift_factor(np.array([2.0]), np.array([1.0]), 0.9, 0.5) == 1.0


def test_servers_slowing_down_past_the_calibration_rows_are_covered_closer_to_the_quantile(monkeypatch):
    """TTFT grows with a slowdown the features do not show (1x -> 2.2x over the rows). Trained on
    the first 1,500 rows, the model answers the next 300; with the drift step its TTFT factor is
    larger and its coverage there closer to 90% (here 9% -> 24%: the slowdown outruns any
    calibration, the step only follows it part of the way)."""
    n, ahead = 1500, 300
    raw, ttft, tpot = _linear_ramp(n + ahead, seed=11)
    ttft = ttft * np.linspace(1.0, 2.2, n + ahead)
    # calibrated on the newest 20% of the rows, over which the slowdown grows by 5% half to half
    cfg = TrainConfig(auto_links={"ttft": ("add",), "tpot": ("add",)}, calibration_share={"ttft": 0.2, "tpot": 0.2})
    cover = {}
    scale = {}
    for exponent in (0.0, 0.5):
        monkeypatch.setitem(target_fit.DRIFT_EXPONENT, "ttft", exponent)
        res = train_models(raw[:n], ttft[:n], tpot[:n], config=cfg)
        pred = loaded_bundle(res).predict(raw[n:])[0]
        cover[exponent] = float(np.mean(ttft[n:] <= pred))
        scale[exponent] = res.calibration["ttft"]["scale"]
    assert scale[0.5] > scale[0.0] * 1.02
    assert cover[0.0] < cover[0.5] <= 1.0
    assert abs(cover[0.5] - 0.9) < abs(cover[0.0] - 0.9)


def test_a_collapsed_tree_candidate_never_ships_a_calibration_no_manifest_accepts():
    """Trees answering ~0 ms on the calibration rows need a conformal factor in the millions,
    which no manifest accepts (seen in the simulator: scale 6.5e6, a failed retrain cycle).
    Such a candidate is not eligible: the base alone stands in, and the bundle loads."""
    from features.bundle import SCALE_RANGE, make_version
    from features.matrix import FEATURES, model_matrix
    from training_server.trainer import fit_prior

    raw, ttft, _ = _linear_ramp()
    names = tuple(FEATURES["ttft"])
    # the links where the trees' output is the answer within the range seen (``add`` would
    # answer with the base plus ~0, which is fine)
    cfg = TrainConfig(auto_links={"ttft": ("beyond", "ratio"), "tpot": ("add", "ratio")})

    def collapsed(x, y, w, scale):  # failure injection: a model that answers 1 microsecond
        return b"", lambda xs: np.full(len(xs), 1e-6)

    prior = fit_prior(raw, ttft, "ttft", cfg.quantile)

    def fit_base(r, y, w):
        return fit_prior(r, y, "ttft", cfg.quantile, weights=w)

    model, base, calib = target_fit.fit_target(cfg, collapsed, raw, model_matrix(raw, "ttft", names), ttft, None,
                                               names, "ttft", prior, fit_base)
    assert model is None and base is not None and base["link"] == "add"  # the base alone
    assert SCALE_RANGE[0] <= calib["scale"] <= SCALE_RANGE[1]
    # without the range check the collapsed trees' factor would have been far out of range
    assert conformal_offset(ttft[-400:] / 1e-6, cfg.quantile) > SCALE_RANGE[1]
    res = train_models(raw, ttft, ttft * 0, config=TrainConfig())  # the real path still trains and loads
    assert loaded_bundle(res, make_version(1)).has_model("ttft")


def test_tpot_margin_pools_a_calm_newest_stretch_with_a_random_share():
    """TPOT whose noise calms down over the newest 20% of the training rows. The newest rows'
    factor alone is too small if the noise comes back (here 78% coverage), a random share's alone
    (mostly noisy rows) over-covers while it stays calm (97%); TPOT's default ("pooled") takes the
    factor over both shares together, between the two (85% and 95%), and never less than the
    newest rows' factor (a noisy newest stretch keeps its own)."""
    n, ahead = 2000, 400
    raw, _, _ = _linear_ramp(n + ahead, seed=13)
    rng = np.random.default_rng(13)
    level = 15 + 0.5 * raw[:, COL["num_request_running"]]
    calm = np.zeros(n + ahead, dtype=bool)
    calm[int(0.8 * n):] = True  # the newest 20% of the training rows and what follows
    noise = np.where(calm, rng.exponential(0.15, n + ahead), rng.exponential(0.25, n + ahead))
    tpot = level * (1.0 + noise)
    noisy_again = level * (1.0 + rng.exponential(0.25, n + ahead))
    scale, cover_calm, cover_noisy = {}, {}, {}
    for rows in ("newest", "pooled", "both"):
        cfg = TrainConfig(calibration_rows={"ttft": "newest", "tpot": rows})
        res = train_models(raw[:n], np.zeros(n), tpot[:n], config=cfg)
        pred = loaded_bundle(res).predict(raw[n:])[1]
        scale[rows] = res.calibration["tpot"]["scale"]
        cover_calm[rows] = float(np.mean(tpot[n:] <= pred))
        cover_noisy[rows] = float(np.mean(noisy_again[n:] <= pred))
    assert scale["newest"] < scale["pooled"] < scale["both"]
    assert cover_noisy["newest"] < cover_noisy["pooled"] - 0.05     # the lull does not set the margin alone
    assert abs(cover_calm["pooled"] - 0.9) < abs(cover_calm["both"] - 0.9) - 0.01  # nor the noisy random share
    # a noisy newest stretch (calm before it): its own factor is kept, pooled or not
    flipped = level * (1.0 + np.where(calm, rng.exponential(0.25, n + ahead), rng.exponential(0.15, n + ahead)))
    kept = {rows: train_models(raw[:n], np.zeros(n), flipped[:n], config=TrainConfig(
        calibration_rows={"ttft": "newest", "tpot": rows})).calibration["tpot"]["scale"]
        for rows in ("newest", "pooled")}
    assert kept["pooled"] == kept["newest"]
    assert TrainConfig().calibration_rows == {"ttft": "newest", "tpot": "pooled"}  # what the server trains


def test_an_unknown_calibration_rows_value_is_refused_not_read_as_newest():
    import pytest

    with pytest.raises(ValueError, match="calibration_rows"):
        TrainConfig(calibration_rows={"ttft": "newest", "tpot": "random"})
    assert TrainConfig(calibration_rows={"ttft": "both", "tpot": "newest"}).calibration_rows["ttft"] == "both"


def test_each_target_holds_out_its_own_newest_share_for_calibration():
    """TTFT is calibrated on the newest 15% of its rows and fitted on the rest; TPOT on 20%
    (docs/forward-accuracy.md); a share given for one target only, or outside (0, 0.9), is refused."""
    import pytest

    n = 1000
    raw, ttft, tpot = _linear_ramp(n, seed=5)
    assert TrainConfig().calibration_share == {"ttft": 0.15, "tpot": 0.2}
    for share in (0.15, 0.3):
        cfg = TrainConfig(calibration_share={"ttft": share, "tpot": 0.2})
        res = train_models(raw, ttft, tpot * 0, config=cfg)
        assert res.calibration["ttft"]["n_calibration"] == round(share * n)
    for bad in ({"ttft": 0.15}, {"ttft": 0.0, "tpot": 0.2}, {"ttft": 0.15, "tpot": 0.95}):
        with pytest.raises(ValueError, match="calibration_share"):
            TrainConfig(calibration_share=bad)
