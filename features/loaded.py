"""The model runtime: a verified bundle (or the built-in prior) turned into predictions.

Shared by the prediction server (hot path) and the training server (``POST /predict``, the
publish gate); the manifest it serves from is a typed :class:`features.manifest.Manifest`.
Models are loaded from their native formats only (XGBoost UBJSON/JSON, LightGBM text),
each with one thread: servers scale by process, never by OpenMP threads.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .bundle import BundleError
from .manifest import Linear, Manifest, TargetCalibration
from .matrix import REGIME_NAMES, TARGETS, model_matrix, regimes
from .prior import DEFAULT_PRIOR, LinearBase, LinearPrior, base_level, validate_base, with_base
from .schema import SCHEMA_VERSION, parse_row

# z for a two-sided 90% band around the prediction when reporting bounds
_Z = 1.645


def probe_rows() -> np.ndarray:
    """One ordinary row per load regime (queue empty/queued x KV below/above 80%, in
    REGIME_NAMES order): the rows a bundle must answer before it is served."""
    rows = [parse_row({"kv_cache_percentage": kv, "input_token_length": 512, "num_request_waiting": waiting,
                       "num_request_running": 4, "num_tokens_generated": 16, "prefix_cache_score": 0.25})
            for kv in (0.3, 0.9) for waiting in (0, 3)]
    return np.array(rows, dtype=np.float64)


def _load_xgboost(data: bytes, fmt: str):
    import xgboost as xgb

    booster = xgb.Booster(params={"nthread": 1})
    booster.load_model(bytearray(data))
    booster.set_param({"nthread": 1})

    def predict(x: np.ndarray) -> np.ndarray:
        return np.asarray(booster.inplace_predict(x), dtype=np.float64).reshape(-1)

    return _xgboost_dense_predictor(booster, predict)


def _xgboost_dense_predictor(booster, fallback):
    """The same in-place prediction as ``Booster.inplace_predict`` (C API
    ``XGBoosterPredictFromDense``) without its per-call Python overhead (about half of
    the cost for a 16-row batch), into a proxy matrix kept per thread (a new one per call
    reads the cgroup CPU quota files each time). Checked against ``fallback`` on probe rows
    at load time; any mismatch or API difference keeps ``fallback``."""
    import ctypes
    import json
    import threading

    try:
        from xgboost.core import _LIB, _ProxyDMatrix, c_bst_ulong

        fn = _LIB.XGBoosterPredictFromDense
        handle = booster.handle
        n_features = booster.num_features()
    except Exception:  # a future xgboost without these names: keep the public API
        return fallback
    local = threading.local()   # .proxy: this thread's (a proxy holds the data of the call in progress)
    args = json.dumps({"type": 0, "training": False, "iteration_begin": 0, "iteration_end": 0,
                       "missing": float("nan"), "strict_shape": False, "cache_id": 0}).encode()
    byref = ctypes.byref
    c_float_p = ctypes.POINTER(ctypes.c_float)
    shape_p = ctypes.POINTER(c_bst_ulong)

    def predict(x: np.ndarray) -> np.ndarray:
        if x.dtype != np.float64 or not x.flags.c_contiguous or x.ndim != 2 or x.shape[1] != n_features:
            return fallback(x)
        n = x.shape[0]
        ai = b'{"data": [%d, true], "shape": [%d, %d], "strides": null, "typestr": "<f8", "version": 3}' % (
            x.ctypes.data, n, n_features)
        shape, dims, preds = shape_p(), c_bst_ulong(), c_float_p()
        proxy = getattr(local, "proxy", None)
        if proxy is None:
            proxy = local.proxy = _ProxyDMatrix()
        if fn(handle, ai, args, proxy.handle, byref(shape), byref(dims), byref(preds)) != 0:
            return fallback(x)
        if dims.value != 1 or shape[0] != n:
            return fallback(x)
        # copy out: the buffer belongs to the booster and is reused by the next call
        return np.ctypeslib.as_array(preds, (n,)).astype(np.float64)

    probe = np.linspace(0.0, 4096.0, 8 * n_features).reshape(8, n_features)
    try:
        same = np.array_equal(predict(probe), fallback(probe))
    except Exception:
        same = False
    return predict if same else fallback


def _load_lightgbm(data: bytes, fmt: str):
    import lightgbm as lgb

    booster = lgb.Booster(model_str=data.decode("utf-8"), params={"num_threads": 1})

    def predict(x: np.ndarray) -> np.ndarray:
        return np.asarray(booster.predict(x, num_threads=1), dtype=np.float64).reshape(-1)

    return predict


_LOADERS = {"xgboost": _load_xgboost, "lightgbm": _load_lightgbm}


@dataclass
class Calibration:
    """A target's calibration (:class:`features.manifest.TargetCalibration`) ready to apply:
    a regime without its own entry uses the global scale and offset."""

    scale: float = 1.0
    offset: float = 0.0
    regime_scale: np.ndarray | None = None
    regime_offset: np.ndarray | None = None

    @classmethod
    def from_spec(cls, spec: TargetCalibration | None) -> Calibration:
        if spec is None:
            return cls()
        cal = cls(spec.factor, spec.offset)
        by = spec.by_regime or {}
        if by:
            regs = [by.get(r) for r in REGIME_NAMES]
            cal.regime_scale = np.array([cal.scale if r is None or r.scale is None else float(r.scale)
                                         for r in regs])
            cal.regime_offset = np.array([cal.offset if r is None or r.offset_ms is None else float(r.offset_ms)
                                          for r in regs])
        values = [cal.scale, cal.offset]
        if cal.regime_scale is not None and cal.regime_offset is not None:
            values += [*cal.regime_scale.tolist(), *cal.regime_offset.tolist()]
        if not np.isfinite(values).all():
            raise BundleError("calibration values must be finite")
        return cal

    def apply(self, y: np.ndarray, raw: np.ndarray) -> np.ndarray:
        if self.regime_scale is not None and self.regime_offset is not None:
            idx = regimes(raw)
            return y * self.regime_scale[idx] + self.regime_offset[idx]
        if self.scale == 1.0 and self.offset == 0.0:
            return y
        return y * self.scale + self.offset


@dataclass
class LoadedBundle:
    """An immutable, ready-to-serve model set. Swapped atomically by reference."""

    version: str
    source: str  # "learned" | "prior"
    model_kind: str
    objective: str
    quantile: float
    manifest: Manifest
    loaded_at: float = field(default_factory=time.time)
    _predictors: dict = field(default_factory=dict, repr=False)
    _prior: LinearPrior = field(default_factory=LinearPrior, repr=False)
    _calibration: dict = field(default_factory=dict, repr=False)
    _uncertainty: dict = field(default_factory=dict, repr=False)
    _names: dict = field(default_factory=dict, repr=False)
    #: per target with a base: (link, intercept, upper, coefficients), aligned to the model's columns
    _base: dict = field(default_factory=dict, repr=False)

    @classmethod
    def builtin_prior(cls, quantile: float = 0.9) -> LoadedBundle:
        """The analytic default used before any bundle exists (version ``prior-default``)."""
        manifest = Manifest(version="prior-default", schema_version=SCHEMA_VERSION, model_kind="prior",
                            objective="quantile", quantile=quantile, mode="streaming", models=MappingProxyType({}),
                            prior=MappingProxyType({t: Linear.from_json(p) for t, p in DEFAULT_PRIOR.items()}))
        return cls(version="prior-default", source="prior", model_kind="prior", objective="quantile",
                   quantile=quantile, manifest=manifest)

    @classmethod
    def from_files(cls, manifest: Manifest | Mapping, files: Mapping[str, bytes]) -> LoadedBundle:
        """Build from a manifest (typed, or JSON to validate) and its (already
        size/sha256-verified) model files."""
        m = manifest if isinstance(manifest, Manifest) else Manifest.from_json(manifest)
        predictors = {}
        for target, spec in m.models.items():
            data = files.get(spec.file)
            if data is None:
                raise BundleError(f"model file {spec.file} missing")
            try:
                predictors[target] = _LOADERS[m.model_kind](data, spec.format)
            except BundleError:
                raise
            except Exception as e:  # native loaders raise library-specific errors
                raise BundleError(f"cannot load {spec.file}: {e}") from None
        calibration = {t: Calibration.from_spec(m.calibration_of(t)) for t in TARGETS}
        uncertainty = {t: m.residual_std(t) for t in TARGETS}
        if not all(np.isfinite(u) and u >= 0 for u in uncertainty.values()):
            raise BundleError(f"bundle {m.version}: residual spreads must be finite and >= 0")
        names = {t: n for t in TARGETS if (n := m.feature_names(t)) is not None}
        base = LinearBase(validate_base(m.base_json()))
        try:
            base_w = {t: base.applier(t, names.get(t)) for t in base.params}
        except ValueError as e:
            raise BundleError(f"manifest.base.{e}") from None
        bundle = cls(version=m.version, source="learned" if predictors or base_w else "prior",
                     model_kind=m.model_kind, objective=m.objective, quantile=float(m.quantile),
                     manifest=m, _predictors=predictors, _prior=LinearPrior(m.prior_json()),
                     _calibration=calibration, _uncertainty=uncertainty, _names=names, _base=base_w)
        bundle.smoke_test()
        return bundle

    def smoke_test(self) -> None:
        """A bundle that cannot answer an ordinary row in every load regime with a finite,
        positive latency is not served (BundleError naming the target and regime)."""
        probe = probe_rows()
        assert sorted(regimes(probe).tolist()) == list(range(len(REGIME_NAMES)))
        for t, y in zip(TARGETS, self.predict(probe)):
            if y.shape != (len(probe),):
                raise BundleError(f"bundle {self.version}: {t} model answers {y.shape} for {len(probe)} rows")
            for regime, v in zip(regimes(probe), y.tolist()):
                if not (np.isfinite(v) and v > 0):
                    raise BundleError(f"bundle {self.version}: {t} prediction {v!r} in regime "
                                      f"{REGIME_NAMES[regime]} is not a finite positive latency")

    def has_model(self, target: str) -> bool:
        """A learned model answers ``target``: trees (over a base or not) or a base alone."""
        return target in self._predictors or target in self._base

    def predict(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predict (ttft_ms, tpot_ms) for a raw matrix; never negative."""
        out = []
        for target in TARGETS:
            predictor = self._predictors.get(target)
            base = self._base.get(target)
            if predictor is None and base is None:
                y = self._prior.predict(raw, target)
            else:
                x = model_matrix(raw, target, self._names.get(target))
                # trees over the base (past the largest work seen in training it keeps growing);
                # without trees, the base alone (link "add": intercept + x . coef)
                if predictor is None:
                    assert base is not None
                    y = base_level(x, *base)
                else:
                    y = predictor(x)
                    if base is not None:
                        y = with_base(y, x, *base)
                y = self._calibration[target].apply(y, raw)
            out.append(np.maximum(y, 0.0))
        return out[0], out[1]

    def uncertainty(self, target: str) -> float:
        return self._uncertainty.get(target, 0.0)

    @property
    def bound_width(self) -> float:
        return _Z
