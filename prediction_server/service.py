"""The prediction service as a plain Python object (no HTTP): bytes in, (status, bytes) out.

Every prediction method reads the served state (bundle + constant response fields) once,
through one reference, so all rows of a response come from the same bundle even if a
swap happens meanwhile. Swapping is a single reference assignment (:meth:`swap`),
guarded by the acceptance rule of :mod:`prediction_server.acceptance` (lineage, version,
never a prior-only bundle over a learned model).
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from features.loaded import LoadedBundle
from features.manifest import Manifest
from features.matrix import raw_matrix
from features.render import PredictionFields, rfc3339
from features.schema import COL, RAW_COLUMNS, FieldError, parse_row

from .acceptance import Rank, refusal
from .metrics import Metrics
from .settings import Settings, redact_url

log = logging.getLogger("prediction_server")

JSON = "application/json"
_WHATIF_KEYS = ("request", "grid", "max_points")  # the what-if body's fields


class HTTPError(Exception):
    """An error answer: status and a FastAPI-style ``detail``."""

    def __init__(self, status: int, detail: Any, headers: dict | None = None) -> None:
        self.status = status
        self.detail = detail
        self.headers = headers or {}
        super().__init__(f"{status}: {detail}")

    def body(self) -> bytes:
        return orjson.dumps({"detail": self.detail})


def field_error(loc: list, msg: str, kind: str = "value_error") -> HTTPError:
    return HTTPError(422, [{"loc": loc, "msg": msg, "type": kind}])


@dataclass(frozen=True)
class Served:
    """The served bundle, its acceptance rank and its precomputed prediction-object fields."""

    bundle: LoadedBundle
    rank: Rank  # what prediction_server.acceptance compares
    learned: bool
    fields: PredictionFields

    @classmethod
    def of(cls, bundle: LoadedBundle) -> Served:
        learned = bundle.source == "learned"
        return cls(bundle, Rank.of(bundle.manifest, bundle.version, learned), learned, PredictionFields.of(bundle))

    @property
    def model_type(self) -> str:
        return self.fields.model_type

    @property
    def last_model_load(self) -> str:
        return self.fields.last_model_load

    def render(self, ttft: np.ndarray, tpot: np.ndarray, predicted_at: str) -> list[dict]:
        """Prediction objects (docs/wire-api.md §1.2 ``p``) for arrays of predictions."""
        return self.fields.render(ttft, tpot, predicted_at)


def _loads(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise field_error(["body"], f"body is not valid JSON: {e}", "json_invalid") from None


def _requests_list(body: bytes, max_rows: int) -> list:
    obj = _loads(body)
    if type(obj) is not dict:
        raise field_error(["body"], f"body must be a JSON object with a 'requests' list, got {type(obj).__name__}",
                          "type_error")
    rows = obj.get("requests")
    if rows is None:
        raise field_error(["body", "requests"], "field required", "missing")
    if type(rows) is not list:
        raise field_error(["body", "requests"], f"must be a list of rows, got {type(rows).__name__}", "type_error")
    n = len(rows)
    if n == 0:
        raise field_error(["body", "requests"], "must contain at least 1 row", "too_short")
    if n > max_rows:
        raise field_error(["body", "requests"], f"must contain at most {max_rows} rows, got {n}", "too_long")
    return rows


def _echo(row: Any) -> Any:
    """A bad row as its error entry shows it: flat, never the client's nesting (a deeply
    nested row would exceed the JSON encoder's depth). Nested values are replaced by a
    marker naming their type; the error's ``loc`` names the field at fault."""
    if type(row) is dict:
        return {k: v if v is None or type(v) in (str, int, float, bool) else f"<{type(v).__name__} omitted>"
                for k, v in row.items()}
    if row is None or type(row) in (str, int, float, bool):
        return row
    return f"<{type(row).__name__} omitted>"


class PredictionService:
    """Predictions, status and bundle swapping; the HTTP layer is a thin adapter over this."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._swap_lock = threading.Lock()
        self._served = Served.of(LoadedBundle.builtin_prior(settings.quantile_alpha))
        self._publish(self._served)
        self._refuse = settings.refuse_without_model
        self._max_rows = settings.max_batch_rows

    # ---- bundle -------------------------------------------------------------------------
    @property
    def served(self) -> Served:
        return self._served

    @property
    def bundle(self) -> LoadedBundle:
        return self._served.bundle

    def refusal(self, manifest: Manifest) -> str | None:
        """Why a bundle with this (validated) manifest would not replace the served one
        (``prediction_server.acceptance``), or None when it would."""
        return refusal(self._served.rank, Rank.of_manifest(manifest))

    def swap(self, bundle: LoadedBundle) -> bool:
        """Serve ``bundle`` if the acceptance rule lets it replace the served one; True when
        swapped. A refusal is logged at info (it is not a failure)."""
        new = Served.of(bundle)
        with self._swap_lock:
            old = self._served
            why = refusal(old.rank, new.rank)
            if why is None:
                self._served = new  # the atomic swap: one reference assignment
        if why is not None:
            log.info("bundle refused: %s; keeping %s", why, old.bundle.version)
            return False
        self._publish(new)
        self.metrics.swaps.inc()
        log.info("serving bundle %s (%s, %s) instead of %s", bundle.version, bundle.source, new.model_type,
                 old.bundle.version)
        return True

    def _publish(self, s: Served) -> None:
        b = s.bundle
        self.metrics.served(b.version, b.source, s.model_type, b.objective, b.quantile, b.loaded_at)

    def is_ready(self) -> bool:
        return self._served.learned

    # ---- predictions --------------------------------------------------------------------
    def predict_strict(self, body: bytes) -> tuple[int, bytes]:
        """``POST /predict/bulk/strict``: any bad row fails the call (422)."""
        return self._answer("/predict/bulk/strict", self._strict, body)

    def predict_bulk(self, body: bytes) -> tuple[int, bytes]:
        """``POST /predict/bulk``: bad rows become ``null`` plus an entry in ``errors``."""
        return self._answer("/predict/bulk", self._bulk, body)

    def predict_one(self, body: bytes) -> tuple[int, bytes]:
        """``POST /predict``: the body is one row; answers one prediction object."""
        return self._answer("/predict", self._one, body)

    def whatif(self, body: bytes) -> tuple[int, bytes]:
        """``POST /v1/whatif``: predictions for every combination of a grid of field values."""
        return self._answer("/v1/whatif", self._whatif, body)

    def _answer(self, endpoint: str, fn, body: bytes) -> tuple[int, bytes]:
        """Run ``fn(body, served) -> (response dict, rows)`` with one bundle reference; add
        ``processing_time_ms``, serialize, count. Errors become their status and detail."""
        t0 = time.perf_counter()
        served = self._served  # the one bundle reference used for the whole response
        try:
            if self._refuse and not served.learned:
                raise HTTPError(503, "no learned model loaded yet (LATENCY_REFUSE_WITHOUT_MODEL=true)")
            out, n = fn(body, served)
        except HTTPError as e:
            self.metrics.count(endpoint, e.status)
            return e.status, e.body()
        dt = time.perf_counter() - t0
        out["processing_time_ms"] = dt * 1000.0
        payload = orjson.dumps(out)
        self.metrics.observe(endpoint, 200, dt, n, served.bundle.source)
        return 200, payload

    def _strict_raw(self, body: bytes, served: Served) -> np.ndarray:
        """Validate a strict body into a raw matrix (HTTPError 503/422 otherwise)."""
        if self._refuse and not served.learned:
            raise HTTPError(503, "no learned model loaded yet (LATENCY_REFUSE_WITHOUT_MODEL=true)")
        rows = _requests_list(body, self._max_rows)
        try:
            return raw_matrix(rows, "requests")
        except FieldError as e:
            raise HTTPError(422, [e.to_detail(("body",))]) from None

    @staticmethod
    def _strict_out(served: Served, ttft: np.ndarray, tpot: np.ndarray, predicted_at: str) -> dict:
        preds = served.render(ttft, tpot, predicted_at)
        n = len(preds)
        return {"predictions": preds, "total_requests": n, "successful_predictions": n, "failed_predictions": 0,
                "processing_time_ms": 0.0, "model_version": served.bundle.version,
                "model_source": served.bundle.source}

    def _strict(self, body: bytes, served: Served) -> tuple[dict, int]:
        raw = self._strict_raw(body, served)
        ttft, tpot = served.bundle.predict(raw)
        out = self._strict_out(served, ttft, tpot, rfc3339(time.time()))
        return out, out["total_requests"]

    def _bulk(self, body: bytes, served: Served) -> tuple[dict, int]:
        rows = _requests_list(body, self._max_rows)
        good: list[list[float]] = []
        good_idx: list[int] = []
        errors = []
        for i, row in enumerate(rows):
            try:
                good.append(parse_row(row, ("requests", i)))
                good_idx.append(i)
            except FieldError as e:
                errors.append({"index": i, "error": str(e), "loc": e.to_detail(("body",))["loc"],
                               "request": _echo(row)})
        preds: list = [None] * len(rows)
        if good:
            raw = np.array(good, dtype=np.float64).reshape(len(good), len(RAW_COLUMNS))
            ttft, tpot = served.bundle.predict(raw)
            for i, p in zip(good_idx, served.render(ttft, tpot, rfc3339(time.time()))):
                preds[i] = p
        return {"predictions": preds, "errors": errors, "total_requests": len(rows),
                "successful_predictions": len(good), "failed_predictions": len(errors), "processing_time_ms": 0.0,
                "model_version": served.bundle.version, "model_source": served.bundle.source}, len(good)

    def _one(self, body: bytes, served: Served) -> tuple[dict, int]:
        obj = _loads(body)
        try:
            raw = np.array([parse_row(obj, ())], dtype=np.float64)
        except FieldError as e:
            raise HTTPError(422, [e.to_detail(("body",))]) from None
        ttft, tpot = served.bundle.predict(raw)
        return served.render(ttft, tpot, rfc3339(time.time()))[0], 1

    def _whatif(self, body: bytes, served: Served) -> tuple[dict, int]:
        base, names, choices, is_list = self._whatif_body(_loads(body))
        raw_rows = []
        points_values = []
        for idx in itertools.product(*[range(len(c)) for c in choices]):
            row = dict(base)
            values = {}
            for name, c, j in zip(names, choices, idx):
                row[name] = values[name] = c[j]
            try:
                raw_rows.append(parse_row(row, ()))
            except FieldError as e:
                f = e.loc[0]
                if f in values:
                    k = names.index(f)
                    loc = ["body", "grid", f] + ([idx[k]] if is_list[k] else [])
                else:
                    loc = ["body", "request", f]
                raise field_error(loc, e.msg, e.kind) from None
            points_values.append(values)
        raw = np.array(raw_rows, dtype=np.float64).reshape(len(raw_rows), len(RAW_COLUMNS))
        ttft, tpot = served.bundle.predict(raw)
        points = [{"values": v, "ttft_ms": a, "tpot_ms": b}
                  for v, a, b in zip(points_values, ttft.tolist(), tpot.tolist())]
        return {"points": points, "n_points": len(points), "grid_fields": names,
                "model_version": served.bundle.version, "model_source": served.bundle.source,
                "model_type": served.model_type, "objective_type": served.bundle.objective,
                "quantile": served.bundle.quantile}, len(points)

    def _whatif_body(self, obj: Any) -> tuple[dict, list[str], list[list], list[bool]]:
        if type(obj) is not dict:
            raise field_error(["body"], f"body must be a JSON object, got {type(obj).__name__}", "type_error")
        for key in obj:  # a typo would otherwise be ignored silently (the what-if is this project's own API)
            if key not in _WHATIF_KEYS:
                raise field_error(["body", key], f"unknown field; the body's fields are {list(_WHATIF_KEYS)}",
                                  "value_error")
        base = obj.get("request", {})
        if base is None:
            base = {}
        if type(base) is not dict:
            raise field_error(["body", "request"], f"must be an object (a partial row), got {type(base).__name__}",
                              "type_error")
        for name in base:
            if name not in COL:
                raise field_error(["body", "request", name], f"unknown field; row fields are {list(RAW_COLUMNS)}",
                                  "value_error")
        grid = obj.get("grid", {})
        if grid is None:
            grid = {}
        if type(grid) is not dict:
            raise field_error(["body", "grid"], f"must be an object {{field: value or [values]}}, "
                                                f"got {type(grid).__name__}", "type_error")
        max_points = obj.get("max_points", self._max_rows)
        if type(max_points) is not int or not 1 <= max_points <= self._max_rows:
            raise field_error(["body", "max_points"], f"must be an integer between 1 and {self._max_rows}",
                              "range_error")
        names, choices, is_list = [], [], []
        total = 1
        for name, value in grid.items():
            if name not in COL:
                raise field_error(["body", "grid", name], f"unknown field; row fields are {list(RAW_COLUMNS)}",
                                  "value_error")
            lst = type(value) is list
            values = value if lst else [value]
            if not values:
                raise field_error(["body", "grid", name], "must not be an empty list", "too_short")
            names.append(name)
            choices.append(values)
            is_list.append(lst)
            total *= len(values)
            if total > max_points:
                raise field_error(["body", "grid"], f"the grid has more than max_points={max_points} combinations; "
                                                    "narrow it or raise max_points", "too_long")
        return base, names, choices, is_list

    # ---- status -------------------------------------------------------------------------
    def status(self) -> dict:
        s = self._served
        b = s.bundle
        return {"is_ready": s.learned, "model_type": s.model_type, "objective_type": b.objective,
                "quantile": b.quantile, "last_model_load": s.last_model_load,
                "training_server_url": redact_url(self.settings.training_server_url) or None,
                "models_exist": {"ttft": b.has_model("ttft"), "tpot": b.has_model("tpot")},
                "model_version": b.version, "model_source": b.source,
                "bundle_dir": self.settings.bundle_dir}
