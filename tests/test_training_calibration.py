"""Calibration of quantile models: the split-conformal offset and scale specs (monotone across
load regimes), the live adaptive factor and its hand-over to a retrained model."""
from __future__ import annotations

import math

import numpy as np

from features.matrix import REGIME_NAMES
from training_server import calibration as cal


def test_conformal_offset_is_the_finite_sample_quantile_of_the_residuals():
    r = np.arange(1.0, 101.0)                           # 1 .. 100
    assert cal.conformal_offset(r, 0.9) == 91.0        # ceil(101 × 0.9) = 91st smallest
    assert cal.conformal_offset(r[::-1], 0.9) == 91.0  # order does not matter
    assert cal.conformal_offset(np.arange(1.0, 6.0), 0.9) == 5.0    # capped at the maximum
    w = np.where(r > 50, 1.0, 0.0)                     # only the upper half counts
    assert cal.conformal_offset(r, 0.5, w) > 75.0


def test_per_regime_offsets_never_decrease_towards_busier_regimes():
    rng = np.random.default_rng(1)
    regime = np.repeat(np.arange(4), 200)
    shift = np.array([50.0, 10.0, 0.0, 80.0])[regime]  # "queued" idles below "idle": must be raised
    spec = cal.conformal_spec("ttft", rng.normal(0.0, 1.0, 800) + shift, regime, 0.9)
    by = {name: spec["by_regime"][name]["offset_ms"] for name in REGIME_NAMES}
    v = [by[n] for n in REGIME_NAMES]
    assert v[1] >= v[0] and v[3] >= v[2] and v[2] >= v[0] and v[3] >= v[1]
    assert v[1] == v[0] and v[2] == v[0] > 45.0         # raised to the idle regime's offset
    assert spec["n_calibration"] == 800 and spec["scale"] == 1.0
    few = cal.conformal_spec("ttft", rng.normal(0.0, 1.0, 150), np.zeros(150, dtype=int), 0.9)
    assert "by_regime" not in few                       # one regime with its own rows: global only


def test_scale_spec_makes_held_out_coverage_the_quantile():
    rng = np.random.default_rng(2)
    pred = rng.uniform(50.0, 500.0, 2000)
    actual = pred * rng.uniform(0.8, 1.6, 2000)
    spec = cal.conformal_scale_spec("tpot", actual, pred, np.zeros(2000, dtype=int), 0.9)
    assert spec["offset_ms"] == 0.0 and 1.4 < spec["scale"] < 1.6
    assert abs(np.mean(actual <= pred * spec["scale"]) - 0.9) < 0.01


def test_aci_grows_an_under_covering_factor_bounded_per_call_and_overall():
    actual, predicted = np.full(100, 150.0), np.full(100, 100.0)     # every pair a miss
    lf = cal.aci_update(0.0, actual, predicted, 0.9, step=0.01)
    assert math.isclose(lf, 100 * 0.01 * 0.9)                          # each miss: step × (1 − (1 − q))
    assert cal.aci_update(0.0, actual, predicted, 0.9, step=0.01, max_move=0.2) == 0.2
    assert cal.aci_update(0.0, actual, predicted, 0.9, step=1.0) == math.log(cal.MAX_FACTOR)
    hits = cal.aci_update(0.0, predicted, actual, 0.9, step=0.01)       # every pair covered: shrinks
    assert hits < 0.0
    # judged with the factor of the moment: once the factor covers the misses, it stops growing
    levelled = cal.aci_update(0.0, actual, predicted, 0.9, step=0.05, levels=np.zeros(100))
    assert math.log(1.5) <= levelled < math.log(1.5) + 0.05


def test_level_factor_and_scale_spec_hand_a_correction_over():
    assert cal.level_factor(np.array([200.0, 300.0, 0.0]), np.array([100.0, 100.0, 5.0])) == 2.5
    assert cal.level_factor(np.array([0.0]), np.array([1.0])) == 1.0
    assert cal.level_factor(np.array([100.0]), np.array([1.0])) == cal.MAX_FACTOR
    spec = {"offset_ms": 10.0, "scale": 1.2, "by_regime": {"idle_lowkv": {"offset_ms": 4.0, "scale": 1.0}}}
    out = cal.scale_spec(spec, 2.0)
    assert (out["offset_ms"], out["scale"], out["live_factor"]) == (20.0, 2.4, 2.0)
    assert out["by_regime"] == {"idle_lowkv": {"offset_ms": 8.0, "scale": 2.0}}
    assert cal.scale_spec(out, 0.5)["live_factor"] == 1.0
    assert cal.scale_spec(None, 3.0) == {"offset_ms": 0.0, "scale": 3.0, "live_factor": 3.0}
