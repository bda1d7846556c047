"""Scores of quantile predictions: pinball loss, coverage, MAPE, per target and load regime.

The one pinball loss of the project (training, calibration choice, evaluation, live metrics
and the real-engine harness all call :func:`pinball_loss`). Coverage is a percentage
everywhere (share of actuals <= prediction, x 100), in manifests as in metrics.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .matrix import REGIME_NAMES, TARGETS, regimes


def pinball_loss(y_true: np.ndarray | Sequence[float], y_pred: np.ndarray | Sequence[float], quantile: float,
                 weights: np.ndarray | None = None) -> float:
    """Mean (weighted with ``weights``) pinball loss of quantile predictions; NaN without rows."""
    d = np.asarray(y_true, dtype=np.float64) - np.asarray(y_pred, dtype=np.float64)
    if not d.size:
        return float("nan")
    return float(np.average(np.maximum(quantile * d, (quantile - 1.0) * d), weights=weights))


#: actual latencies below this (ms) are left out of the MAPE
MIN_MAPE_MS = 1e-6


def evaluate_predictions(y_true: np.ndarray, y_pred: np.ndarray, quantile: float) -> dict:
    """{"pinball" (ms), "coverage" (% of actuals <= prediction), "mape" (%), "n"}."""
    y = np.asarray(y_true, dtype=np.float64).reshape(-1)
    p = np.asarray(y_pred, dtype=np.float64).reshape(-1)
    n = int(y.size)
    if n == 0:
        return {"pinball": float("nan"), "coverage": float("nan"), "mape": float("nan"), "n": 0}
    pos = y > MIN_MAPE_MS  # relative error over a latency of ~0 is not a figure (it overflowed)
    mape = float(np.mean(np.abs(y[pos] - p[pos]) / y[pos]) * 100.0) if pos.any() else float("nan")
    return {"pinball": pinball_loss(y, p, quantile), "coverage": float(np.mean(y <= p) * 100.0), "mape": mape, "n": n}


def evaluate_bundle(bundle, raw: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, quantile: float | None = None,
                    by_regime: bool = True) -> dict[str, dict]:
    """Score a LoadedBundle on rows (zeros = absent) per target, overall and per load regime."""
    q = bundle.quantile if quantile is None else quantile
    out: dict[str, dict] = {}
    if len(raw) == 0:
        return out
    pred = dict(zip(TARGETS, bundle.predict(raw)))
    reg = regimes(raw)
    for t, y in (("ttft", ttft), ("tpot", tpot)):
        m = y > 0
        if not m.any():
            continue
        res = evaluate_predictions(y[m], pred[t][m], q)
        res["residual_std"] = float(np.std(y[m] - pred[t][m]))
        if by_regime:
            res["by_regime"] = {name: evaluate_predictions(y[m & (reg == i)], pred[t][m & (reg == i)], q)
                                for i, name in enumerate(REGIME_NAMES) if (m & (reg == i)).any()}
        out[t] = res
    return out
