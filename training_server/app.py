"""HTTP layer of the training server (docs/wire-api.md §1.3 and §2): thin over plain objects.

:class:`TrainingService` holds the store, registry, worker and metrics and does the work
(testable without a server); :func:`create_app` maps routes onto it. Bodies are parsed
with orjson from raw bytes (no pydantic per row); request schemas for OpenAPI come from
``features.schema``.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from features.schema import FieldError, parse_row, parse_training_entry, row_json_schema, \
    training_entry_json_schema
from features.apidocs import install_api_docs
from features.matrix import TARGETS
from prediction_server.model import LoadedBundle

from .metrics import TrainingMetrics
from .registry import Registry
from .settings import Settings
from .store import SampleStore, Saturated, StoreClosed, entries_to_rows
from .trainer import TrainConfig
from .worker import RetrainWorker

log = logging.getLogger("training_server.app")

MAX_ERRORS_REPORTED = 10
#: Bodies larger than this are parsed in a worker thread, so a huge batch (up to
#: LATENCY_MAX_BODY_BYTES) never stalls the event loop for other requests.
PARSE_IN_THREAD_BYTES = 64 * 1024


class HTTPProblem(Exception):
    """An error answer: status, FastAPI-style detail, extra headers."""

    def __init__(self, status: int, detail: Any, headers: dict | None = None) -> None:
        self.status = status
        self.detail = detail
        self.headers = headers or {}


def _field_problem(loc: list, msg: str, kind: str = "value_error", status: int = 422) -> HTTPProblem:
    return HTTPProblem(status, [{"loc": loc, "msg": msg, "type": kind}])


def _orjson_body(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise _field_problem(["body"], f"body is not valid JSON: {e}", "json_invalid") from None


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


def prediction_object(bundle: LoadedBundle, ttft: float, tpot: float, now: float | None = None) -> dict:
    """One prediction ``p`` (wire-api §1.2) plus model_version and model_source."""
    now = time.time() if now is None else now
    out: dict[str, Any] = {}
    for t, y in (("ttft", ttft), ("tpot", tpot)):
        u = bundle.uncertainty(t)
        out[f"{t}_ms"] = float(y)
        out[f"{t}_uncertainty"] = u
        out[f"{t}_prediction_bounds"] = [max(0.0, float(y) - bundle.bound_width * u), float(y) + bundle.bound_width * u]
    out.update(predicted_at=_iso(now), model_type=bundle.model_kind, objective_type=bundle.objective,
               quantile=bundle.quantile, last_model_load=_iso(bundle.loaded_at), model_version=bundle.version,
               model_source=bundle.source)
    return out


class TrainingService:
    """Everything the endpoints do, as plain methods."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = TrainingMetrics(settings.quantile_alpha)
        self.store = SampleStore(settings.store_path, max_rows=settings.max_stored_samples,
                                 queue_size=settings.ingest_queue_size, test_ratio=settings.test_train_ratio)
        self.store.on_commit = lambda n, dt: self.metrics.commit_latency.observe(dt)
        self.registry = Registry(settings.bundles_dir, keep=settings.bundles_keep, quantile=settings.quantile_alpha)
        self.train_config = TrainConfig(model_type=settings.model_type, objective=settings.objective_type,
                                        quantile=settings.quantile_alpha)
        self.worker: RetrainWorker | None = None
        self._xgb_json_cache: dict[tuple[str, str], bytes] = {}
        self.started_at = time.time()

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self, run_worker: bool = True) -> None:
        self.store.open()
        bundle = self.registry.load(self.settings.seed_bundle)
        self.metrics.set_served(bundle.version, bundle.source, bundle.loaded_at)
        if bundle.source == "learned":
            self.metrics.set_heldout(bundle.manifest.get("metrics") or {})
        s = self.settings
        self.worker = RetrainWorker(self.store, self.registry, self.metrics, config=self.train_config,
                                    interval=s.retraining_interval_sec, min_new=s.min_samples_for_retrain,
                                    max_per_bucket=s.max_training_data_size_per_bucket,
                                    tolerance=s.publish_tolerance)
        if run_worker:
            self.worker.start()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop(timeout=3.0)
        self.store.close()

    # ---- auth --------------------------------------------------------------------------
    def check_token(self, authorization: str | None) -> None:
        token = self.settings.api_token
        if token is None:
            return
        given = ""
        if authorization and authorization[:7].lower() == "bearer ":
            given = authorization[7:].strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPProblem(401, "missing or invalid bearer token (Authorization: Bearer <token>)",
                              {"WWW-Authenticate": "Bearer"})

    # ---- ingestion ---------------------------------------------------------------------
    def parse_bulk(self, body: bytes) -> tuple[list, list[dict], int]:
        """-> (valid entries, errors [{"index","loc","msg"}], total entries)."""
        doc = _orjson_body(body)
        if type(doc) is not dict:
            raise _field_problem(["body"], "body must be a JSON object with an 'entries' list", "type_error")
        entries = doc.get("entries")
        if type(entries) is not list:
            kind = "missing" if "entries" not in doc else "type_error"
            raise _field_problem(["body", "entries"], "'entries' must be a list of training entries", kind)
        valid, errors = [], []
        reasons: dict[str, int] = {}
        for i, obj in enumerate(entries):
            try:
                valid.append(parse_training_entry(obj, ("entries", i)))
            except FieldError as e:
                reasons[e.kind] = reasons.get(e.kind, 0) + 1
                if len(errors) < MAX_ERRORS_REPORTED:
                    errors.append({"index": i, "loc": ["body", *e.loc], "msg": e.msg, "type": e.kind})
        for kind, n in reasons.items():
            self.metrics.rejected.labels(kind).inc(n)
        return valid, errors, len(entries)

    async def ingest(self, body: bytes) -> dict:
        t0 = time.perf_counter()
        if len(body) > PARSE_IN_THREAD_BYTES:
            valid, errors, total = await asyncio.to_thread(self.parse_bulk, body)
        else:
            valid, errors, total = self.parse_bulk(body)
        if errors and not valid:  # nothing usable at all: a plain 4xx naming the fields
            raise HTTPProblem(422, errors)
        rows = entries_to_rows(valid)  # (numpy-vectorised stratum; cheap next to parsing)
        try:
            fut = self.store.submit(rows)
        except Saturated as e:
            self.metrics.requests_refused.labels("429").inc()
            raise HTTPProblem(429, "ingestion saturated: write queue full, retry later",
                              {"Retry-After": str(e.retry_after)}) from None
        except StoreClosed:
            self.metrics.requests_refused.labels("503").inc()
            raise HTTPProblem(503, "shutting down", {"Retry-After": "1"}) from None
        try:
            await asyncio.wrap_future(fut)
        except Exception as e:  # the commit failed: nothing acknowledged
            log.error("ingest commit failed: %s", e)
            self.metrics.requests_refused.labels("503").inc()
            raise HTTPProblem(503, "sample store unavailable; entries not stored", {"Retry-After": "1"}) from None
        self.metrics.accepted.inc(len(valid))
        live: dict[str, list] = {t: [] for t in TARGETS}
        feedback: dict[str, list] = {t: [] for t in TARGETS}
        served = self.registry.served.version
        for e in valid:
            if e.predicted_ttft_ms <= 0 and e.predicted_tpot_ms <= 0:
                continue  # no prediction reported (e.g. an upstream EPP): nothing to score
            pairs = [(t, a, p) for t, a, p in (("ttft", e.actual_ttft_ms, e.predicted_ttft_ms),
                                               ("tpot", e.actual_tpot_ms, e.predicted_tpot_ms)) if p > 0 and a > 0]
            if not pairs:
                continue
            if not e.model_version or e.model_version == served:  # the served model's live error
                for t, a, p in pairs:
                    live[t].append((a, p))
            if e.model_version and self.registry.is_learned_version(e.model_version):
                for t, a, p in pairs:  # any recent learned version: the adaptive correction's input
                    feedback[t].append((a, p))
        self.metrics.observe_live(live, feedback)
        self.metrics.ingest_latency.observe(time.perf_counter() - t0)
        return {"message": f"accepted {len(valid)} of {total} entries", "accepted": len(valid),
                "rejected": total - len(valid), "errors": errors}

    async def flush(self, body: bytes) -> dict:
        doc = _orjson_body(body) if body.strip() else {}
        if type(doc) is not dict:
            raise _field_problem(["body"], "body must be a JSON object", "type_error")
        flags = {}
        for name in ("flush_training_data", "flush_test_data", "flush_metrics"):
            v = doc.get(name, False)
            if type(v) is not bool:
                raise _field_problem(["body", name], "must be a boolean", "bool_type")
            flags[name] = v
        reason = doc.get("reason", "")
        if type(reason) is not str or len(reason) > 1000:
            raise _field_problem(["body", "reason"], "must be a string of at most 1000 characters", "string_type")
        log.warning("flush requested: %s reason=%r", flags, reason)
        rows = self.store.rows
        if flags["flush_training_data"] or flags["flush_test_data"]:
            try:
                rows = await asyncio.wrap_future(self.store.flush(flags["flush_training_data"],
                                                                  flags["flush_test_data"]))
            except StoreClosed:
                raise HTTPProblem(503, "shutting down", {"Retry-After": "1"}) from None
        if flags["flush_metrics"]:
            self.metrics.reset_live()
        return {"message": "flushed", **flags, "reason": reason, "stored_rows": rows}

    # ---- model information -------------------------------------------------------------
    def model_status(self) -> dict[str, bool]:
        b = self.registry.served
        return {t: b.has_model(t) for t in TARGETS}

    def download_info(self) -> dict:
        b = self.registry.served
        return {"model_type": self.settings.model_type if b.source == "prior" else b.model_kind,
                "objective_type": b.objective, "model_status": self.model_status(), "quantile": b.quantile,
                "model_version": b.version, "model_source": b.source}

    def model_info(self, name: str) -> dict:
        if name not in TARGETS:
            raise HTTPProblem(404, f"unknown model {name!r}; known: {list(TARGETS)}")
        b = self.registry.served
        spec = (b.manifest.get("models") or {}).get(name)
        return {"name": name, "exists": spec is not None, "model_version": b.version, "model_source": b.source,
                "model_type": b.model_kind, "objective_type": b.objective, "quantile": b.quantile,
                "file": None if spec is None else {k: spec[k] for k in ("file", "format", "size", "sha256")},
                "features": ((b.manifest.get("features") or {}).get("features") or {}).get(name),
                "metrics": (b.manifest.get("metrics") or {}).get(name),
                "calibration": (b.manifest.get("calibration") or {}).get(name),
                "training": (b.manifest.get("training") or {}).get(name),
                "last_model_load": _iso(b.loaded_at)}

    def models_list(self) -> dict:
        return {"models": [self.model_info(t) for t in TARGETS], "served_version": self.registry.served.version,
                "bundles": self.registry.versions()}

    def xgb_json(self, target: str) -> bytes:
        b = self.registry.served
        if b.model_kind != "xgboost" or not b.has_model(target):
            raise HTTPProblem(404, f"no XGBoost {target} model is served (model_kind={b.model_kind})")
        key = (b.version, target)
        cached = self._xgb_json_cache.get(key)
        if cached is None:
            import xgboost as xgb

            spec = b.manifest["models"][target]
            data = self.registry.served_files().get(spec["file"])
            if data is None:
                raise HTTPProblem(404, f"{target} model file not available")
            booster = xgb.Booster(params={"nthread": 1})
            booster.load_model(bytearray(data))
            cached = bytes(booster.save_raw("json"))
            self._xgb_json_cache = {key: cached, **{k: v for k, v in self._xgb_json_cache.items()
                                                    if k[0] == b.version}}
        return cached

    def data_status(self) -> dict:
        w = self.worker
        counts = self.store.target_counts()
        return {"stored_rows": self.store.rows, "max_stored_samples": self.settings.max_stored_samples,
                "rows_with_target": counts, "strata": len(self.store.strata_counts()),
                "queue_depth": self.store.queue_depth, "queue_size": self.settings.ingest_queue_size,
                "inserted_since_start": self.store.inserted_total, "evicted_since_start": self.store.evicted_total,
                "last_row_id": self.store.last_id,
                "new_samples_since_last_training": None if w is None else w.new_samples,
                "min_samples_for_retrain": self.settings.min_samples_for_retrain,
                "retrain_cycles": None if w is None else w.cycles,
                "retrain_failures": None if w is None else w.failures,
                "last_retrain": None if w is None or w.last is None else
                {"outcome": w.last.outcome, "reason": w.last.reason, "version": w.last.version,
                 "seconds": round(w.last.seconds, 3)},
                "served_version": self.registry.served.version, "model_source": self.registry.served.source}

    def predict(self, body: bytes) -> dict:
        doc = _orjson_body(body)
        try:
            raw = np.array([parse_row(doc)], dtype=np.float64)
        except FieldError as e:
            raise HTTPProblem(422, [e.to_detail(("body",))]) from None
        b = self.registry.served
        ttft, tpot = b.predict(raw)
        return prediction_object(b, float(ttft[0]), float(tpot[0]))


# ---- OpenAPI helpers -----------------------------------------------------------------------
def _json_body(schema: dict, required: bool = True) -> dict:
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}


_ERR = {"description": "error", "content": {"application/json": {"schema": {"type": "object"}}}}
_BULK_SCHEMA = {"type": "object", "required": ["entries"], "additionalProperties": True,
                "properties": {"entries": {"type": "array", "items": training_entry_json_schema()}}}
_FLUSH_SCHEMA = {"type": "object", "additionalProperties": True, "properties": {
    "flush_training_data": {"type": "boolean", "default": False},
    "flush_test_data": {"type": "boolean", "default": False},
    "flush_metrics": {"type": "boolean", "default": False},
    "reason": {"type": "string", "maxLength": 1000}}}


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refusing (413) over ``limit`` by Content-Length and by streamed size."""
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            n = int(cl)
        except ValueError:
            raise _field_problem(["header", "content-length"], "not an integer", "int_parsing", 400) from None
        if n > limit:
            raise HTTPProblem(413, f"body of {n} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPProblem(413, f"body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(settings: Settings, *, service: TrainingService | None = None, run_worker: bool = True) -> FastAPI:
    """The FastAPI app; the service starts on startup and stops (draining writes) on shutdown."""
    svc = service or TrainingService(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await asyncio.to_thread(svc.start, run_worker)
        try:
            yield
        finally:
            await asyncio.to_thread(svc.stop)

    app = FastAPI(title="latency training server", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Accepts latency samples, trains TTFT/TPOT models, publishes bundles.")
    install_api_docs(app)  # offline /docs (no CDN)
    app.state.service = svc

    @app.exception_handler(HTTPProblem)
    async def _problem(request: Request, exc: HTTPProblem) -> Response:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "internal server error"}, status_code=500)

    limit = settings.max_body_bytes
    write_errors = {401: _ERR, 413: _ERR, 422: _ERR}

    @app.post("/add_training_data_bulk", status_code=202, openapi_extra=_json_body(_BULK_SCHEMA),
              responses={**write_errors, 429: _ERR, 503: _ERR},
              summary="Store training entries (per-entry validation; 202 after the durable commit)")
    async def add_training_data_bulk(request: Request) -> Response:
        svc.check_token(request.headers.get("authorization"))
        body = await _read_body(request, limit)
        return JSONResponse(await svc.ingest(body), status_code=202)

    @app.post("/flush", openapi_extra=_json_body(_FLUSH_SCHEMA, required=False), responses=write_errors,
              summary="Delete stored training and/or test rows, reset live metrics")
    async def flush(request: Request) -> Response:
        svc.check_token(request.headers.get("authorization"))
        body = await _read_body(request, limit)
        return JSONResponse(await svc.flush(body))

    @app.post("/predict", openapi_extra=_json_body(row_json_schema()), responses={413: _ERR, 422: _ERR},
              summary="Predict TTFT/TPOT for one row with the served bundle (prior before any)")
    async def predict(request: Request) -> Response:
        body = await _read_body(request, min(limit, 1 << 20))
        return JSONResponse(svc.predict(body))

    @app.get("/model/download/info")
    async def download_info() -> dict:
        return svc.download_info()

    @app.get("/models/list")
    async def models_list() -> dict:
        return await asyncio.to_thread(svc.models_list)

    @app.get("/model/{name}/info", responses={404: _ERR})
    async def model_info(name: str) -> dict:
        return svc.model_info(name)

    @app.get("/model/ttft/xgb/json", responses={404: _ERR})
    async def ttft_xgb_json() -> Response:
        return Response(await asyncio.to_thread(svc.xgb_json, "ttft"), media_type="application/json")

    @app.get("/model/tpot/xgb/json", responses={404: _ERR})
    async def tpot_xgb_json() -> Response:
        return Response(await asyncio.to_thread(svc.xgb_json, "tpot"), media_type="application/json")

    @app.get("/data/status")
    async def data_status() -> dict:
        return await asyncio.to_thread(svc.data_status)

    @app.get("/model/export", responses={404: _ERR},
             summary="The served bundle as one JSON document (manifest + base64 files), a seed for a new deployment")
    async def model_export() -> Response:
        doc = svc.registry.export()
        if doc is None:
            raise HTTPProblem(404, "no learned bundle published yet")
        return Response(orjson.dumps(doc), media_type="application/json")

    @app.get("/metrics", responses={200: {"description": "Prometheus text exposition",
                                          "content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def metrics() -> Response:
        data = svc.metrics.render(svc.store.rows, svc.store.queue_depth)
        return Response(data, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", responses={503: _ERR})
    async def readyz() -> Response:
        b = svc.registry.served
        body = {"ready": b.source == "learned", "model_version": b.version, "model_source": b.source}
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    @app.get("/v1/bundles/latest", responses={304: {"description": "not modified"}, 404: _ERR})
    async def bundles_latest(request: Request) -> Response:
        manifest = svc.registry.latest_manifest()
        if manifest is None:
            raise HTTPProblem(404, "no bundle published yet")
        etag = f'"{manifest["version"]}"'
        inm = request.headers.get("if-none-match")
        if inm is not None and (inm.strip() == "*" or etag in
                                [t.strip().removeprefix("W/") for t in inm.split(",")]):
            return Response(status_code=304, headers={"ETag": etag})
        return Response(orjson.dumps(manifest), media_type="application/json", headers={"ETag": etag})

    @app.get("/v1/bundles/{version}/{file}", responses={404: _ERR})
    async def bundle_file(version: str, file: str) -> Response:
        data = await asyncio.to_thread(svc.registry.read_file, version, file)
        if data is None:
            raise HTTPProblem(404, "no such bundle file")
        return Response(data, media_type="application/octet-stream", headers={"ETag": f'"{version}/{file}"'})

    return app
