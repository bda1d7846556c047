"""HTTP layer of the training server (docs/wire-api.md §1.3 and §2): an adapter over
:class:`~training_server.service.TrainingService`, which does the work (testable without a
server). Here: auth, body admission and parsing (:mod:`.bodies`), status codes, and the
route table. Bodies are parsed with orjson from raw bytes (no pydantic per row); request
schemas for OpenAPI come from ``features.schema``.
"""
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from features.apidocs import install_api_docs
from features.render import engine_document
from features.schema import FieldError, row_json_schema, training_entry_json_schema

from . import info
from .bodies import (
    HTTPProblem,
    InflightBytes,
    admitted_body,
    check_flush_access,
    check_token,
    field_problem,
    from_loopback,
    parse_bulk,
    parse_json,
    require_json,
    too_busy,
)
from .service import TrainingService
from .settings import Settings
from .store import Saturated, StoreClosed

log = logging.getLogger("training_server.app")

#: Bodies larger than this are parsed in a worker thread, so a huge batch (up to
#: LATENCY_MAX_BODY_BYTES) never stalls the event loop for other requests.
PARSE_IN_THREAD_BYTES = 64 * 1024


def _refused(svc: TrainingService, status: int) -> None:
    svc.metrics.requests_refused.labels(str(status)).inc()


async def ingest_body(svc: TrainingService, body: bytes | bytearray) -> dict:
    """Parse, store (202 after the commit). A bytearray body is cleared once parsed, and
    the parsed entries dropped once stored rows are built, so one request holds one form
    of its data at a time."""
    t0 = time.perf_counter()
    if len(body) > PARSE_IN_THREAD_BYTES:
        batch = await asyncio.to_thread(parse_bulk, body, svc.validate)
    else:
        batch = parse_bulk(body, svc.validate)
    if isinstance(body, bytearray):
        body.clear()
    if batch.errors and not batch.valid:  # nothing usable at all: a plain 4xx naming the fields
        raise HTTPProblem(422, batch.errors)
    try:
        fut = svc.submit(batch)
    except Saturated as e:
        _refused(svc, 429)
        raise too_busy("ingestion saturated: write queue full, retry later", e.retry_after) from None
    except StoreClosed:
        _refused(svc, 503)
        raise HTTPProblem(503, "shutting down", {"Retry-After": "1"}) from None
    del batch
    try:
        result = await asyncio.wrap_future(fut)
    except Exception as e:  # the commit failed: nothing acknowledged
        log.error("ingest commit failed: %s", e)
        _refused(svc, 503)
        raise HTTPProblem(503, "sample store unavailable; entries not stored", {"Retry-After": "1"}) from None
    svc.metrics.ingest_latency.observe(time.perf_counter() - t0)
    return result.to_json()


async def flush_body(svc: TrainingService, body: bytes | bytearray) -> dict:
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
    try:
        rows = await asyncio.wrap_future(svc.flush(training=flags["flush_training_data"],
                                                   test=flags["flush_test_data"]))
    except StoreClosed:
        raise HTTPProblem(503, "shutting down", {"Retry-After": "1"}) from None
    if flags["flush_metrics"]:
        svc.reset_live()
    return {"message": "flushed", **flags, "reason": reason, "stored_rows": rows}


def predict_body(svc: TrainingService, body: bytes | bytearray) -> dict:
    doc = parse_json(body)
    try:
        return svc.predict(doc)
    except FieldError as e:
        raise HTTPProblem(422, [e.to_detail(("body",))]) from None


# ---- OpenAPI helpers -----------------------------------------------------------------------
def _json_body(schema: dict, required: bool = True) -> dict:
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}


_ERR: dict[str, Any] = {"description": "error", "content": {"application/json": {"schema": {"type": "object"}}}}
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
        settings.max_inflight_bytes, on_refuse=lambda: _refused(svc, 429))
    write_errors: dict[int | str, dict[str, Any]] = {401: _ERR, 413: _ERR, 415: _ERR, 422: _ERR, 429: _ERR}

    @app.post("/add_training_data_bulk", status_code=202, openapi_extra=_json_body(_BULK_SCHEMA),
              responses={**write_errors, 503: _ERR},
              summary="Store training entries (per-entry validation; 202 after the durable commit)")
    async def add_training_data_bulk(request: Request) -> Response:
        check_token(settings.api_token, request.headers.get("authorization"))
        require_json(request)
        if not svc.has_room():  # before a body is read: the write queue has no room at all
            _refused(svc, 429)
            raise too_busy("ingestion saturated: write queue full, retry later")
        async with admitted_body(request, limit, inflight) as body:
            return JSONResponse(await ingest_body(svc, body), status_code=202)

    @app.post("/flush", openapi_extra=_json_body(_FLUSH_SCHEMA, required=False),
              responses={**write_errors, 403: _ERR},
              summary="Delete stored training and/or test rows, reset live metrics (token, or loopback without one)")
    async def flush(request: Request) -> Response:
        check_flush_access(settings.api_token, request.headers.get("authorization"), from_loopback(request))
        require_json(request)
        async with admitted_body(request, limit, inflight) as body:
            return JSONResponse(await flush_body(svc, body))

    @app.post("/predict", openapi_extra=_json_body(row_json_schema()),
              responses={413: _ERR, 415: _ERR, 422: _ERR, 429: _ERR},
              summary="Predict TTFT/TPOT for one row with the served bundle (prior before any)")
    async def predict(request: Request) -> Response:
        require_json(request)
        async with admitted_body(request, min(limit, 1 << 20), inflight) as body:
            return JSONResponse(predict_body(svc, body))

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

    @app.get("/v1/engine", responses={404: _ERR},
             summary="The engine twin's step model learned from the engine fields of the entries (served bundle)")
    async def engine() -> Response:
        status, doc = engine_document(svc.registry.served)
        return JSONResponse(doc, status_code=status)

    @app.get("/metrics", responses={200: {"description": "Prometheus text exposition",
                                          "content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def metrics() -> Response:
        data = svc.render_metrics()
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
