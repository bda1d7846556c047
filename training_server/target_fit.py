"""One target's model of the default recipe: trees over the linear base, calibrated forward.

The rows arrive oldest first. The newest ``calibration_share[target]`` of them are held out (time
order: they measure how a model fitted on the past does on what comes next, exactly the
situation of a served model), the model is fitted on the older ones, and the calibration
(:mod:`training_server.calibration`: a multiplicative conformal factor by default, an offset
in ms on request) is computed on the held-out rows.

Where ``TrainConfig.calibration_rows`` says ``"pooled"`` for a target (TPOT by default), the
chosen model is also fitted without a random share of the rows, and the correction kept is the
larger of the newest rows' and the one computed over the newest rows' and the random share's
residuals together: TPOT is bounded by the decode batch and does not run away with load the way
TTFT does with queues, so a newest stretch that happens to be calm must not set its margin alone
(forward protocol, sim-sessions: TPOT coverage 86.1% with the newest rows alone), nor a random
share alone (its factor, kept whenever it is the larger one, ``"both"``, over-covered
sim-sessions: 93.7%, pinball 1.108 ms; pooled: 91.6%, 1.076 ms).

With a base (``TrainConfig.base``), each candidate link of :mod:`features.prior` is fitted
(``TrainConfig.base_link``: ``"auto"`` tries the target's ``TrainConfig.auto_links``: all three
for TTFT, ``"add"`` and ``"ratio"`` for TPOT) and the one with the lower pinball loss on the
held-out newest rows, after calibration, is kept: ``"beyond"`` keeps the trees' answers within
the range seen (best on steady traffic), ``"add"`` lets the trees learn only the residual over
the whole linear base (best when latency is mostly a linear function of queued work, as under
overload), ``"ratio"`` lets them learn the latency's ratio to the base (weighted by the base, so
the loss is still the pinball loss in ms): past the range seen the prediction grows in
proportion to the work (sim-high-kv, forward: TTFT pinball 5.1 -> 4.8 s). Where
``TrainConfig.base_alone`` says so for the target (TTFT by default), the linear base alone,
fitted on the same older rows, is a candidate too (a bundle target with a base and no model
file): on a ramp the newest rows are often better answered by the line of queued work than by
trees that have not seen that much of it. Elsewhere the base alone only stands in when no tree
candidate answers the probe rows every served bundle must answer
(``features.loaded.probe_rows``) with a positive latency: trees trained only on long prompts
under load can answer a short prompt on an idle server with <= 0 (sim-high-kv).

The calibrated model is shipped exactly as it was measured: fitted on the older rows, with the
factor measured for it on the newest ones. Refitting it on all rows under that factor would mix
two models: on a drifting trace the factor measured for trees that had
not seen the newest 20% over-corrected trees that had (forward sim-ramp TTFT pinball 557 ms with
the refit, 434 ms without; sim-high-kv TPOT 3.53 -> 3.18 ms). Only with too few rows for the
forward calibration (a random share, an offset in ms) are the chosen trees refitted on all rows
and the offset kept: there every row counts, and nothing drifts between the shares.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from features.bundle import BundleError, validate_calibration
from features.loaded import Calibration, probe_rows
from features.manifest import TargetCalibration
from features.matrix import model_matrix, regimes
from features.prior import LinearBase, base_level, upper_values, with_base
from features.scoring import pinball_loss

from .calibration import conformal_offset, conformal_scale_spec, conformal_spec, scale_spec

#: fewest calibration rows for the forward calibration (newest rows, multiplicative); fewer:
#: a random share and an offset in ms
MIN_FORWARD_ROWS = 60
#: ``_fit(x, label, weights, level_scale) -> (native bytes, predict on a model matrix)``
FitFn = Callable[[np.ndarray, np.ndarray, "np.ndarray | None", float], tuple[bytes, Any]]


#: Per target, the exponent of the drift step of the forward calibration (:func:`drift_factor`;
#: 0 or absent: off). TTFT only: 0.5 took forward coverage on sim-ramp from 84.1 to 88.7% and
#: on sim-high-kv from 85.8 to 88.9% (pinball +1% and +3%), sharegpt-h200 92.3 -> 92.9%.
DRIFT_EXPONENT: dict[str, float] = {"ttft": 0.5}


def drift_factor(actual: np.ndarray, predicted: np.ndarray, quantile: float, exponent: float) -> float:
    """``(f_new / f_old) ** exponent`` when the newer half of the calibration rows (time order)
    needs a larger multiplicative conformal factor ``f`` than the older half, else 1. The served
    model answers rows that come after all of its calibration rows: where the factor grew across
    them (load moving past the range the model was fitted on), the next rows need more still.
    Never below 1, so steady traffic keeps its factor (up to the noise of the two halves)."""
    a = np.asarray(actual, dtype=np.float64)
    p = np.maximum(np.asarray(predicted, dtype=np.float64), 1e-9)
    h = a.size // 2
    if exponent <= 0 or h < 1:
        return 1.0
    f_old = conformal_offset(a[:h] / p[:h], quantile)
    f_new = conformal_offset(a[h:] / p[h:], quantile)
    return float((f_new / f_old) ** exponent) if 0 < f_old < f_new else 1.0


#: the ratio link's floor on the base, as a share of the median latency it was fitted on
RATIO_FLOOR_SHARE = 0.05


def base_spec(prior: dict, link: str, x: np.ndarray, names: tuple[str, ...], y: np.ndarray | None = None) -> dict:
    """The manifest's ``base`` entry for ``link`` over the fitted prior; ``upper`` from ``x``; the
    ratio link's ``floor`` from the latencies ``y``."""
    spec = {**prior, "link": link, "upper": upper_values(x, names, prior["coef"])}
    if link == "ratio":
        spec["floor"] = max(RATIO_FLOOR_SHARE * float(np.median(y)) if y is not None and len(y) else 0.0, 1e-3)
    return spec


def _spec(prior: dict | None, link: str | None, x: np.ndarray, names: tuple[str, ...], y: np.ndarray
          ) -> dict | None:
    """:func:`base_spec`, or None for no base (``link`` None; a link is only chosen with a prior)."""
    return None if link is None or prior is None else base_spec(prior, link, x, names, y)


def _level(spec: dict | None, x: np.ndarray, target: str, names: tuple[str, ...]) -> np.ndarray | float:
    if spec is None:
        return 0.0
    return base_level(x, *LinearBase({target: spec}).applier(target, names))


def _with_base(spec: dict | None, trees: np.ndarray, x: np.ndarray, target: str, names: tuple[str, ...]
               ) -> np.ndarray:
    """The trees' output combined with the base exactly as the served bundle combines them
    (:func:`features.prior.with_base`); the trees alone without a base."""
    if spec is None:
        return trees
    return with_base(trees, x, *LinearBase({target: spec}).applier(target, names))


#: the candidate answered by the linear base alone (no trees; a base-only target, link "add")
ALONE = "alone"
#: ``fit_base(raw, y, weights) -> prior dict``: the linear base fitted on some of the rows
BaseFn = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], dict]


def _servable(predict: Callable[[np.ndarray], np.ndarray], calib: dict | None, target: str,
              names: tuple[str, ...]) -> bool:
    """The candidate answers the rows a bundle must answer before it is served
    (:func:`features.loaded.probe_rows`) with finite, positive latencies, and its calibration
    is one a manifest accepts (a conformal factor within ``features.bundle.SCALE_RANGE``: trees
    answering ~0 on the calibration rows make it explode)."""
    if calib is not None:
        try:
            validate_calibration(target, calib)
        except BundleError:
            return False
    probe = probe_rows()
    y = predict(model_matrix(probe, target, names))
    if calib is not None:
        y = Calibration.from_spec(TargetCalibration.from_json(calib)).apply(y, probe)
    return bool(np.isfinite(y).all() and (y > 0).all())


def fit_target(cfg, fit: FitFn, r: np.ndarray, x: np.ndarray, y: np.ndarray, w: np.ndarray | None,
               names: tuple[str, ...], target: str, prior: dict | None, fit_base: BaseFn | None = None
               ) -> tuple[bytes | None, dict | None, dict | None]:
    """(native model bytes or None, base spec or None, calibration spec or None) for one target;
    ``r`` raw rows, ``x`` their model matrix, ``y`` targets (> 0), all oldest first; ``prior`` the
    fitted prior (the base), None for no base. With ``fit_base`` (and ``cfg.base_alone``, links
    chosen automatically), the base alone is a candidate too, fitted by it on the rows the trees are fitted on: when it
    wins, the model bytes are None and the base spec (link ``"add"``) answers alone. A candidate
    that does not answer the probe rows with positive latencies is never chosen."""
    links: tuple[str | None, ...] = (None,)
    if prior is not None:
        links = tuple(cfg.auto_links[target]) if cfg.base_link == "auto" else (cfg.base_link,)
    # the base alone: a candidate where configured (links chosen automatically), else the fallback
    # when no tree candidate answers the probe rows
    alone = prior is not None and fit_base is not None and cfg.base_link == "auto"
    select_alone = alone and bool(cfg.base_alone.get(target, False))
    scale = float(np.median(np.abs(y)))
    n = len(y)

    def fit_on(link: str | None, m: np.ndarray | slice) -> tuple[bytes | None, dict | None, Any]:
        """(model bytes or None, base spec, predict on a model matrix) fitted on rows ``m``."""
        wm = None if w is None else w[m]
        if link == ALONE:
            assert prior is not None and fit_base is not None
            p = prior if isinstance(m, slice) else fit_base(r[m], y[m], wm)
            alone = base_spec(p, "add", x[m], names)
            return None, alone, lambda xs: _level(alone, xs, target, names)
        spec = _spec(prior, link, x[m], names, y[m])
        level = _level(spec, x[m], target, names)
        if link == "ratio":  # trees on y / base, weighted by the base: the same pinball loss in ms
            lv = np.asarray(level, dtype=np.float64)
            ratio = y[m] / lv
            model, predict = fit(x[m], ratio, lv if wm is None else wm * lv, float(np.median(ratio)))
        else:
            model, predict = fit(x[m], y[m] - level, wm, scale)
        return model, spec, lambda xs: _with_base(spec, predict(xs), xs, target, names)

    share = float(cfg.calibration_share[target])
    do_cal = cfg.calibrate and cfg.recipe == "default" and cfg.objective == "quantile" and n * share >= 20
    if not do_cal:
        model, spec, _ = fit_on(links[0], slice(None))
        return model, spec, None
    k = int(round(n * share))
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
    wc = None if w is None else w[cal]
    multiplicative = cfg.calibration_kind == "scale" and forward
    reg = regimes(r[cal])
    best = None
    for link in (*links, ALONE) if alone else links:
        if link == ALONE and not select_alone and best is not None and best[0][0] == 0:
            break  # a tree candidate answers: the base alone is only the fallback here
        model, spec, predict = fit_on(link, ~cal)
        pred = predict(x[cal])
        if multiplicative:
            calib = conformal_scale_spec(target, y[cal], pred, reg, cfg.quantile, weights=wc)
            k_drift = drift_factor(y[cal], pred, cfg.quantile, DRIFT_EXPONENT.get(target, 0.0))
            if k_drift != 1.0:  # part of the trained calibration, not a live correction
                calib = {k: v for k, v in scale_spec(calib, k_drift).items() if k != "live_factor"}
        else:
            calib = conformal_spec(target, y[cal] - pred, reg, cfg.quantile, weights=wc)
        applied = Calibration.from_spec(TargetCalibration.from_json(calib)).apply(pred, r[cal])
        # (never served: not servable, see _servable; fallback; eligible), then the held-out pinball
        rank = 2 if not _servable(predict, calib, target, names) else \
            1 if link == ALONE and not select_alone else 0
        score = (rank, pinball_loss(y[cal], applied, cfg.quantile, wc))
        if best is None or score < best[0]:
            best = (score, link, model, spec, calib, predict)
    assert best is not None  # links is never empty
    _, link, model, spec, calib, predict = best
    rows = cfg.calibration_rows.get(target, "newest")
    if forward and rows in ("both", "pooled"):  # and a random share (module docstring)
        rnd = np.zeros(n, dtype=bool)
        rnd[np.random.default_rng(cfg.seed + 17).permutation(n)[:k]] = True
        _, _, predict_r = fit_on(link, ~rnd)
        y_o, pred_o, reg_o = y[rnd], predict_r(x[rnd]), regimes(r[rnd])
        w_o = None if w is None else w[rnd]
        if rows == "pooled":  # the newest rows' residuals (of the shipped model) and the random share's together
            y_o, pred_o, reg_o = np.r_[y[cal], y_o], np.r_[predict(x[cal]), pred_o], np.r_[reg, reg_o]
            w_o = None if w is None else np.r_[wc, w_o]
        calib = _larger(calib, conformal_scale_spec(target, y_o, pred_o, reg_o, cfg.quantile, weights=w_o)
                        if multiplicative else
                        conformal_spec(target, y_o - pred_o, reg_o, cfg.quantile, weights=w_o))
    # Too few rows for the forward calibration: refit the chosen trees on all of them and keep the
    # offset (unless the refit is not servable: then the held-out fit, as scored).
    # Otherwise the model ships as measured (module docstring); so does the base alone always.
    if link != ALONE and not forward:
        refit, refit_spec, refit_predict = fit_on(link, slice(None))
        if _servable(refit_predict, calib, target, names) or not _servable(predict, calib, target, names):
            model, spec = refit, refit_spec
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
