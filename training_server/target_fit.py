"""One target's model of the default recipe: trees over the linear base, calibrated forward.

The rows arrive oldest first. The newest ``calibration_share`` of them are held out (time
order: they measure how a model fitted on the past does on what comes next, exactly the
situation of a served model), the model is fitted on the older ones, and the calibration
(:mod:`training_server.calibration`: a multiplicative conformal factor by default, an offset
in ms on request) is computed on the held-out rows.

With a base (``TrainConfig.base``), each candidate link of :mod:`features.prior` is fitted
(``TrainConfig.base_link``: ``"auto"`` tries ``"beyond"`` and ``"add"``) and the one with the
lower pinball loss on the held-out newest rows, after calibration, is kept: ``"beyond"`` keeps
the trees' answers within the range seen (best on steady traffic), ``"add"`` lets the trees
learn only the residual over the whole linear base (best when latency is mostly a linear
function of queued work, as under overload). Below ``refit_below`` rows the chosen model is
refitted on all rows and the calibration kept.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from features.matrix import regimes
from features.prior import LinearBase, base_level, upper_values

from prediction_server.model import Calibration

from .calibration import conformal_scale_spec, conformal_spec

#: ``_fit(x, label, weights, level_scale) -> (native bytes, predict on a model matrix)``
FitFn = Callable[[np.ndarray, np.ndarray, "np.ndarray | None", float], tuple[bytes, Any]]


def base_spec(prior: dict, link: str, x: np.ndarray, names: tuple[str, ...]) -> dict:
    """The manifest's ``base`` entry for ``link`` over the fitted prior; ``upper`` from ``x``."""
    return {**prior, "link": link, "upper": upper_values(x, names, prior["coef"])}


def _level(spec: dict | None, x: np.ndarray, target: str, names: tuple[str, ...]) -> np.ndarray | float:
    if spec is None:
        return 0.0
    return base_level(x, *LinearBase({target: spec}).applier(target, names))


def _pinball(y: np.ndarray, p: np.ndarray, q: float, w: np.ndarray | None) -> float:
    d = y - p
    return float(np.average(np.maximum(q * d, (q - 1.0) * d), weights=w))


def fit_target(cfg, fit: FitFn, r: np.ndarray, x: np.ndarray, y: np.ndarray, w: np.ndarray | None,
               names: tuple[str, ...], target: str, prior: dict | None
               ) -> tuple[bytes, dict | None, dict | None]:
    """(native model bytes, base spec or None, calibration spec or None) for one target; ``r``
    raw rows, ``x`` their model matrix, ``y`` targets (> 0), all oldest first; ``prior`` the
    fitted prior (the base), None for no base."""
    links: tuple[str | None, ...] = (None,)
    if prior is not None:
        links = ("beyond", "add") if cfg.base_link == "auto" else (cfg.base_link,)
    scale = float(np.median(np.abs(y)))
    n = len(y)
    do_cal = (cfg.calibrate and cfg.recipe == "default" and cfg.objective == "quantile"
              and n * cfg.calibration_share >= 20)
    if not do_cal:
        spec = None if links[0] is None else base_spec(prior, links[0], x, names)
        model, _ = fit(x, y - _level(spec, x, target, names), w, scale)
        return model, spec, None
    k = int(round(n * cfg.calibration_share))
    cal = np.zeros(n, dtype=bool)
    cal[n - k:] = True
    wf, wc = (None, None) if w is None else (w[~cal], w[cal])
    reg = regimes(r[cal])
    best = None
    for link in links:
        spec = None if link is None else base_spec(prior, link, x[~cal], names)
        model, predict = fit(x[~cal], y[~cal] - _level(spec, x[~cal], target, names), wf, scale)
        pred = predict(x[cal]) + _level(spec, x[cal], target, names)
        if cfg.calibration_kind == "scale":
            calib = conformal_scale_spec(target, y[cal], pred, reg, cfg.quantile, weights=wc)
        else:
            calib = conformal_spec(target, y[cal] - pred, reg, cfg.quantile, weights=wc)
        score = _pinball(y[cal], Calibration.from_manifest(calib).apply(pred, r[cal]), cfg.quantile, wc)
        if best is None or score < best[0]:
            best = (score, link, model, spec, calib)
    _, link, model, spec, calib = best
    if n < cfg.refit_below:  # few rows: refit the chosen model on all of them, keep the calibration
        spec = None if link is None else base_spec(prior, link, x, names)
        model, _ = fit(x, y - _level(spec, x, target, names), w, scale)
    return model, spec, calib
