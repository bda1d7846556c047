"""HTTP layer of the prediction server: a thin adapter over :class:`PredictionService`.

The prediction endpoints (bodies in, JSON out) are raw ASGI handlers: they read the body
bytes (bounded by ``LATENCY_MAX_BODY_BYTES`` -> 413), call one service method and send
its bytes. They are registered twice, pointing at the same handler: as FastAPI routes
(so the OpenAPI schema documents them, request bodies from
``features.schema.row_json_schema()``) and in a dispatch table that :class:`_App`
consults before the middleware stack, which is the hot path's only shortcut (no
dependency injection, no Request/Response objects, no routing loop).
"""
from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from features.apidocs import install_api_docs
from features.render import engine_document
from features.schema import row_json_schema

from .batcher import StrictBatcher
from .metrics import CONTENT_TYPE
from .reload import CoalescedReload
from .service import PredictionService
from .settings import Settings
from .sync import BundleSync

log = logging.getLogger("prediction_server")

#: Bodies larger than this are handled in a worker thread (keeps /healthz responsive).
_THREAD_BODY_BYTES = 256 * 1024

_JSON_HEADERS = [(b"content-type", b"application/json")]


async def _send(send: Send, status: int, payload: bytes, headers: list | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*(headers or _JSON_HEADERS), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def _too_large(limit: int) -> bytes:
    return orjson.dumps({"detail": [{"loc": ["body"], "msg": f"request body larger than {limit} bytes",
                                     "type": "too_large"}]})


def body_handler(handler: Callable[[bytes], tuple[int, bytes]], limit: int, endpoint: str,
                 service: PredictionService,
                 async_handler: Callable[[bytes], Awaitable[tuple[int, bytes]]] | None = None) -> ASGIApp:
    """Raw ASGI app: read at most ``limit`` body bytes, answer ``handler(body)`` (or
    ``async_handler(body)`` when given; bodies over 256 KiB always go to ``handler`` in a
    worker thread)."""
    too_large = _too_large(limit)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        for k, v in scope["headers"]:
            if k == b"content-length":
                if not v.isdigit() or int(v) > limit:
                    service.metrics.count(endpoint, 413)
                    await _send(send, 413, too_large)
                    return
                break
        msg = await receive()
        body = msg.get("body", b"")
        if msg.get("more_body"):
            chunks = [body]
            size = len(body)
            while msg.get("more_body"):
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                chunk = msg.get("body", b"")
                size += len(chunk)
                if size > limit:
                    service.metrics.count(endpoint, 413)
                    await _send(send, 413, too_large)
                    return
                chunks.append(chunk)
            body = b"".join(chunks)
        elif msg["type"] == "http.disconnect":
            return
        if len(body) > limit:
            service.metrics.count(endpoint, 413)
            await _send(send, 413, too_large)
            return
        try:
            if len(body) > _THREAD_BODY_BYTES:
                status, payload = await run_in_threadpool(handler, body)
            elif async_handler is not None:
                status, payload = await async_handler(body)
            else:
                status, payload = handler(body)
        except Exception:  # a bug, never bad input: answer 500 and log it
            log.exception("%s failed", endpoint)
            service.metrics.count(endpoint, 500)
            status, payload = 500, b'{"detail":"internal error"}'
        await _send(send, status, payload)

    return app


def _noop_handler(service: PredictionService) -> Callable[[bytes], tuple[int, bytes]]:
    """``POST /bench/noop``: the HTTP stack's floor. Reads the body, does no parsing or
    prediction, and answers a precomputed response of the same size as a real one."""
    cache: dict[int, bytes] = {}

    def handler(body: bytes) -> tuple[int, bytes]:
        n = max(1, body.count(b"kv_cache_percentage"))
        out = cache.get(n)
        if out is None:
            rows = b'{"requests":[' + b",".join(
                [b'{"kv_cache_percentage":0.5,"input_token_length":100,"num_request_waiting":0,'
                 b'"num_request_running":1,"num_tokens_generated":0,"prefix_cache_score":0}'] * n) + b"]}"
            out = cache[n] = service.predict_strict(rows)[1] if len(cache) < 64 else b"{}"
        return 200, out

    return handler


class _App(FastAPI):
    """FastAPI with a dispatch table for the prediction endpoints, checked first."""

    fast_routes: dict[tuple[str, str], ASGIApp]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            handler = self.fast_routes.get((scope["method"], scope["path"]))
            if handler is not None:
                await handler(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _schemas(max_rows: int) -> dict[str, Any]:
    row = row_json_schema()
    bounds = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
    pred = {
        "type": "object",
        "properties": {
            "ttft_ms": {"type": "number"}, "tpot_ms": {"type": "number"},
            "ttft_uncertainty": {"type": "number"}, "tpot_uncertainty": {"type": "number"},
            "ttft_prediction_bounds": bounds, "tpot_prediction_bounds": bounds,
            "predicted_at": {"type": "string", "format": "date-time"},
            "model_type": {"type": "string", "enum": ["xgboost", "lightgbm", "prior"]},
            "objective_type": {"type": "string"}, "quantile": {"type": "number"},
            "last_model_load": {"type": "string", "format": "date-time"},
            "model_version": {"type": "string"}, "model_source": {"type": "string", "enum": ["learned", "prior"]},
        },
        "required": ["ttft_ms", "tpot_ms", "ttft_uncertainty", "tpot_uncertainty", "ttft_prediction_bounds",
                     "tpot_prediction_bounds", "predicted_at", "model_type", "objective_type", "quantile",
                     "last_model_load", "model_version", "model_source"],
    }
    bulk_body = {"type": "object", "required": ["requests"],
                 "properties": {"requests": {"type": "array", "items": row, "minItems": 1, "maxItems": max_rows}}}
    counts = {"total_requests": {"type": "integer"}, "successful_predictions": {"type": "integer"},
              "failed_predictions": {"type": "integer"}, "processing_time_ms": {"type": "number"},
              "model_version": {"type": "string"}, "model_source": {"type": "string"}}
    strict_resp = {"type": "object", "required": ["predictions", *counts],
                   "properties": {"predictions": {"type": "array", "items": pred}, **counts}}
    bulk_resp = {"type": "object", "required": ["predictions", "errors", *counts],
                 "properties": {"predictions": {"type": "array", "items": {"anyOf": [pred, {"type": "null"}]}},
                                "errors": {"type": "array", "items": {
                                    "type": "object", "required": ["index", "error", "request"],
                                    "properties": {"index": {"type": "integer"}, "error": {"type": "string"},
                                                   "loc": {"type": "array"}, "request": {}}}},
                                **counts}}
    grid_value = {"anyOf": [{"type": ["number", "string"]},
                            {"type": "array", "items": {"type": ["number", "string"]}, "minItems": 1}]}
    whatif_body = {"type": "object", "additionalProperties": False, "properties": {
        "request": {**row, "required": [], "additionalProperties": False,
                    "description": "partial row: fields not in the grid (an unknown field is a 422)"},
        "grid": {"type": "object", "additionalProperties": grid_value,
                 "propertyNames": {"enum": list(row["properties"])},
                 "description": "field -> value or list of values; every combination is predicted"},
        "max_points": {"type": "integer", "minimum": 1, "maximum": max_rows, "default": max_rows}}}
    whatif_resp = {"type": "object", "required": ["points", "n_points", "model_version", "model_source"],
                   "properties": {"points": {"type": "array", "items": {
                       "type": "object", "required": ["values", "ttft_ms", "tpot_ms"],
                       "properties": {"values": {"type": "object"}, "ttft_ms": {"type": "number"},
                                      "tpot_ms": {"type": "number"}}}},
                       "n_points": {"type": "integer"}, "grid_fields": {"type": "array"},
                       "model_version": {"type": "string"}, "model_source": {"type": "string"},
                       "model_type": {"type": "string"}, "objective_type": {"type": "string"},
                       "quantile": {"type": "number"}, "processing_time_ms": {"type": "number"}}}
    return {"row": row, "pred": pred, "bulk_body": bulk_body, "strict_resp": strict_resp, "bulk_resp": bulk_resp,
            "whatif_body": whatif_body, "whatif_resp": whatif_resp}


_ERR = {"type": "object", "properties": {"detail": {}}}


def _doc(body_schema: dict, ok_schema: dict, *extra: int) -> dict:
    responses = {"200": {"description": "OK", "content": {"application/json": {"schema": ok_schema}}},
                 "413": {"description": "body too large", "content": {"application/json": {"schema": _ERR}}},
                 "422": {"description": "invalid body; detail names the field",
                         "content": {"application/json": {"schema": _ERR}}}}
    for status in extra:
        responses[str(status)] = {"description": {503: "no learned model (LATENCY_REFUSE_WITHOUT_MODEL=true)"}
                                  .get(status, ""), "content": {"application/json": {"schema": _ERR}}}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body_schema}}},
            "responses": responses}


def create_app(settings: Settings, sync: BundleSync | None = None,
               service: PredictionService | None = None) -> FastAPI:
    """Build the app. ``service``/``sync`` may be injected (tests); otherwise built here."""
    service = service or PredictionService(settings)
    sync = sync or BundleSync(settings, service)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        sync.start()
        try:
            yield
        finally:
            await run_in_threadpool(sync.stop)

    app = _App(title="latency prediction server", version="1", lifespan=lifespan,
               max_body_size=settings.max_body_bytes, docs_url=None, redoc_url=None)
    install_api_docs(app)  # offline /docs (no CDN)
    app.state.service = service
    app.state.sync = sync
    app.state.settings = settings
    app.fast_routes = {}
    s = _schemas(settings.max_batch_rows)
    limit = settings.max_body_bytes

    def post(path: str, handler: Callable[[bytes], tuple[int, bytes]], doc: dict, summary: str,
             include_in_schema: bool = True, async_handler=None) -> None:
        asgi = body_handler(handler, limit, path, service, async_handler)

        async def documented() -> None:  # pragma: no cover - the route's app is ``asgi`` below
            """Signature holder for OpenAPI; requests are served by the raw handler."""

        app.add_api_route(path, documented, methods=["POST"], summary=summary, openapi_extra=doc,
                          include_in_schema=include_in_schema)
        route = app.router.routes[-1]  # the one just added (add_api_route's default route class)
        assert isinstance(route, APIRoute)
        route.app = asgi  # the documented route serves through the same handler
        app.fast_routes[("POST", path)] = asgi

    post("/predict/bulk/strict", service.predict_strict, _doc(s["bulk_body"], s["strict_resp"], 503),
         "Predict TTFT/TPOT for a batch; any invalid row fails the call (the EPP hot path)",
         async_handler=StrictBatcher(service))
    post("/predict/bulk", service.predict_bulk, _doc(s["bulk_body"], s["bulk_resp"], 503),
         "Predict a batch; invalid rows give null plus an entry in errors")
    post("/predict", service.predict_one, _doc(s["row"], s["pred"], 503), "Predict one row")
    post("/v1/whatif", service.whatif, _doc(s["whatif_body"], s["whatif_resp"], 503),
         "Predict every combination of a grid of endpoint states")
    if settings.enable_bench_routes:
        post("/bench/noop", _noop_handler(service), _doc({}, {}), "benchmark floor (no prediction)",
             include_in_schema=False)

    token = settings.api_token
    app.state.reload = reload_sync = CoalescedReload(sync.sync_once)

    # Status and probes run on the event loop (they never block): a worker thread pool
    # filled by slow work can never delay a liveness or readiness probe.
    @app.get("/status", summary="Model status")
    async def status() -> dict:
        return service.status()

    @app.get("/healthz", summary="Process alive")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", summary="200 only when a learned model is loaded",
             responses={503: {"description": "no learned model loaded yet"}})
    async def readyz() -> JSONResponse:
        served = service.served
        if served.learned:
            return JSONResponse({"status": "ready", "model_version": served.bundle.version})
        return JSONResponse({"status": "not ready", "reason": "no learned model loaded yet",
                             "model_version": served.bundle.version}, status_code=503)

    @app.get("/v1/engine", summary="The engine twin's learned step model (the served bundle's engine section)",
             responses={404: {"description": "no engine step model learned yet (the reason in detail)"}})
    async def engine() -> JSONResponse:
        status, doc = engine_document(service.bundle)
        return JSONResponse(doc, status_code=status)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/reload", summary="Sync bundles now and report the result",
              responses={401: {"description": "LATENCY_API_TOKEN is set and the bearer token is missing or wrong"},
                         502: {"description": "the sync failed; the served bundle is kept"}})
    async def reload(request: Request) -> JSONResponse:
        if token is not None:
            auth = request.headers.get("authorization", "")
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
                service.metrics.count("/reload", 401)
                return JSONResponse({"detail": "missing or wrong bearer token"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
        result = await reload_sync()  # concurrent reloads share one sync (prediction_server.reload)
        code = 502 if result["result"] == "failed" else 200
        service.metrics.count("/reload", code)
        return JSONResponse(result, status_code=code)

    return app
