"""Fitting the engine twin's step model from what the EPP observed (docs/plugins.md B2.9).

Each engine row is one request: the endpoint that served it, the endpoint's class (model served
and pod shape), the five step sums ``F`` of the twin's schedule until its first token
(``features.schema.ENGINE_FEATURE_FIELDS``) and the measured TTFT ``y``. The twin predicts
``y = (c . F) / speed``; per class :func:`fit_engine` finds

- the coefficients ``c`` (non-negative least squares on the *relative* error: each row divided by
  its ``y``, so a 20 ms TTFT weighs as much as a 20 s one), robustly: fit, drop the rows with the
  largest ``trim`` share of residuals, fit again, until the rows dropped no longer change;
- a speed per endpoint with at least ``min_endpoint_rows`` rows: the median over its rows of
  ``(c . F) / y`` (predicted at speed 1 over measured); the speeds are then divided by their
  geometric mean and ``c`` by the same factor (the class's coefficients absorb the scale, so the
  class's endpoints have speeds around 1 and an endpoint without a speed of its own runs at 1);
- alternately, ``rounds`` times (the coefficients with the speeds, the speeds with the coefficients).

Every ``holdout_every``-th row of a class (in arrival order) is held out; the section reports
per class the rows fitted on, the held-out rows and their median absolute relative error, and
per endpoint its rows. A class with fewer than ``min_class_rows`` rows is not fitted (the EPP
keeps its prior for it). The result is the bundle manifest's ``engine`` section
(``features.bundle.validate_engine``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import nnls

from features.schema import ENGINE_COEFFICIENTS

#: the least rows a class is fitted with, and an endpoint gets its own speed with
MIN_CLASS_ROWS = 50
MIN_ENDPOINT_ROWS = 20


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares of ``a @ c ~ b`` with the columns scaled to unit norm first
    (the sums span ten orders of magnitude: steps ~10, prefill pairs ~1e10)."""
    norm = np.sqrt((a * a).sum(axis=0))
    used = norm > 0
    c = np.zeros(a.shape[1])
    if used.any():
        sol, _ = nnls(a[:, used] / norm[used], b, maxiter=50 * a.shape[1])
        c[used] = sol / norm[used]
    return c


def _relative_fit(f: np.ndarray, y: np.ndarray, speed: np.ndarray, trim: float, refits: int = 10) -> np.ndarray:
    """``c`` minimising the squared relative error of ``(c . f) / speed`` against ``y``, refitted
    without the rows of the largest ``trim`` share of residuals, each time with the residuals of
    every row under the last fit, until the rows kept no longer change (at most ``refits`` times:
    a first fit pulled by outliers does not decide which rows are kept)."""
    a = f / (speed * y)[:, None]
    ones = np.ones(len(y))
    c = _nnls(a, ones)
    kept = None
    if trim > 0 and len(y) >= 10:
        for _ in range(refits):
            r = np.abs(a @ c - 1.0)
            keep = r <= np.quantile(r, 1.0 - trim)
            if keep.sum() < a.shape[1] or (kept is not None and np.array_equal(keep, kept)):
                break
            c, kept = _nnls(a[keep], ones[keep]), keep
    return c


def _fit_class(f: np.ndarray, y: np.ndarray, endpoints: np.ndarray, *, min_endpoint_rows: int, trim: float,
               rounds: int) -> tuple[np.ndarray, dict[str, float]]:
    """The class's coefficients and the speeds of its endpoints with enough rows."""
    names, inverse, counts = np.unique(endpoints, return_inverse=True, return_counts=True)
    own = counts >= min_endpoint_rows
    speeds = np.ones(len(names))
    c = np.zeros(f.shape[1])
    for _ in range(max(1, rounds)):
        c = _relative_fit(f, y, speeds[inverse], trim)
        ratio = (f @ c) / y                     # predicted at speed 1 over measured
        for k in np.flatnonzero(own):
            s = float(np.median(ratio[inverse == k]))
            speeds[k] = s if s > 0 else 1.0
        if own.any():
            g = float(np.exp(np.mean(np.log(speeds[own]))))
            speeds[own] /= g
            c = c / g
    return c, {str(names[k]): float(speeds[k]) for k in np.flatnonzero(own)}


def fit_engine(classes: Sequence[str], endpoints: Sequence[str], features: np.ndarray, ttft_ms: np.ndarray, *,
               min_class_rows: int = MIN_CLASS_ROWS, min_endpoint_rows: int = MIN_ENDPOINT_ROWS,
               holdout_every: int = 10, trim: float = 0.1, rounds: int = 4) -> dict[str, Any] | None:
    """The manifest's ``engine`` section fitted from rows in arrival order (see the module
    docstring); None when no class has ``min_class_rows`` rows with a measured TTFT."""
    f = np.asarray(features, dtype=np.float64).reshape(-1, len(ENGINE_COEFFICIENTS))
    y = np.asarray(ttft_ms, dtype=np.float64)
    cls = np.asarray(classes, dtype=object)
    eps = np.asarray(endpoints, dtype=object)
    ok = (y > 0) & np.isfinite(y) & np.isfinite(f).all(axis=1) & (f >= 0).all(axis=1) & (f[:, 0] > 0)
    out: dict[str, Any] = {}
    for name in sorted(set(cls[ok].tolist())):
        idx = np.flatnonzero(ok & (cls == name))
        if len(idx) < min_class_rows:
            continue
        held = np.zeros(len(idx), dtype=bool)
        if holdout_every > 1:
            held[holdout_every - 1::holdout_every] = True
        tr, te = idx[~held], idx[held]
        c, speeds = _fit_class(f[tr], y[tr], eps[tr], min_endpoint_rows=min_endpoint_rows, trim=trim, rounds=rounds)
        entry: dict[str, Any] = {
            "coefficients": {k: float(v) for k, v in zip(ENGINE_COEFFICIENTS, c)},
            "n_train": int(len(tr)), "n_heldout": int(len(te)),
            "endpoints": {e: {"speed": s, "n": int(np.sum(eps[tr] == e))} for e, s in sorted(speeds.items())}}
        if len(te):
            s_te = np.array([speeds.get(str(e), 1.0) for e in eps[te]])
            err = np.abs((f[te] @ c) / s_te / y[te] - 1.0)
            entry["heldout_error"] = float(np.median(err))
        out[str(name)] = entry
    if not out:
        return None
    return {"rows": int(ok.sum()), "classes": out}
