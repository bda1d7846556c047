"""ASGI application: the proxy routes, /metrics, /healthz and /gateway/* introspection."""
from __future__ import annotations

import orjson

from .core import ROUTES, Gateway


def build_app(gw: Gateway):
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    try:
                        await gw.start()
                    except Exception as e:  # noqa: BLE001
                        await send({"type": "lifespan.startup.failed", "message": str(e)})
                        return
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await gw.stop()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in ROUTES:
            if method != "POST":
                return await _plain(send, 405, b'{"error":"method not allowed"}', [(b"allow", b"POST")])
            return await gw.handle(scope, receive, send)
        if method == "GET" and path == "/metrics":
            return await _plain(send, 200, gw.metrics.exposition(),
                                ctype=b"text/plain; version=0.0.4; charset=utf-8")
        if method == "GET" and path == "/healthz":
            return await _plain(send, 200, b'{"status":"ok"}')
        if method == "GET" and path == "/gateway/endpoints":
            return await _plain(send, 200, orjson.dumps([{
                "name": e.name, "url": e.url, "kv_cache_usage": e.metrics.kv_cache_usage,
                "waiting": e.metrics.waiting, "running": e.metrics.running,
                "inflight_requests": gw.inflight.snapshot(e.name).requests,
                "inflight_tokens": gw.inflight.snapshot(e.name).tokens,
                "scrape_failures": e.scrape_failures, "dispatch_failures": e.dispatch_failures,
                "prefix_lru_size": gw.prefix.size(e.name)} for e in gw.endpoints]))
        if method == "GET" and path == "/gateway/flow" and callable(snapshot := getattr(gw.router, "snapshot", None)):
            return await _plain(send, 200, orjson.dumps(snapshot()))
        if method == "GET" and path == "/gateway/requests":
            since = 0
            for part in scope.get("query_string", b"").decode().split("&"):
                if part.startswith("since="):
                    try:
                        since = max(0, int(part[6:]))
                    except ValueError:
                        return await _plain(send, 400,
                                            b'{"detail":[{"loc":["query","since"],"msg":"must be an integer"}]}')
            return await _plain(send, 200, orjson.dumps(gw.records_since(since)))
        return await _plain(send, 404, b'{"error":"not found"}')

    return app


async def _plain(send, status: int, body: bytes, extra=(), ctype: bytes = b"application/json") -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
