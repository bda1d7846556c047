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
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from features.bundle import make_lineage
from features.schema import FieldError, parse_row, parse_training_entry, row_json_schema, \
    training_entry_json_schema
from features.apidocs import install_api_docs
from features.matrix import TARGETS
from features.loaded import LoadedBundle

from .bodies import SLICE_BYTES, HTTPProblem, InflightBytes, NotSplittable, admitted_body, array_slices, \
    field_problem, from_loopback, parse_json, require_json, too_busy
from . import info
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


def prediction_object(bundle: LoadedBundle, ttft: float, tpot: float, now: float | None = None) -> dict:
    """One prediction ``p`` (wire-api §1.2) plus model_version and model_source."""
    now = time.time() if now is None else now
    out: dict[str, Any] = {}
    for t, y in (("ttft", ttft), ("tpot", tpot)):
        u = bundle.uncertainty(t)
        out[f"{t}_ms"] = float(y)
        out[f"{t}_uncertainty"] = u
        out[f"{t}_prediction_bounds"] = [max(0.0, float(y) - bundle.bound_width * u), float(y) + bundle.bound_width * u]
    out.update(predicted_at=info.iso(now), model_type=bundle.model_kind, objective_type=bundle.objective,
               quantile=bundle.quantile, last_model_load=info.iso(bundle.loaded_at), model_version=bundle.version,
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
        #: XGBoost JSON dumps of the served models (/model/*/xgb/json), by (version, target)
        self.xgb_json_cache: dict[tuple[str, str], bytes] = {}
        self.started_at = time.time()

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self, run_worker: bool = True) -> None:
        self.store.open()
        self.registry.lineage = make_lineage(self.store.store_id, self.store.created_at)
        bundle = self.registry.load(self.settings.seed_bundle)
        self.metrics.set_served(bundle.version, bundle.source, bundle.loaded_at)
        if bundle.source == "learned":
            self.metrics.set_heldout(bundle.manifest.metrics_json())
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

    def check_flush_access(self, authorization: str | None, loopback: bool) -> None:
        """The token when one is configured; without one, only a caller on loopback."""
        if self.settings.api_token is not None:
            self.check_token(authorization)
        elif not loopback:
            raise HTTPProblem(403, "/flush without LATENCY_API_TOKEN is allowed from loopback only; "
                                   "set LATENCY_API_TOKEN to flush from another host")

    # ---- ingestion ---------------------------------------------------------------------
    def check_room(self) -> None:
        """429 before a body is read when the write queue has no room at all."""
        if self.store.queue_depth >= self.store.queue_size:
            self.metrics.requests_refused.labels("429").inc()
            raise too_busy("ingestion saturated: write queue full, retry later")

    def parse_bulk(self, body: bytes | bytearray) -> tuple[list, list[dict], int]:
        """-> (valid entries, errors [{"index","loc","msg"}], total entries). A large body
        is parsed slice by slice (bodies.array_slices) so its parsed form stays small."""
        if len(body) > 2 * SLICE_BYTES:
            try:
                return self._entries(array_slices(body, "entries"))
            except NotSplittable:
                pass  # another shape, or invalid: parse it whole (and name the problem)
        doc = parse_json(body)
        if type(doc) is not dict:
            raise field_problem(["body"], "body must be a JSON object with an 'entries' list", "type_error")
        entries = doc.get("entries")
        if type(entries) is not list:
            kind = "missing" if "entries" not in doc else "type_error"
            raise field_problem(["body", "entries"], "'entries' must be a list of training entries", kind)
        del doc
        return self._entries([entries])

    def _entries(self, parts) -> tuple[list, list[dict], int]:
        valid, errors = [], []
        reasons: dict[str, int] = {}
        i = 0
        for part in parts:
            for k, obj in enumerate(part):
                part[k] = None  # each parsed dict is freed as it is converted
                try:
                    valid.append(parse_training_entry(obj, ("entries", i)))
                except FieldError as e:
                    reasons[e.kind] = reasons.get(e.kind, 0) + 1
                    if len(errors) < MAX_ERRORS_REPORTED:
                        errors.append({"index": i, "loc": ["body", *e.loc], "msg": e.msg, "type": e.kind})
                i += 1
        for kind, n in reasons.items():
            self.metrics.rejected.labels(kind).inc(n)
        return valid, errors, i

    async def ingest(self, body: bytes | bytearray) -> dict:
        """Parse, store (202 after the commit) and score the live pairs. A bytearray body is
        cleared once parsed, and the parsed entries dropped once stored rows are built, so
        one request holds one form of its data at a time."""
        t0 = time.perf_counter()
        if len(body) > PARSE_IN_THREAD_BYTES:
            valid, errors, total = await asyncio.to_thread(self.parse_bulk, body)
        else:
            valid, errors, total = self.parse_bulk(body)
        if isinstance(body, bytearray):
            body.clear()
        if errors and not valid:  # nothing usable at all: a plain 4xx naming the fields
            raise HTTPProblem(422, errors)
        accepted = len(valid)
        live, feedback = self._live_pairs(valid)
        rows = entries_to_rows(valid)  # (numpy-vectorised stratum; cheap next to parsing)
        del valid
        try:
            fut = self.store.submit(rows)
        except Saturated as e:
            self.metrics.requests_refused.labels("429").inc()
            raise too_busy("ingestion saturated: write queue full, retry later", e.retry_after) from None
        except StoreClosed:
            self.metrics.requests_refused.labels("503").inc()
            raise HTTPProblem(503, "shutting down", {"Retry-After": "1"}) from None
        del rows
        try:
            await asyncio.wrap_future(fut)
        except Exception as e:  # the commit failed: nothing acknowledged
            log.error("ingest commit failed: %s", e)
            self.metrics.requests_refused.labels("503").inc()
            raise HTTPProblem(503, "sample store unavailable; entries not stored", {"Retry-After": "1"}) from None
        self.metrics.accepted.inc(accepted)
        self.metrics.observe_live(live, feedback)
        self.metrics.ingest_latency.observe(time.perf_counter() - t0)
        return {"message": f"accepted {accepted} of {total} entries", "accepted": accepted,
                "rejected": total - accepted, "errors": errors}

    def _live_pairs(self, valid: list) -> tuple[dict[str, list], dict[str, list]]:
        """(actual, predicted) pairs per target: of the served model (its live error) and of
        any recent learned version (the adaptive correction's input)."""
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
            if not e.model_version or e.model_version == served:
                for t, a, p in pairs:
                    live[t].append((a, p))
            if e.model_version and self.registry.is_learned_version(e.model_version):
                for t, a, p in pairs:
                    feedback[t].append((a, p))
        return live, feedback

    async def flush(self, body: bytes) -> dict:
        doc = parse_json(body) if body.strip() else {}
        if type(doc) is not dict:
            raise field_problem(["body"], "body must be a JSON object", "type_error")
        flags = {}
        for name in ("flush_training_data", "flush_test_data", "flush_metrics"):
            v = doc.get(name, False)
            if type(v) is not bool:
                raise field_problem(["body", name], "must be a boolean", "bool_type")
            flags[name] = v
        reason = doc.get("reason", "")
        if type(reason) is not str or len(reason) > 1000:
            raise field_problem(["body", "reason"], "must be a string of at most 1000 characters", "string_type")
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

    def predict(self, body: bytes) -> dict:
        doc = parse_json(body)
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
    inflight = app.state.inflight = InflightBytes(
        settings.max_inflight_bytes, on_refuse=lambda: svc.metrics.requests_refused.labels("429").inc())
    write_errors = {401: _ERR, 413: _ERR, 415: _ERR, 422: _ERR, 429: _ERR}

    @app.post("/add_training_data_bulk", status_code=202, openapi_extra=_json_body(_BULK_SCHEMA),
              responses={**write_errors, 503: _ERR},
              summary="Store training entries (per-entry validation; 202 after the durable commit)")
    async def add_training_data_bulk(request: Request) -> Response:
        svc.check_token(request.headers.get("authorization"))
        require_json(request)
        svc.check_room()
        async with admitted_body(request, limit, inflight) as body:
            return JSONResponse(await svc.ingest(body), status_code=202)

    @app.post("/flush", openapi_extra=_json_body(_FLUSH_SCHEMA, required=False),
              responses={**write_errors, 403: _ERR},
              summary="Delete stored training and/or test rows, reset live metrics (token, or loopback without one)")
    async def flush(request: Request) -> Response:
        svc.check_flush_access(request.headers.get("authorization"), from_loopback(request))
        require_json(request)
        async with admitted_body(request, limit, inflight) as body:
            return JSONResponse(await svc.flush(body))

    @app.post("/predict", openapi_extra=_json_body(row_json_schema()),
              responses={413: _ERR, 415: _ERR, 422: _ERR, 429: _ERR},
              summary="Predict TTFT/TPOT for one row with the served bundle (prior before any)")
    async def predict(request: Request) -> Response:
        require_json(request)
        async with admitted_body(request, min(limit, 1 << 20), inflight) as body:
            return JSONResponse(svc.predict(body))

    @app.get("/model/download/info")
    async def download_info() -> dict:
        return info.download_info(svc)

    @app.get("/models/list")
    async def models_list() -> dict:
        return await asyncio.to_thread(info.models_list, svc)

    @app.get("/model/{name}/info", responses={404: _ERR})
    async def model_info(name: str) -> dict:
        return info.model_info(svc, name)

    @app.get("/model/ttft/xgb/json", responses={404: _ERR})
    async def ttft_xgb_json() -> Response:
        return Response(await asyncio.to_thread(info.xgb_json, svc, "ttft"), media_type="application/json")

    @app.get("/model/tpot/xgb/json", responses={404: _ERR})
    async def tpot_xgb_json() -> Response:
        return Response(await asyncio.to_thread(info.xgb_json, svc, "tpot"), media_type="application/json")

    @app.get("/data/status")
    async def data_status() -> dict:
        return await asyncio.to_thread(info.data_status, svc)

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
