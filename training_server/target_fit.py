"""One target's model of the default recipe: trees over the linear base, calibrated forward.

The rows arrive oldest first. The newest ``calibration_share`` of them are held out (time
order: they measure how a model fitted on the past does on what comes next, exactly the
situation of a served model), the model is fitted on the older ones, and the calibration
(:mod:`training_server.calibration`: a multiplicative conformal factor by default, an offset
in ms on request) is computed on the held-out rows.

Where ``TrainConfig.calibration_rows`` says ``"both"`` for a target (TPOT by default), the
chosen model is also fitted without a random share of the rows and calibrated on it, and the
larger of the two corrections is kept: TPOT is bounded by the decode batch and does not run
away with load the way TTFT does with queues, so a newest stretch that happens to be calm must
not set its margin alone (forward protocol, sim-sessions: TPOT coverage 85% -> 92%).

With a base (``TrainConfig.base``), each candidate link of :mod:`features.prior` is fitted
(``TrainConfig.base_link``: ``"auto"`` tries ``"beyond"`` and ``"add"``) and the one with the
lower pinball loss on the held-out newest rows, after calibration, is kept: ``"beyond"`` keeps
the trees' answers within the range seen (best on steady traffic), ``"add"`` lets the trees
learn only the residual over the whole linear base (best when latency is mostly a linear
function of queued work, as under overload). Below ``refit_below`` rows the chosen model is
refitted on all rows and the calibration kept.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from features.loaded import Calibration
from features.manifest import TargetCalibration
from features.matrix import regimes
from features.prior import LinearBase, base_level, upper_values
from features.scoring import pinball_loss

from .calibration import conformal_scale_spec, conformal_spec

#: fewest calibration rows for the forward calibration (newest rows, multiplicative); fewer:
#: a random share and an offset in ms
MIN_FORWARD_ROWS = 60
#: ``_fit(x, label, weights, level_scale) -> (native bytes, predict on a model matrix)``
FitFn = Callable[[np.ndarray, np.ndarray, "np.ndarray | None", float], tuple[bytes, Any]]


def base_spec(prior: dict, link: str, x: np.ndarray, names: tuple[str, ...]) -> dict:
    """The manifest's ``base`` entry for ``link`` over the fitted prior; ``upper`` from ``x``."""
    return {**prior, "link": link, "upper": upper_values(x, names, prior["coef"])}


def _spec(prior: dict | None, link: str | None, x: np.ndarray, names: tuple[str, ...]) -> dict | None:
    """:func:`base_spec`, or None for no base (``link`` None; a link is only chosen with a prior)."""
    return None if link is None or prior is None else base_spec(prior, link, x, names)


def _level(spec: dict | None, x: np.ndarray, target: str, names: tuple[str, ...]) -> np.ndarray | float:
    if spec is None:
        return 0.0
    return base_level(x, *LinearBase({target: spec}).applier(target, names))


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
        spec = _spec(prior, links[0], x, names)
        model, _ = fit(x, y - _level(spec, x, target, names), w, scale)
        return model, spec, None
    k = int(round(n * cfg.calibration_share))
    # Few rows (fewer than MIN_FORWARD_ROWS to calibrate on): a random share and an offset in ms,
    # as in steady state; the newest few rows of a warming-up server say little about the
    # next ones, and a factor from a few rows is set by one ratio (a short prediction missed by
    # 2x doubles every prediction).
    forward = k >= MIN_FORWARD_ROWS
    cal = np.zeros(n, dtype=bool)
    if forward:
        cal[n - k:] = True
    else:
        cal[np.random.default_rng(cfg.seed + 7919 * (target == "tpot")).permutation(n)[:k]] = True
    wf, wc = (None, None) if w is None else (w[~cal], w[cal])
    multiplicative = cfg.calibration_kind == "scale" and forward
    reg = regimes(r[cal])
    best = None
    for link in links:
        spec = _spec(prior, link, x[~cal], names)
        model, predict = fit(x[~cal], y[~cal] - _level(spec, x[~cal], target, names), wf, scale)
        pred = predict(x[cal]) + _level(spec, x[cal], target, names)
        if multiplicative:
            calib = conformal_scale_spec(target, y[cal], pred, reg, cfg.quantile, weights=wc)
        else:
            calib = conformal_spec(target, y[cal] - pred, reg, cfg.quantile, weights=wc)
        applied = Calibration.from_spec(TargetCalibration.from_json(calib)).apply(pred, r[cal])
        score = pinball_loss(y[cal], applied, cfg.quantile, wc)
        if best is None or score < best[0]:
            best = (score, link, model, spec, calib)
    assert best is not None  # links is never empty
    _, link, model, spec, calib = best
    if forward and cfg.calibration_rows.get(target, "newest") == "both":  # and a random share: the larger factor
        rnd = np.zeros(n, dtype=bool)
        rnd[np.random.default_rng(cfg.seed + 17).permutation(n)[:k]] = True
        spec_r = _spec(prior, link, x[~rnd], names)
        _, predict = fit(x[~rnd], y[~rnd] - _level(spec_r, x[~rnd], target, names),
                         None if w is None else w[~rnd], scale)
        pred = predict(x[rnd]) + _level(spec_r, x[rnd], target, names)
        reg_r, w_r = regimes(r[rnd]), None if w is None else w[rnd]
        calib = _larger(calib, conformal_scale_spec(target, y[rnd], pred, reg_r, cfg.quantile, weights=w_r)
                        if multiplicative else
                        conformal_spec(target, y[rnd] - pred, reg_r, cfg.quantile, weights=w_r))
    if n < cfg.refit_below:  # few rows: refit the chosen model on all of them, keep the calibration
        spec = _spec(prior, link, x, names)
        model, _ = fit(x, y - _level(spec, x, target, names), w, scale)
    return model, spec, calib


def _larger(a: dict, b: dict) -> dict:
    """The calibration map that is the larger of two (scale and offset, globally and per regime;
    both are monotone across regimes, so is the result)."""
    def pick(x: dict, y: dict) -> dict:
        return {"offset_ms": max(x.get("offset_ms", 0.0), y.get("offset_ms", 0.0)),
                "scale": max(x.get("scale", 1.0), y.get("scale", 1.0))}

    out = {**a, **pick(a, b), "n_calibration": a.get("n_calibration", 0) + b.get("n_calibration", 0)}
    ra, rb = a.get("by_regime") or {}, b.get("by_regime") or {}
    if ra or rb:
        out["by_regime"] = {n: pick(ra.get(n, a), rb.get(n, b)) for n in sorted(set(ra) | set(rb))}
    return out
