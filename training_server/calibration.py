"""Calibration of quantile models: split-conformal at training time, live recalibration after.

A calibration spec (per target, carried in the bundle manifest under ``calibration`` and
applied by :class:`features.loaded.LoadedBundle`) maps a raw model output ``y`` to
``y * scale + offset_ms``, optionally per load regime (``by_regime``: queue empty/queued ×
KV below/above 80%, :data:`features.matrix.REGIME_NAMES`); a regime without its own entry
uses the global values.

* :func:`conformal_scale_spec` (the trainer's default): the same with ratios actual /
  prediction, a multiplicative factor (the correction grows with the level).
* :func:`conformal_spec`: from held-out residuals of a model fitted without the calibration
  rows, the additive offset that makes coverage equal the quantile (finite-sample level),
  globally and per regime with enough rows. Per-regime values are then made *monotone* in
  the regime lattice along the directions the target's physics constrains (TTFT: queued >=
  idle and high KV >= low KV; TPOT: high KV >= low KV), so crossing a regime boundary never
  lowers a prediction (routing must never prefer a busier endpoint).
* :func:`aci_update`: online adaptive correction (adaptive conformal inference). From live
  (actual, predicted) pairs, a multiplicative factor ``s`` that moves until live coverage
  equals the quantile; :func:`scale_spec` makes the new spec ``s`` × the old one (scale and
  offsets alike, so the map stays increasing and monotone across regimes). A step change
  in server speed (all latencies ×1.5) is corrected by the factor, without retraining.
* :func:`level_factor`: the factor that hands a drift correction over to a retrained model
  (same level as the served, corrected model on recent traffic).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from features.matrix import REGIME_NAMES

#: A regime gets its own calibration offset only with at least this many calibration rows.
MIN_REGIME_CAL_ROWS = 100
#: regime index pairs (lower, higher) that must keep lower <= higher, per target
#: (index = queued + 2 * high_kv, see features.matrix.regimes)
_ORDER = {
    "ttft": ((0, 1), (2, 3), (0, 2), (1, 3)),  # queued >= idle; high KV >= low KV
    "tpot": ((0, 2), (1, 3)),                    # high KV >= low KV
}
#: bounds of the live factor (a wilder one means something else broke)
MIN_FACTOR, MAX_FACTOR = 0.5, 3.0


def conformal_offset(residuals: np.ndarray, quantile: float, weights: np.ndarray | None = None) -> float:
    """Additive offset o such that the share of residuals (y - pred) <= o is ``quantile``
    (finite-sample split-conformal level ceil((n+1)q)/n, capped at the maximum). With
    ``weights`` (e.g. recency), the share is weighted and the level is q (n+1)/n."""
    r = np.asarray(residuals, dtype=np.float64)
    n = r.size
    if n == 0:
        return 0.0
    if weights is None:
        r = np.sort(r)
        k = min(n, int(math.ceil((n + 1) * quantile)))
        return float(r[k - 1])
    order = np.argsort(r, kind="stable")
    cw = np.cumsum(np.asarray(weights, dtype=np.float64)[order])
    level = min(1.0, quantile * (n + 1) / n) * cw[-1]
    return float(r[order][min(n - 1, int(np.searchsorted(cw, level * (1 - 1e-12))))])


def monotone_regimes(target: str, values: Mapping[str, float], default: float) -> dict[str, float]:
    """Raise per-regime values so they never decrease along the target's constrained
    directions (missing regimes use ``default``); returns a value for every regime."""
    v = [float(values.get(name, default)) for name in REGIME_NAMES]
    for _ in range(2):  # two passes settle the 2x2 lattice
        for lo, hi in _ORDER[target]:
            v[hi] = max(v[hi], v[lo])
    return dict(zip(REGIME_NAMES, v))


def conformal_spec(target: str, residuals: np.ndarray, regime: np.ndarray, quantile: float,
                   min_regime_rows: int = MIN_REGIME_CAL_ROWS, weights: np.ndarray | None = None,
                   key: str = "offset_ms") -> dict[str, Any]:
    """Calibration spec from held-out residuals (actual - raw prediction), their regimes and
    optional sample weights. With ``key="scale"`` the "residuals" are ratios actual /
    prediction and the spec multiplies (offset 0): the correction grows with the level."""
    residuals = np.asarray(residuals, dtype=np.float64)
    regime = np.asarray(regime)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    neutral = {"offset_ms": 0.0, "scale": 1.0}
    glob = conformal_offset(residuals, quantile, w)
    spec: dict[str, Any] = {**neutral, key: glob, "n_calibration": int(residuals.size)}
    own = {name: conformal_offset(residuals[regime == i], quantile, None if w is None else w[regime == i])
           for i, name in enumerate(REGIME_NAMES) if (regime == i).sum() >= min_regime_rows}
    if len(own) > 1:  # a single regime with its own offset is the global one, near enough
        spec["by_regime"] = {name: {**neutral, key: v} for name, v in monotone_regimes(target, own, glob).items()}
    return spec


def conformal_scale_spec(target: str, actual: np.ndarray, predicted: np.ndarray, regime: np.ndarray,
                         quantile: float, weights: np.ndarray | None = None) -> dict[str, Any]:
    """Multiplicative split-conformal spec: the factor on the raw prediction that makes held-out
    coverage equal the quantile (globally and per regime, monotone across regimes), from
    (actual, raw prediction) pairs. Relative errors are what stays comparable when the level
    moves (a queue twice as long: errors twice as large), so it holds forward better than an
    offset in ms."""
    a = np.asarray(actual, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    floor = max(float(np.median(np.abs(a))) * 1e-3, 1e-9) if a.size else 1e-9
    return conformal_spec(target, a / np.maximum(p, floor), regime, quantile, weights=weights, key="scale")


def aci_update(log_factor: float, actual: np.ndarray, predicted: np.ndarray, quantile: float,
               step: float, max_move: float = math.inf, levels: np.ndarray | None = None) -> float:
    """Adaptive conformal inference on a multiplicative factor: for each live pair in arrival
    order, log f += step x (miss - (1 - quantile)), miss = actual > predicted. A factor that
    under-covers grows (quickly: a miss moves it 9x more than a hit at q = 0.9), one that
    over-covers shrinks, and at equilibrium the share of misses is 1 - quantile. One call
    moves it by at most ``max_move`` (pairs that arrive in a batch were all predicted with an
    older factor: without the bound they would overshoot). Clipped to [MIN_FACTOR, MAX_FACTOR].

    ``levels`` (log units, per pair): the factor each pair was predicted with. The pairs are then
    judged one by one as if predicted with the factor of the moment (``predicted`` x
    exp(factor - level)), so pairs predicted before a correction was served do not push the
    factor again for a miss it already corrected: a feedback loop as slow as a retrain does
    not overshoot and oscillate. Without it each pair is judged as it was predicted."""
    a = np.asarray(actual, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    if a.size and levels is not None:
        start, lf = log_factor, log_factor
        lo, hi = start - max_move, start + max_move
        base = np.log(np.maximum(p, 1e-300)) - np.asarray(levels, dtype=np.float64)
        la = np.log(np.maximum(a, 1e-300))
        up, down = step * quantile, step * (1.0 - quantile)
        for x, b in zip(la.tolist(), base.tolist()):
            lf = min(hi, lf + up) if x > b + lf else max(lo, lf - down)
        log_factor = lf
    elif a.size:
        miss = (a > p).astype(np.float64)
        move = step * float(np.sum(miss - (1.0 - quantile)))
        log_factor += min(max_move, max(-max_move, move))
    return float(min(math.log(MAX_FACTOR), max(math.log(MIN_FACTOR), log_factor)))


def level_factor(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Factor that puts ``candidate`` predictions at the level of ``reference`` ones on the same
    rows (median ratio, clipped to [MIN_FACTOR, MAX_FACTOR]; 1 without usable rows)."""
    r = np.asarray(reference, dtype=np.float64)
    c = np.asarray(candidate, dtype=np.float64)
    m = (r > 0) & (c > 0)
    if not m.any():
        return 1.0
    return float(min(MAX_FACTOR, max(MIN_FACTOR, float(np.median(r[m] / c[m])))))


def scale_spec(spec: Mapping | None, factor: float) -> dict[str, Any]:
    """``factor`` × the calibration map (scale and offsets, globally and per regime)."""
    spec = dict(spec or {"offset_ms": 0.0, "scale": 1.0})
    out: dict[str, Any] = {**spec, "offset_ms": float(spec.get("offset_ms", 0.0)) * factor,
                           "scale": float(spec.get("scale", 1.0)) * factor}
    by = spec.get("by_regime")
    if by:
        out["by_regime"] = {name: {"offset_ms": float(r.get("offset_ms", spec.get("offset_ms", 0.0))) * factor,
                                   "scale": float(r.get("scale", spec.get("scale", 1.0))) * factor}
                            for name, r in by.items()}
    out["live_factor"] = float(spec.get("live_factor", 1.0)) * factor
    return out
