"""The bundle manifest as a typed, frozen value: parsed (and validated) once, read by attribute.

A manifest is JSON on disk (``manifest.json``, written by :func:`features.bundle.write_bundle`)
and on the wire (``GET /v1/bundles/latest``, ``GET /model/export``). :meth:`Manifest.from_json`
checks it (:func:`features.bundle.validate_manifest`: structure, numbers in range, lineage,
base) and builds the typed value; :meth:`Manifest.to_json` gives back the same keys and values.
:func:`build_manifest` is the one place a manifest is made from its parts (the trainer and the
demo bundles); the registry and the live recalibration derive new ones with
:meth:`Manifest.updated`.

Keys (JSON)::

    version          "v000042-20261202T124500Z" (sortable; the ETag)
    created_at       RFC 3339
    schema_version   int, features.schema.SCHEMA_VERSION at training time
    features         features.matrix.schema_description()                   -> Features
    model_kind       "xgboost" | "lightgbm" | "prior"   (prior: no model files)
    objective        "quantile" | "mean"
    quantile         float in (0, 1)
    mode             "streaming" | "e2e"
    models           {target: {"file", "format", "size", "sha256"}}          -> ModelFile
    prior            {target: {"intercept", "coef": {feature: w}}}            -> Linear (always present)
    base             {target: {"intercept", "coef", "link", "upper", ["floor"]}} -> Linear (optional: the
                     linear base a target's trees learn the residual over; see features.prior; a
                     target with a base and no model file is answered by the base alone, link "add")
    calibration      {target: {"offset_ms", "scale", "by_regime": {regime: {"offset_ms", "scale"}},
                               "n_calibration", "live_factor"}}               -> TargetCalibration
    training         {target: {"n_train", "n_test"}}                          -> Training
    metrics          {target: {"pinball" (ms), "coverage" (%), "mape" (%), "n", "residual_std" (ms),
                               "by_regime": {regime: {...}}}}                 -> Scores
    lineage          {"id": hex, "created_at": unix seconds}                  -> Lineage (optional: the
                     store the bundle was trained from; see prediction_server.acceptance)
    seeded_from      {"version", "lineage"}                                   -> SeededFrom (a seed import)
    trained_on       {"max_row_id", "stored_rows"}                            -> TrainedOn
    recipe           {"name", "seed", "train_seconds"}; recalibrated {"from", "factors", "live_factor"}
    engine           {"rows", "classes": {class: {"coefficients", "n_train", "n_heldout", "heldout_error",
                     "endpoints": {endpoint: {"speed", "n"}}}}} (optional: the engine twin's learned step
                     model, features.bundle.validate_engine)

Coverage is a percentage (share of actuals <= prediction x 100), as in every score of
:mod:`features.scoring`. Keys a reader does not know are kept (``extra``) and written back,
so a manifest from a newer trainer round-trips unchanged. A key given as ``null`` reads as
absent and is written back as ``null``.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import numpy as np

from .bundle import BundleError, sha256_bytes, validate_manifest
from .matrix import TARGETS, schema_description
from .schema import SCHEMA_VERSION

R = TypeVar("R", bound="Record")


def freeze(value: Any) -> Any:
    """JSON as an immutable value: objects -> read-only mappings, arrays -> tuples."""
    if isinstance(value, Record):
        return value
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Inverse of :func:`freeze` (records become their JSON)."""
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def jsonable(obj: Any) -> Any:
    """NaN/inf -> None, numpy scalars -> Python (manifests are strict JSON)."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Record:
    """A JSON object with typed fields: a field left None is absent from the JSON; keys
    without a field (and fields given as null) are kept in ``extra``."""

    #: field name -> parser of its JSON value (nested records); others are frozen JSON
    NESTED: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}
    #: keys without a field, and fields given as null (kept to be written back)
    extra: Mapping[str, Any] = field(default_factory=_empty, kw_only=True)

    @classmethod
    def from_json(cls: type[R], obj: Mapping[str, Any]) -> R:
        if not isinstance(obj, Mapping):
            raise BundleError(f"{cls.__name__}: expected a JSON object, got {type(obj).__name__}")
        names = {f.name for f in fields(cls)} - {"extra"}
        kw: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for k, v in obj.items():
            if k in names and v is not None:
                parse = cls.NESTED.get(k)
                kw[k] = parse(v) if parse else freeze(v)
            else:
                extra[k] = freeze(v)
        try:
            return cls(**kw, extra=MappingProxyType(extra))
        except TypeError as e:  # a required key missing
            raise BundleError(f"{cls.__name__}: {e}") from None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "extra" and v is not None:
                out[f.name] = thaw(v)
        for k, v in self.extra.items():
            out.setdefault(k, thaw(v))
        return out


def per_key(cls: type[Record]) -> Callable[[Any], Mapping[str, Any]]:
    """Parser of ``{key: object}`` into a read-only mapping of ``cls`` records."""
    def parse(obj: Any) -> Mapping[str, Any]:
        if not isinstance(obj, Mapping):
            raise BundleError(f"expected an object of {cls.__name__} entries")
        return MappingProxyType({str(k): cls.from_json(v) for k, v in obj.items()})
    return parse


@dataclass(frozen=True)
class ModelFile(Record):
    file: str
    format: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Linear(Record):
    """A prior or base entry (features.prior): intercept ms, coefficients, link and upper (base)."""
    intercept: float | None = None
    coef: Mapping[str, float] | None = None
    link: str | None = None
    upper: Mapping[str, float] | None = None
    floor: float | None = None  # link "ratio": the least base level the trees' ratio multiplies


@dataclass(frozen=True)
class RegimeCalibration(Record):
    offset_ms: float | None = None  # None: the target's global value
    scale: float | None = None


@dataclass(frozen=True)
class TargetCalibration(Record):
    """``y * scale + offset_ms`` on the raw model output, optionally per load regime."""
    offset_ms: float | None = None
    scale: float | None = None
    by_regime: Mapping[str, RegimeCalibration] | None = None
    n_calibration: int | None = None
    live_factor: float | None = None  # the live correction it carries (1 when absent)
    NESTED: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"by_regime": per_key(RegimeCalibration)}

    @property
    def factor(self) -> float:
        return 1.0 if self.scale is None else float(self.scale)

    @property
    def offset(self) -> float:
        return 0.0 if self.offset_ms is None else float(self.offset_ms)

    @property
    def live(self) -> float:
        return 1.0 if self.live_factor is None else float(self.live_factor)


@dataclass(frozen=True)
class Scores(Record):
    """Held-out scores of one target (features.scoring.evaluate_bundle)."""
    pinball: float | None = None
    coverage: float | None = None  # percent
    mape: float | None = None
    n: int | None = None
    residual_std: float | None = None
    by_regime: Mapping[str, Scores] | None = None


Scores.NESTED = {"by_regime": per_key(Scores)}  # set after the class: self-referential


@dataclass(frozen=True)
class Training(Record):
    n_train: int | None = None
    n_test: int | None = None


@dataclass(frozen=True)
class Lineage(Record):
    id: str
    created_at: float


@dataclass(frozen=True)
class SeededFrom(Record):
    """The seed bundle a registry started from, by identity (older versions also wrote the
    seed's local ``path``: dropped when read, it is never served)."""
    version: str
    lineage: Lineage | None = None
    NESTED: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"lineage": Lineage.from_json}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SeededFrom:
        if isinstance(obj, Mapping) and "path" in obj:
            obj = {k: v for k, v in obj.items() if k != "path"}
        return super().from_json(obj)


@dataclass(frozen=True)
class TrainedOn(Record):
    max_row_id: int | None = None  # newest store row the bundle was trained on
    stored_rows: int | None = None


@dataclass(frozen=True)
class Features(Record):
    schema_version: int | None = None
    feature_set: str | None = None
    raw_columns: tuple[str, ...] | None = None
    features: Mapping[str, tuple[str, ...]] | None = None  # per target, the model's columns


@dataclass(frozen=True)
class Manifest(Record):
    """A validated bundle manifest (see the module docstring for its JSON)."""
    version: str
    schema_version: int
    model_kind: str
    objective: str
    quantile: float
    mode: str
    models: Mapping[str, ModelFile]
    prior: Mapping[str, Linear]
    created_at: str | None = None
    features: Features | None = None
    base: Mapping[str, Linear] | None = None
    calibration: Mapping[str, TargetCalibration] | None = None
    training: Mapping[str, Training] | None = None
    metrics: Mapping[str, Scores] | None = None
    lineage: Lineage | None = None
    seeded_from: SeededFrom | None = None
    trained_on: TrainedOn | None = None
    recipe: Mapping[str, Any] | None = None
    recalibrated: Mapping[str, Any] | None = None
    engine: Mapping[str, Any] | None = None
    NESTED: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "models": per_key(ModelFile), "prior": per_key(Linear), "base": per_key(Linear),
        "calibration": per_key(TargetCalibration), "training": per_key(Training), "metrics": per_key(Scores),
        "features": Features.from_json, "lineage": Lineage.from_json, "seeded_from": SeededFrom.from_json,
        "trained_on": TrainedOn.from_json}

    @classmethod
    def from_json(cls, obj: Any) -> Manifest:
        """Validate (BundleError naming the bad key) and parse a manifest's JSON."""
        return super().from_json(validate_manifest(obj))

    def updated(self, **changes: Any) -> Manifest:
        """This manifest with top-level keys replaced by JSON values (None removes a key),
        validated again."""
        obj = self.to_json()
        for k, v in changes.items():
            if v is None:
                obj.pop(k, None)
            else:
                obj[k] = thaw(v)
        return Manifest.from_json(obj)

    # ---- reading -----------------------------------------------------------------------
    @property
    def targets(self) -> tuple[str, ...]:
        """Targets with a model file, in TARGETS order."""
        return tuple(t for t in TARGETS if t in self.models)

    @property
    def learned_targets(self) -> tuple[str, ...]:
        """Targets a learned model answers, in TARGETS order: trees (a model file, over a base or
        not) or a base alone; the others are answered by the prior."""
        return tuple(t for t in TARGETS if t in self.models or t in (self.base or {}))

    def base_only(self, target: str) -> bool:
        """``target`` is answered by its linear base alone (no model file)."""
        return target not in self.models and target in (self.base or {})

    @property
    def model_bytes(self) -> int:
        """Total size of the model files, as declared."""
        return sum(int(spec.size) for spec in self.models.values())

    def feature_names(self, target: str) -> tuple[str, ...] | None:
        """The model's columns for ``target`` (None: the schema's default)."""
        names = (self.features.features or {}).get(target) if self.features else None
        return None if names is None else tuple(names)

    def calibration_of(self, target: str) -> TargetCalibration | None:
        return (self.calibration or {}).get(target)

    def scores(self, target: str) -> Scores | None:
        return (self.metrics or {}).get(target)

    def residual_std(self, target: str) -> float:
        s = self.scores(target)
        return 0.0 if s is None or s.residual_std is None else float(s.residual_std)

    def n_train(self, target: str) -> int:
        t = (self.training or {}).get(target)
        return 0 if t is None or t.n_train is None else int(t.n_train)

    @property
    def trained_max_row_id(self) -> int:
        """Newest store row id this bundle was trained on (0 when unknown)."""
        return int(self.trained_on.max_row_id or 0) if self.trained_on else 0

    def metrics_json(self) -> dict[str, dict]:
        """The held-out scores as JSON ({target: {...}})."""
        return {t: s.to_json() for t, s in (self.metrics or {}).items()}

    def prior_json(self) -> dict[str, dict]:
        return {t: p.to_json() for t, p in self.prior.items()}

    def base_json(self) -> dict[str, dict]:
        return {t: b.to_json() for t, b in (self.base or {}).items()}


def build_manifest(*, version: str, model_kind: str, quantile: float, mode: str, prior: Mapping[str, Mapping],
                   models: Mapping[str, tuple[str, str]], files: Mapping[str, bytes], objective: str = "quantile",
                   feature_set: str = "default", created_at: str | None = None, base: Mapping | None = None,
                   calibration: Mapping | None = None, training: Mapping | None = None,
                   metrics: Mapping | None = None, lineage: Mapping | None = None,
                   extra: Mapping | None = None) -> Manifest:
    """The one manifest builder. ``models``: target -> (file name, format), the file's bytes in
    ``files`` (size and sha256 come from them); ``metrics`` and ``extra`` (more top-level keys)
    are made strict JSON (NaN -> null); the result is validated."""
    obj: dict[str, Any] = {
        "version": version,
        "created_at": created_at or datetime.now(UTC).isoformat(),
        "schema_version": SCHEMA_VERSION,
        "features": schema_description(feature_set),
        "model_kind": model_kind,
        "objective": objective,
        "quantile": quantile,
        "mode": mode,
        "models": {t: {"file": name, "format": fmt, "size": len(files[name]), "sha256": sha256_bytes(files[name])}
                   for t, (name, fmt) in models.items()},
        "prior": thaw(prior),
    }
    for key, value in (("base", base), ("calibration", calibration), ("training", training),
                       ("lineage", lineage)):
        if value is not None:
            obj[key] = thaw(value)
    if metrics is not None:
        obj["metrics"] = jsonable(dict(metrics))
    obj.update(jsonable(dict(extra or {})))
    return Manifest.from_json(obj)
