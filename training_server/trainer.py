"""The trainer: numpy in, native model bytes + fitted prior + calibration out.

Pure Python/numpy, usable in-process (the simulator and ``latency-predictor evaluate``
call it) and by the training server's retrain worker::

    result = train_models(raw, ttft, tpot, config=TrainConfig())
    manifest, files = build_bundle(result, make_version(1))       # -> Registry.publish
    bundle = loaded_bundle(result)                                  # in-memory LoadedBundle
    scores = evaluate_bundle(bundle, raw_test, ttft_test, tpot_test)

Zeros in a target mean "absent": those rows do not train that target. A target with fewer
than ``config.min_rows`` rows gets no model (E2E data: a TTFT model only, mode "e2e").

Recipes:
* ``"default"`` (ours): XGBoost/LightGBM on ``FEATURES`` with the monotone constraints of
  ``features.matrix`` (``TrainConfig.monotone``, on by default; XGBoost, or LightGBM with the mean
  objective: LightGBM refuses them with the quantile objective), tuned for small data, over a
  *base*: the fitted prior (a non-negative linear quantile model of queued work,
  ``features.prior``), so predictions keep growing past the largest work seen in training; and
  calibrated forward (:mod:`training_server.target_fit`): the newest ``calibration_share`` of
  the rows (per target, in time order) are held out, the model is fitted on the older ones, the better base
  link is chosen and a multiplicative conformal factor (globally and per load regime with enough
  rows, monotone across regimes; :mod:`training_server.calibration`) makes held-out coverage
  equal the quantile; that model ships as measured (with too few rows for a forward
  calibration: a random share and an offset in ms, and the model refitted on all rows).
* ``"upstream"``: the llm-d reference recipe of docs/evaluation.md §1 (exact hyper-parameters,
  ``UPSTREAM_FEATURES``, no constraints, no calibration), for comparisons.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from features.bundle import make_version
from features.loaded import LoadedBundle
from features.manifest import Manifest, build_manifest
from features.matrix import FEATURE_SETS, TARGETS, model_matrix, monotone_constraints
from features.prior import DEFAULT_PRIOR, FLOOR_FEATURES, LINKS, MIN_SLOPE_SHARE, PRIOR_FEATURES, fit_linear_quantile

from .calibration import MIN_REGIME_CAL_ROWS, conformal_offset, conformal_spec  # noqa: F401 (re-exported)
from .target_fit import fit_target

RECIPES = ("default", "upstream")
FILE_EXT = {"xgboost": ("ubj", "xgboost-ubj"), "lightgbm": ("txt", "lightgbm-text")}

#: docs/evaluation.md §1 reference recipe, verbatim.
UPSTREAM_XGB = {"n_estimators": 200, "max_depth": 6, "learning_rate": 0.05, "subsample": 0.8,
                "colsample_bytree": 0.8, "min_child_weight": 5, "gamma": 0.2, "reg_alpha": 0.01,
                "reg_lambda": 0.1, "tree_method": "hist"}
#: Our default recipe: the reference's regularisation with shallower trees (small, noisy
#: latency data), monotone constraints, and the pinball objective of _pinball_objective
#: (whose leaves step by a fraction of the residuals: a higher learning rate and more
#: rounds than the reference; lr 0.1 x 400 was the best of lr 0.05-0.15 x 200-400 on the
#: simulator traces, 5 seeds); the gain over the reference comes from calibration.
DEFAULT_XGB = {"n_estimators": 400, "max_depth": 4, "learning_rate": 0.1, "subsample": 0.8,
               "colsample_bytree": 0.8, "min_child_weight": 5, "gamma": 0.2, "reg_alpha": 0.01,
               "reg_lambda": 0.1, "tree_method": "hist", "max_bin": 256}
DEFAULT_LGB = {"n_estimators": 250, "num_leaves": 31, "max_depth": 6, "learning_rate": 0.05,
               "bagging_fraction": 0.8, "bagging_freq": 1, "feature_fraction": 0.9, "min_data_in_leaf": 10,
               "lambda_l2": 1.0}


@dataclass(frozen=True)
class TrainConfig:
    model_type: str = "xgboost"      # "xgboost" | "lightgbm"
    objective: str = "quantile"      # "quantile" | "mean"
    quantile: float = 0.9
    recipe: str = "default"          # "default" | "upstream"
    seed: int = 0
    nthread: int = 1
    calibrate: bool = True           # conformal calibration (quantile objective, default recipe)
    #: per target, the newest share of the rows held out for calibration (training_server.target_fit): TTFT
    #: 0.15 and TPOT 0.2, each the lowest forward pinball of those tried (docs/forward-accuracy.md)
    calibration_share: Mapping[str, float] = field(default_factory=lambda: {"ttft": 0.15, "tpot": 0.2})
    min_rows: int = 30               # fewer rows with a target -> no model for it
    params: Mapping[str, Any] | None = None  # hyper-parameter overrides (library names)
    #: per target, the residual below which _pinball_objective's curvature stops growing, as a
    #: share of the median target (TTFT 1%, TPOT 0.03%: the best of 0.01%-20% on sharegpt-h200
    #: and the two simulator traces of load.record_traces, 10 seeds; TTFT pinball on sim-high-kv
    #: 0.85 -> 0.71 x the reference, sim-sessions 1.06 -> 1.00)
    pinball_delta: Mapping[str, float] = field(default_factory=lambda: {"ttft": 0.01, "tpot": 0.0003})
    #: monotone constraints from features.matrix (default recipe, XGBoost or mean objective):
    #: routing must never prefer an endpoint because it is busier. Their price on the
    #: random-split protocol: on sharegpt-h200 TTFT pinball rises ~35% (the KV constraint
    #: forbids memorising stall bursts by their exact KV value); neutral on simulator traces.
    monotone: bool = True
    #: default recipe: past the largest work seen in training, predictions keep growing at the
    #: slopes of the fitted prior (features.prior) instead of flattening at the last tree split
    base: bool = True
    base_rows: int = 4000            # newest rows the base's linear program is fitted on
    #: conformal calibration: "scale" (multiplicative, grows with the level) or "offset" (ms)
    calibration_kind: str = "scale"
    #: how the trees combine with the base (features.prior.LINKS), or "auto": the better of them
    #: on the newest held-out rows (training_server.target_fit)
    base_link: str = "auto"
    #: per target, the links "auto" chooses from (features.prior.LINKS). TPOT leaves out "beyond":
    #: trees alone within the range seen lost forward to trees over the whole base (sim-high-kv TPOT
    #: pinball 3.29 -> 3.11 ms, sharegpt-h200 0.212 -> 0.208 ms); TTFT keeps it (sharegpt-h200 TTFT
    #: 7.3 ms with it, 16.1 ms without)
    auto_links: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: {"ttft": LINKS,
                                                                               "tpot": ("add", "ratio")})
    #: per target, with a base and base_link "auto": the base alone (no trees) is a candidate too,
    #: kept when it has the lower pinball loss on the newest held-out rows (training_server.target_fit;
    #: elsewhere it only stands in for trees that do not answer the probe rows). On for TTFT: on the
    #: simulator traces of load.record_traces it is chosen only on the ramp: forward TTFT 780 -> 736 ms
    #: (linear baseline 758); other traces and random splits unchanged. TPOT: lost (ramp 1.79 -> 1.85)
    base_alone: Mapping[str, bool] = field(default_factory=lambda: {"ttft": True})
    #: per target, the conformal calibration rows (training_server.target_fit): "newest" (time order),
    #: "both" / "pooled" (the larger of the newest rows' factor and a random share's / both's together)
    calibration_rows: Mapping[str, str] = field(default_factory=lambda: {"ttft": "newest", "tpot": "pooled"})

    def __post_init__(self) -> None:
        if self.model_type not in FILE_EXT:
            raise ValueError(f"model_type must be one of {tuple(FILE_EXT)}")
        if self.objective not in ("quantile", "mean"):
            raise ValueError("objective must be 'quantile' or 'mean'")
        if not 0 < self.quantile < 1:
            raise ValueError("quantile must be in (0, 1)")
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}")
        if set(self.calibration_share) != set(TARGETS) or not all(0 < v < 0.9 for v in self.calibration_share.values()):
            raise ValueError(f"calibration_share must give each of {TARGETS} a share in (0, 0.9)")
        if self.base_link not in ("auto", *LINKS):
            raise ValueError(f"base_link must be 'auto' or one of {LINKS}")
        for t in TARGETS:
            links = self.auto_links.get(t)
            if not links or not set(links) <= set(LINKS):
                raise ValueError(f"auto_links[{t!r}] must be a non-empty subset of {LINKS}")
        if self.calibration_kind not in ("scale", "offset"):
            raise ValueError("calibration_kind must be 'scale' or 'offset'")
        if self.nthread < 1 or self.min_rows < 2:
            raise ValueError("nthread must be >= 1 and min_rows >= 2")
        if not set(self.calibration_rows.values()) <= {"newest", "both", "pooled"}:
            raise ValueError("calibration_rows values must be 'newest', 'both' or 'pooled'")


@dataclass
class TrainResult:
    config: TrainConfig
    models: dict[str, bytes]                 # target -> native model bytes (none: the base alone, or the prior)
    feature_names: dict[str, tuple[str, ...]]
    prior: dict[str, dict]
    calibration: dict[str, dict]             # target -> {"offset_ms", "scale", ["by_regime"]}
    n_train: dict[str, int]
    train_seconds: float
    base: dict[str, dict] = field(default_factory=dict)  # target -> {"intercept", "coef", "link"}
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    @property
    def mode(self) -> str:
        """"e2e" when the data has no TPOT (too few rows for it), else "streaming" (a TPOT that
        keeps the served prior is still streaming data)."""
        return "streaming" if "tpot" in self.targets or self.n_train.get("tpot", 0) >= self.config.min_rows else "e2e"

    @property
    def targets(self) -> tuple[str, ...]:
        """Targets with a learned model: trees (``models``) or a base alone (``base`` only)."""
        return tuple(t for t in TARGETS if t in self.models or t in self.base)


# ---- fitting ----------------------------------------------------------------------------
def _xgb_params(cfg: TrainConfig, names: tuple[str, ...], target: str) -> tuple[dict, int]:
    base: dict[str, Any] = dict(UPSTREAM_XGB if cfg.recipe == "upstream" else DEFAULT_XGB)
    base.update(cfg.params or {})
    rounds = int(base.pop("n_estimators"))
    params: dict[str, Any] = {**base, "nthread": cfg.nthread, "seed": cfg.seed, "verbosity": 0}
    if cfg.objective == "quantile" and not _constrained_quantile(cfg):
        params.update(objective="reg:quantileerror", quantile_alpha=cfg.quantile)
    else:  # the mean, or the quantile through _pinball_objective (identity link either way)
        params.update(objective="reg:squarederror")
    if cfg.recipe == "default" and cfg.monotone:
        params["monotone_constraints"] = "(" + ",".join(str(c) for c in monotone_constraints(target, names)) + ")"
    return params, rounds


def _constrained_quantile(cfg: TrainConfig) -> bool:
    """XGBoost's reg:quantileerror re-fits leaf values after each tree (adaptive leaves) and so
    breaks monotone constraints (seen: -26% along the queue); a quantile model with
    constraints uses :func:`_pinball_objective` instead, whose Newton leaves respect them."""
    return cfg.model_type == "xgboost" and cfg.objective == "quantile" and cfg.recipe == "default" and cfg.monotone


def _pinball_objective(quantile: float, delta: float, weights: np.ndarray | None, label: np.ndarray):
    """Pinball loss as a custom XGBoost objective: its gradient, and the curvature of the
    iteratively re-weighted least-squares view of quantile regression (weight q or 1-q over
    max(|residual|, delta)), so a leaf steps by about a quantile of its residuals. Gradient and
    hessian are rescaled together to mean hessian 1 (the Newton step is unchanged and
    ``min_child_weight`` keeps counting rows). ``label``: the training matrix's labels (read once,
    not copied out of XGBoost every round)."""
    label = np.asarray(label, dtype=np.float32)  # as XGBoost stores it: the same residuals

    def objective(pred: np.ndarray, dtrain) -> tuple[np.ndarray, np.ndarray]:
        r = label - pred
        wq = np.where(r > 0, quantile, 1.0 - quantile)
        g = -wq * np.sign(r)
        h = wq / np.maximum(np.abs(r), delta)
        if weights is not None:
            g, h = g * weights, h * weights
        c = 1.0 / max(float(h.mean()), 1e-300)
        return g * c, h * c

    return objective


def _lgb_params(cfg: TrainConfig, names: tuple[str, ...], target: str) -> tuple[dict, int]:
    if cfg.recipe == "upstream":  # the reference hyper-parameters in LightGBM's names
        base: dict[str, Any] = {"n_estimators": 200, "max_depth": 6, "num_leaves": 63, "learning_rate": 0.05,
                                "bagging_fraction": 0.8, "bagging_freq": 1, "feature_fraction": 0.8,
                                "min_sum_hessian_in_leaf": 5, "min_gain_to_split": 0.2, "lambda_l1": 0.01,
                                "lambda_l2": 0.1}
    else:
        base = dict(DEFAULT_LGB)
    base.update(cfg.params or {})
    rounds = int(base.pop("n_estimators"))
    params = {**base, "num_threads": cfg.nthread, "seed": cfg.seed, "verbose": -1, "deterministic": True}
    if cfg.objective == "quantile":
        params.update(objective="quantile", alpha=cfg.quantile)
    else:
        params.update(objective="regression")
    if cfg.recipe == "default" and cfg.monotone and cfg.objective != "quantile":  # LightGBM refuses them with quantile
        params["monotone_constraints"] = list(monotone_constraints(target, names))
    return params, rounds


def _fit(cfg: TrainConfig, x: np.ndarray, y: np.ndarray, w: np.ndarray | None, names: tuple[str, ...],
         target: str, stop: Callable[[], bool] | None = None, level_scale: float | None = None) -> tuple[bytes, Any]:
    """Fit one model; returns (native bytes, predict function on a model matrix). ``level_scale``:
    the typical size of the target when ``y`` is a residual (the pinball curvature floor)."""
    if cfg.model_type == "xgboost":
        import xgboost as xgb

        class _Stop(xgb.callback.TrainingCallback):
            def after_iteration(self, model, epoch, evals_log) -> bool:
                return bool(stop and stop())

        params, rounds = _xgb_params(cfg, names, target)
        # Unnamed while boosting: XGBoost re-checks a named matrix's feature names twice per
        # round (about a fifth of a fit's CPU); the names go on the booster afterwards, which
        # gives byte-identical model files.
        dtrain = xgb.DMatrix(x, label=y, weight=w, nthread=cfg.nthread)
        obj = None
        if _constrained_quantile(cfg):
            params["base_score"] = float(np.quantile(y, cfg.quantile))
            typical = float(np.median(np.abs(y))) if level_scale is None else level_scale
            delta = float(cfg.pinball_delta.get(target, 1e-3)) * typical
            obj = _pinball_objective(cfg.quantile, max(delta, 1e-9), w, y)
        booster = xgb.train(params, dtrain, num_boost_round=rounds, obj=obj,
                            callbacks=[_Stop()] if stop else None)
        if stop and stop():
            raise TrainingStopped("training stopped")
        booster.feature_names = list(names)
        raw = bytes(booster.save_raw("ubj"))
        return raw, lambda m: np.asarray(booster.inplace_predict(m), dtype=np.float64).reshape(-1)
    import lightgbm as lgb

    params, rounds = _lgb_params(cfg, names, target)
    ds = lgb.Dataset(x, label=y, weight=w, feature_name=list(names), params={"verbose": -1})
    def _check(env) -> None:
        if stop and stop():
            raise TrainingStopped("training stopped")

    booster = lgb.train(params, ds, num_boost_round=rounds, callbacks=[_check] if stop else None)
    text = booster.model_to_string().encode("utf-8")
    return text, lambda m: np.asarray(booster.predict(m, num_threads=cfg.nthread), dtype=np.float64).reshape(-1)


def fit_prior(raw: np.ndarray, y: np.ndarray, target: str, quantile: float, max_rows: int = 4000,
              weights: np.ndarray | None = None) -> dict:
    """The bundle's prior and the learned model's base (``features.prior``): a quantile linear
    model on PRIOR_FEATURES, coefficients >= 0 (slope floors on FLOOR_FEATURES), newest rows."""
    names = PRIOR_FEATURES[target]
    if len(y) > max_rows:
        raw, y = raw[-max_rows:], y[-max_rows:]
        weights = None if weights is None else weights[-max_rows:]
    rise = MIN_SLOPE_SHARE * float(np.median(y)) * np.array([n in FLOOR_FEATURES[target] for n in names])
    intercept, coef = fit_linear_quantile(model_matrix(raw, target, names), y, quantile, weights, min_rise=rise)
    return {"intercept": intercept, "coef": {n: float(c) for n, c in zip(names, coef)}}


def _time_order(n: int, ts: np.ndarray | None) -> np.ndarray:
    """Row indices oldest first: by timestamp, ties (and rows without one) in the given order."""
    if ts is None:
        return np.arange(n)
    return np.argsort(np.asarray(ts, dtype=np.float64), kind="stable")

class TrainingStopped(Exception):
    """``train_models`` was asked to stop (``stop()`` returned True) before finishing."""


def train_models(raw: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, *, config: TrainConfig = TrainConfig(),
                 ts: np.ndarray | None = None, weights: np.ndarray | None = None,
                 stop: Callable[[], bool] | None = None) -> TrainResult:
    """Train one model per target with enough rows; see the module docstring.

    ``ts`` (epoch s) orders the rows in time (ties and missing timestamps: the given order, which
    is arrival order for the store and the traces): the base is fitted on the newest rows, the
    calibration rows are the newest ones. ``weights``: per-row sample weights. ``stop`` is polled
    after every boosting round; when it returns True, TrainingStopped is raised (shutdown never
    waits for a whole training run).
    """
    t0 = time.perf_counter()
    raw = np.asarray(raw, dtype=np.float64)
    targets_y = {"ttft": np.asarray(ttft, dtype=np.float64), "tpot": np.asarray(tpot, dtype=np.float64)}
    for t, y in targets_y.items():
        if y.shape != (raw.shape[0],):
            raise ValueError(f"{t} must have shape ({raw.shape[0]},), got {y.shape}")
        if not np.isfinite(y).all() or (y < 0).any():
            raise ValueError(f"{t} targets must be finite and >= 0")
    if not np.isfinite(raw).all():
        raise ValueError("raw features must be finite")
    w_all = None if weights is None else np.asarray(weights, dtype=np.float64)
    names_all = FEATURE_SETS[config.recipe]
    models: dict[str, bytes] = {}
    calibration: dict[str, dict] = {}
    prior: dict[str, dict] = {}
    n_train: dict[str, int] = {}
    names_used: dict[str, tuple[str, ...]] = {}
    bases: dict[str, dict] = {}
    order = _time_order(raw.shape[0], ts)
    raw = raw[order]
    targets_y = {t: y[order] for t, y in targets_y.items()}
    w_all = None if w_all is None else w_all[order]
    for target in TARGETS:
        y_all = targets_y[target]
        m = y_all > 0
        n = int(m.sum())
        n_train[target] = n
        names = tuple(names_all[target])
        names_used[target] = names
        if n < config.min_rows:
            prior[target] = DEFAULT_PRIOR[target]
            continue
        r, y = raw[m], y_all[m]
        w = None if w_all is None else w_all[m]
        prior[target] = fit_prior(r, y, target, config.quantile if config.objective == "quantile" else 0.5,
                                  max_rows=config.base_rows, weights=w)
        x = model_matrix(r, target, names)
        use_base = config.base and config.recipe == "default"

        def fit(xf: np.ndarray, yf: np.ndarray, wf: np.ndarray | None, scale: float,
                names: tuple[str, ...] = names, target: str = target) -> tuple[bytes, Any]:
            return _fit(config, xf, yf, wf, names, target, stop, scale)

        def fit_base(rf: np.ndarray, yf: np.ndarray, wf: np.ndarray | None, target: str = target) -> dict:
            return fit_prior(rf, yf, target, config.quantile if config.objective == "quantile" else 0.5,
                             max_rows=config.base_rows, weights=wf)

        model, base, cal = fit_target(config, fit, r, x, y, w, names, target,
                                      prior[target] if use_base else None, fit_base)
        if model is not None:
            models[target] = model
        if base is not None:
            bases[target] = base
        if cal is not None:
            calibration[target] = cal
    return TrainResult(config=config, models=models, feature_names=names_used, prior=prior,
                       calibration=calibration, n_train=n_train, train_seconds=time.perf_counter() - t0,
                       base=bases)


# ---- bundles ----------------------------------------------------------------------------
def build_bundle(result: TrainResult, version: str, *, metrics: Mapping | None = None,
                 training: Mapping | None = None, extra: Mapping | None = None) -> tuple[Manifest, dict[str, bytes]]:
    """Manifest and files of a bundle (for ``Registry.publish`` or ``features.bundle.write_bundle``
    through ``Manifest.to_json``).

    ``metrics``: held-out scores per target (``evaluate_bundle``); ``training``: extra
    per-target counts (e.g. ``n_test``); ``extra``: more top-level manifest keys.
    """
    if not result.targets:
        raise ValueError("no model was trained (too few rows for every target)")
    ext, fmt = FILE_EXT[result.config.model_type]
    files = {f"{t}.{ext}": data for t, data in result.models.items()}
    cfg = result.config
    manifest = build_manifest(
        version=version, created_at=result.created_at, feature_set=cfg.recipe, model_kind=cfg.model_type,
        objective=cfg.objective, quantile=cfg.quantile, mode=result.mode,
        models={t: (f"{t}.{ext}", fmt) for t in result.models}, files=files, prior=result.prior,
        base={t: b for t, b in result.base.items() if t in result.targets} if result.base else None,
        calibration={t: c for t, c in result.calibration.items() if t in result.targets},
        training={t: {"n_train": result.n_train.get(t, 0), **dict((training or {}).get(t, {}))} for t in TARGETS},
        metrics=metrics or {},
        extra={"recipe": {"name": cfg.recipe, "seed": cfg.seed, "train_seconds": round(result.train_seconds, 3)},
               **dict(extra or {})})
    return manifest, files


def loaded_bundle(result: TrainResult, version: str | None = None, metrics: Mapping | None = None) -> LoadedBundle:
    """An in-memory ``features.loaded.LoadedBundle`` from a TrainResult."""
    manifest, files = build_bundle(result, version or make_version(0), metrics=metrics)
    return LoadedBundle.from_files(manifest, files)


def with_config(config: TrainConfig, **changes: Any) -> TrainConfig:
    return replace(config, **changes)
