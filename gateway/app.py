"""ASGI application: the proxy routes, /metrics, /healthz and the /gateway/* admin endpoints."""
from __future__ import annotations

from .admin import ADMIN_PREFIX, admin, authorized
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
        if path.startswith(ADMIN_PREFIX):
            if method != "GET":
                return await _plain(send, 405, b'{"error":"method not allowed"}', [(b"allow", b"GET")])
            status, body = authorized(gw, scope) or admin(gw, scope)
            extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
            return await _plain(send, status, body, extra)
        return await _plain(send, 404, b'{"error":"not found"}')

    return app


async def _plain(send, status: int, body: bytes, extra=(), ctype: bytes = b"application/json") -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
