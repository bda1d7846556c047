"""The linear base: a non-negative linear model of queued work, described by JSON coefficients.

One concept serves two roles:

* the **prior**, used before any learned model exists: the built-in ``DEFAULT_PRIOR`` answers
  from the very first request, and every bundle carries one fitted from its samples
  (manifest key ``prior``);
* the **base** of a learned model (manifest key ``base``, per target), by its ``link``:
  ``"beyond"`` (with ``upper``: the largest value of each base feature seen in training): within
  the range seen the trees answer alone; beyond it the prediction keeps growing at the base's
  slopes: prediction = trees + sum_j coef_j * max(0, x_j - upper_j). ``"add"``: the trees
  learned the residual over the whole base: prediction = trees + intercept + x . coef.
  ``"ratio"`` (with ``floor``, ms > 0): the trees learned the ratio of the latency to the base:
  prediction = trees * max(intercept + x . coef, floor); past the range seen the ratio stays at
  its last value and the prediction grows in proportion to the work.
  Regression trees predict a constant past their last split; queues do not stop costing time
  there, and with any link neither does the prediction.

Coefficients are in ms per unit of the named model feature (``features.matrix``) and are
non-negative, so the base never decreases as work is added. Nothing here is pickled.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .matrix import FEATURES, model_matrix

#: Features the base (and so the prior) may use, per target (a subset of FEATURES[target]):
#: the queued work an engine must get through before this request's tokens.
PRIOR_FEATURES: dict[str, tuple[str, ...]] = {
    "ttft": ("uncached_input_tokens", "prefill_tokens_in_flight", "num_request_waiting",
             "num_request_running", "kv_cache_percentage"),
    "tpot": ("num_request_running", "decode_tokens_in_flight", "kv_cache_percentage",
             "input_token_length", "prefill_tokens_in_flight"),
}
BASE_FEATURES = PRIOR_FEATURES
#: Work that always costs time, per target: over the range seen in training, each of these adds
#: at least MIN_SLOPE_SHARE of the median latency (a floor on the fitted slope), so past that
#: range predictions keep rising with it even when the data seen was too flat to show a slope.
FLOOR_FEATURES: dict[str, tuple[str, ...]] = {
    "ttft": ("prefill_tokens_in_flight", "num_request_waiting"),
    "tpot": ("num_request_running", "decode_tokens_in_flight"),
}
MIN_SLOPE_SHARE = 0.05
#: How the trees' output combines with the base (``"beyond"``: trees + the base's growth past
#: the largest values seen in training).
LINKS = ("beyond", "add", "ratio")

#: Conservative analytic default (roughly a 7-8B model on one A100, p90-ish): prefill
#: ~0.2 ms per uncached token, queued work ~0.1 ms per token, a queued request costs a
#: whole prefill slot; decode ~20 ms plus batch and context pressure.
DEFAULT_PRIOR: dict[str, dict] = {
    "ttft": {"intercept": 60.0, "coef": {"uncached_input_tokens": 0.2, "prefill_tokens_in_flight": 0.1,
                                         "num_request_waiting": 150.0, "num_request_running": 4.0,
                                         "kv_cache_percentage": 100.0}},
    "tpot": {"intercept": 20.0, "coef": {"num_request_running": 0.6, "decode_tokens_in_flight": 0.0002,
                                         "kv_cache_percentage": 15.0, "input_token_length": 0.001,
                                         "prefill_tokens_in_flight": 0.002}},
}


def validate_linear(p: object, where: str, target: str, non_negative: bool = False) -> dict:
    """Check one target's linear description ``{"intercept", "coef": {feature: w}}``; raise
    ValueError naming ``where`` (e.g. ``prior.ttft``) and the bad key."""
    if not isinstance(p, Mapping):
        raise ValueError(f"{where} missing")
    try:
        intercept = float(p.get("intercept", 0.0))
    except (TypeError, ValueError):
        raise ValueError(f"{where}.intercept is not a number") from None
    coef = p.get("coef", {})
    if not isinstance(coef, Mapping):
        raise ValueError(f"{where}.coef must be an object")
    out: dict[str, float] = {}
    for name, w in coef.items():
        if name not in FEATURES[target]:
            raise ValueError(f"{where}.coef: unknown feature {name!r}")
        try:
            out[name] = float(w)
        except (TypeError, ValueError):
            raise ValueError(f"{where}.coef.{name} is not a number") from None
        if not np.isfinite(out[name]) or (non_negative and out[name] < 0):
            raise ValueError(f"{where}.coef.{name} must be finite{' and >= 0' if non_negative else ''}")
    if not np.isfinite(intercept):
        raise ValueError(f"{where}.intercept is not finite")
    return {"intercept": intercept, "coef": out}


def validate_prior(params: Mapping) -> dict[str, dict]:
    """Check a prior description (from a manifest); raise ValueError naming the problem."""
    return {t: validate_linear(params.get(t), f"prior.{t}", t) for t in ("ttft", "tpot")}


def validate_base(params: object) -> dict[str, dict]:
    """Check a manifest's ``base`` section (any subset of targets); coefficients must be >= 0."""
    if not isinstance(params, Mapping):
        raise ValueError("base must be an object")
    out: dict[str, dict] = {}
    for t, p in params.items():
        if t not in FEATURES:
            raise ValueError(f"base: unknown target {t!r}")
        spec = validate_linear(p, f"base.{t}", t, non_negative=True)
        link = p.get("link")
        if link not in LINKS:
            raise ValueError(f"base.{t}.link {link!r} not in {LINKS}")
        upper = p.get("upper", None if link == "beyond" else {})
        if not isinstance(upper, Mapping) or (link == "beyond" and set(upper) != set(spec["coef"])) \
                or not set(upper) <= set(spec["coef"]):
            raise ValueError(f"base.{t}.upper must give one value per coef feature")
        hi: dict[str, float] = {}
        for name, v in upper.items():
            try:
                hi[name] = float(v)
            except (TypeError, ValueError):
                raise ValueError(f"base.{t}.upper.{name} is not a number") from None
            if not np.isfinite(hi[name]):
                raise ValueError(f"base.{t}.upper.{name} is not finite")
        out[t] = {**spec, "link": link, "upper": hi}
        if link == "ratio":
            try:
                floor = float(p.get("floor"))
            except (TypeError, ValueError):
                raise ValueError(f"base.{t}.floor must be a number (link ratio)") from None
            if not (np.isfinite(floor) and floor > 0):
                raise ValueError(f"base.{t}.floor must be finite and > 0")
            out[t]["floor"] = floor
    return out


class LinearBase:
    """Evaluates linear descriptions per target on model matrices; coefficient vectors are
    aligned once per (target, column names), so applying one is a dot product per row."""

    def __init__(self, params: Mapping[str, Mapping]) -> None:
        self.params = {t: dict(p) for t, p in params.items()}
        self._w: dict[tuple[str, tuple[str, ...]], tuple[float, np.ndarray]] = {}

    def __contains__(self, target: str) -> bool:
        return target in self.params

    def weights(self, target: str, names: Sequence[str] | None = None) -> tuple[float, np.ndarray]:
        """(intercept, coefficient vector aligned to ``names``, default FEATURES[target])."""
        names = tuple(names or FEATURES[target])
        key = (target, names)
        w = self._w.get(key)
        if w is None:
            p = self.params[target]
            vec = np.zeros(len(names))
            for name, value in p["coef"].items():
                if name not in names:
                    raise ValueError(f"{target}: feature {name!r} is not among the model's columns")
                vec[names.index(name)] = value
            w = self._w[key] = (float(p["intercept"]), vec)
        return w

    def predict_matrix(self, x: np.ndarray, target: str, names: Sequence[str] | None = None) -> np.ndarray:
        """The linear value (not clipped) on a model matrix built for ``target`` with ``names``."""
        intercept, w = self.weights(target, names)
        return x @ w + intercept

    def growth(self, target: str, names: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(upper, coefficients) aligned to ``names`` for :func:`growth_beyond` (upper = +inf
        where the base has no coefficient)."""
        names = tuple(names or FEATURES[target])
        _, w = self.weights(target, names)
        hi = np.full(len(names), np.inf)
        for name, v in self.params[target].get("upper", {}).items():
            hi[names.index(name)] = v
        return hi, w


    def applier(self, target: str, names: Sequence[str] | None = None
                ) -> tuple[str, float, np.ndarray, np.ndarray, float]:
        """(link, intercept, upper, coefficients, floor), aligned to ``names``, for :func:`base_level`
        and :func:`with_base`."""
        intercept, w = self.weights(target, names)
        hi, _ = self.growth(target, names)
        p = self.params[target]
        return p.get("link", "add"), intercept, hi, w, float(p.get("floor", 0.0))


def growth_beyond(x: np.ndarray, upper: np.ndarray, w: np.ndarray) -> np.ndarray:
    """sum_j w_j * max(0, x_j - upper_j) per row: what the base adds past the range seen."""
    return np.maximum(x - upper, 0.0) @ w


def base_level(x: np.ndarray, link: str, intercept: float, upper: np.ndarray, w: np.ndarray,
               floor: float = 0.0) -> np.ndarray:
    """The base's value on model matrix ``x``: what it adds to the trees' output (``"beyond"``,
    ``"add"``) or what the trees' output multiplies (``"ratio"``, never below ``floor``)."""
    if link == "beyond":
        return growth_beyond(x, upper, w)
    level = x @ w + intercept
    return np.maximum(level, floor) if link == "ratio" else level


def with_base(trees: np.ndarray, x: np.ndarray, link: str, intercept: float, upper: np.ndarray, w: np.ndarray,
              floor: float = 0.0) -> np.ndarray:
    """The trees' output ``trees`` on model matrix ``x`` combined with the base (module docstring)."""
    level = base_level(x, link, intercept, upper, w, floor)
    return trees * level if link == "ratio" else trees + level


def upper_values(x: np.ndarray, names: Sequence[str], coef: Mapping[str, float]) -> dict[str, float]:
    """The largest value of each base feature in a model matrix (columns ``names``)."""
    return {n: float(x[:, list(names).index(n)].max()) if len(x) else 0.0 for n in coef}


class LinearPrior(LinearBase):
    """The prior: a validated LinearBase for both targets, clipped at zero."""

    def __init__(self, params: Mapping | None = None) -> None:
        super().__init__(validate_prior(params or DEFAULT_PRIOR))
        for t in self.params:
            self.weights(t)  # fail at load time, not on the first request

    def predict_matrix(self, x: np.ndarray, target: str, names: Sequence[str] | None = None) -> np.ndarray:
        return np.maximum(super().predict_matrix(x, target, names), 0.0)

    def predict(self, raw: np.ndarray, target: str) -> np.ndarray:
        return self.predict_matrix(model_matrix(raw, target), target)


def fit_linear_quantile(x: np.ndarray, y: np.ndarray, quantile: float, weights: np.ndarray | None = None,
                        non_negative: bool = True, min_rise: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """Linear quantile regression (pinball loss at ``quantile``, exact, by linear programming
    with HiGHS): returns (intercept, coefficients), both >= 0 when ``non_negative``. ``min_rise``
    (per column, ms): column j's coefficient is at least min_rise[j] / max |x_j| (it adds at
    least that much over the range seen; columns that never vary get no floor).

    Solved as the dual of the usual LP (min sum w_i (q u+_i + (1-q) u-_i) with
    X b + c + u+ - u- = y): one variable per row, boxed in [-(1-q) w_i, q w_i], and one
    constraint per column (``<= 0`` for a bounded coefficient, ``= 0`` for a free one); the
    coefficients are the constraints' multipliers. The same optimum as the primal, with
    p + 1 constraints instead of n, so about 20x faster on 4,000 rows."""
    from scipy.optimize import linprog

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n, p = x.shape
    scale = np.maximum(np.abs(x).max(axis=0), 1e-12) if n else np.ones(p)
    ys = max(float(np.abs(y).max()), 1e-12) if n else 1.0
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    floor = np.zeros(p) if min_rise is None else np.where(scale > 1e-12, np.asarray(min_rise, dtype=np.float64), 0.0)
    # lower bound per column (scaled units), then the intercept's; -inf = free. A positive floor
    # f / ys is the lower bound whether or not the signs are constrained (it is above 0).
    lo = 0.0 if non_negative else -np.inf
    lower = np.r_[np.where(floor > 0, floor / ys, lo), lo]
    if n == 0:  # nothing to fit: every coefficient at its bound (a free one at 0)
        sol = np.where(np.isfinite(lower), lower, 0.0)
    else:
        a = np.c_[x / scale, np.ones(n)]
        bounded = np.isfinite(lower)
        shift = np.where(bounded, lower, 0.0)  # b = shift + b', b' >= 0 where bounded
        r = y / ys - a @ shift
        res = linprog(-r, A_ub=a[:, bounded].T if bounded.any() else None,
                      b_ub=np.zeros(int(bounded.sum())) if bounded.any() else None,
                      A_eq=a[:, ~bounded].T if (~bounded).any() else None,
                      b_eq=np.zeros(int((~bounded).sum())) if (~bounded).any() else None,
                      bounds=np.c_[-(1.0 - quantile) * w, quantile * w], method="highs")
        if res.status != 0 or res.x is None:
            raise ValueError(f"linear quantile fit failed: {res.message}")
        sol = shift.copy()
        if bounded.any():
            sol[bounded] += np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
        if (~bounded).any():
            sol[~bounded] = -np.asarray(res.eqlin.marginals)
    sol = np.asarray(sol, dtype=np.float64)
    coef = np.maximum(sol[:p], 0.0) if non_negative else sol[:p]
    intercept = max(float(sol[p]), 0.0) if non_negative else float(sol[p])
    return intercept * ys, coef * ys / scale
