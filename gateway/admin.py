"""The gateway's admin endpoints, behind a bearer token on the API port.

``GET /gateway/endpoints`` (engine URLs, load, health), ``GET /gateway/requests?since=N&limit=M``
(finished requests: ids, endpoints, tokens, SLOs, timings) and ``GET /gateway/flow``
(flow-control queues and recent dispatches) show what other clients do, so they answer only a
request carrying ``Authorization: Bearer <LATENCY_GATEWAY_ADMIN_TOKEN>`` (401 otherwise);
with no token configured they answer 403. ``/metrics`` and ``/healthz`` stay open.
"""
from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:  # pragma: no cover
    from .core import Gateway

ADMIN_PREFIX = "/gateway/"
MAX_RECORDS = 1000   # records in one /gateway/requests answer (page on with ?since=)


def authorized(gw: Gateway, scope) -> tuple[int, bytes] | None:
    """None when the request may read the admin endpoints, else (status, body)."""
    want = gw.settings.admin_token
    if want is None:
        return 403, (b'{"error":"admin endpoints are disabled: set LATENCY_GATEWAY_ADMIN_TOKEN and send '
                     b'Authorization: Bearer <token>"}')
    got = b""
    for k, v in scope["headers"]:
        if k.lower() == b"authorization":
            got = v
    if not hmac.compare_digest(got, b"Bearer " + want.encode()):
        return 401, b'{"error":"missing or wrong Authorization: Bearer <LATENCY_GATEWAY_ADMIN_TOKEN>"}'
    return None


def _query(scope, name: str) -> str | None:
    for part in scope.get("query_string", b"").decode("latin-1").split("&"):
        if part.startswith(name + "="):
            return part[len(name) + 1:]
    return None


def admin(gw: Gateway, scope) -> tuple[int, bytes]:
    """The answer to ``GET /gateway/...`` (already authorized)."""
    path = scope["path"]
    if path == "/gateway/endpoints":
        now = gw.health_clock()
        return 200, orjson.dumps([{
            "name": e.name, "url": e.url, "kv_cache_usage": e.metrics.kv_cache_usage,
            "waiting": e.metrics.waiting, "running": e.metrics.running,
            "inflight_requests": gw.inflight.snapshot(e.name).requests,
            "inflight_tokens": gw.inflight.snapshot(e.name).tokens,
            "healthy": e.healthy(now), "scrape_failures": e.scrape_failures,
            "dispatch_failures": e.dispatch_failures, "ejections": e.breaker.ejections,
            "ejected_for_s": round(e.breaker.remaining_s(now), 3),
            "prefix_lru_size": gw.prefix.size(e.name)} for e in gw.endpoints])
    if path == "/gateway/flow" and callable(snapshot := getattr(gw.router, "snapshot", None)):
        return 200, orjson.dumps(snapshot())
    if path == "/gateway/requests":
        values = {}
        for name, hi in (("since", None), ("limit", MAX_RECORDS)):
            raw = _query(scope, name)
            try:
                values[name] = max(0, int(raw)) if raw is not None else (0 if hi is None else hi)
            except ValueError:
                return 400, orjson.dumps({"detail": [{"loc": ["query", name], "msg": "must be an integer"}]})
        return 200, orjson.dumps(gw.records_since(values["since"], min(MAX_RECORDS, values["limit"])))
    return 404, b'{"error":"not found"}'
