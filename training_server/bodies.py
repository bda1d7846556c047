"""Request bodies of the training server: who may send one, admission, reading, parsing.

Who: with ``LATENCY_API_TOKEN`` set, write endpoints need it as a bearer token
(:func:`check_token`); without one, ``/flush`` is allowed from loopback only
(:func:`check_flush_access`).

Checked in this order, each before any byte of the body is read:

* ``Content-Type`` must be ``application/json`` (a ``charset`` parameter, if any, UTF-8):
  anything else is 415. A browser cannot send that type cross-site without a CORS
  preflight, which this server never grants, so a forged form or ``text/plain`` POST
  never reaches a handler.
* Size: a ``Content-Length`` over the limit is 413.
* Admission: the bytes of bodies in flight (being read, parsed and stored) are bounded by
  :class:`InflightBytes` (``LATENCY_MAX_INFLIGHT_BYTES``). A body whose declared length
  does not fit in what is left is refused with 429 and ``Retry-After`` unread; a body
  without ``Content-Length`` is counted chunk by chunk as it streams. The reservation is
  held until the handler has answered.

Parsing (orjson) refuses invalid JSON and anything nested deeper than
:data:`MAX_JSON_DEPTH` with 422 naming ``body``. A large ``{"<key>": [...]}`` body is
parsed slice by slice (:func:`array_slices`), so the parsed form of only about
:data:`SLICE_BYTES` of it exists at a time instead of several times the whole body.
"""
from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import orjson
from fastapi import Request
from starlette.requests import ClientDisconnect

#: Deepest nesting accepted in a JSON body. Wire bodies are 3 levels deep
#: ({"entries": [{...}]}); the margin leaves room for structured extra fields.
MAX_JSON_DEPTH = 32
RETRY_AFTER_S = 1
#: Bytes of a large array body parsed at once (see :func:`array_slices`).
SLICE_BYTES = 1 << 20
_CONTAINERS = (dict, list)
_BOUNDARY = re.compile(rb"}\s*,\s*{")
_WS = b" \t\r\n"
T = TypeVar("T")


class HTTPProblem(Exception):
    """An error answer: status, FastAPI-style detail, extra headers."""

    def __init__(self, status: int, detail: Any, headers: dict | None = None) -> None:
        self.status = status
        self.detail = detail
        self.headers = headers or {}


def field_problem(loc: list, msg: str, kind: str = "value_error", status: int = 422) -> HTTPProblem:
    return HTTPProblem(status, [{"loc": loc, "msg": msg, "type": kind}])


def too_busy(msg: str, retry_after: int = RETRY_AFTER_S) -> HTTPProblem:
    return HTTPProblem(429, msg, {"Retry-After": str(retry_after)})


def nested_deeper_than(doc: Any, limit: int) -> bool:
    """True when ``doc`` has containers nested more than ``limit`` levels (iterative)."""
    stack = [(doc, 1)] if type(doc) in _CONTAINERS else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for v in (node.values() if type(node) is dict else node):
            if type(v) in _CONTAINERS:
                stack.append((v, depth + 1))
    return False


def parse_json(body: bytes | bytearray) -> Any:
    """The parsed body; 422 for invalid JSON or nesting deeper than MAX_JSON_DEPTH."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        if "depth" in str(e).lower():
            raise field_problem(["body"], f"JSON nested deeper than {MAX_JSON_DEPTH} levels", "json_depth") from None
        raise field_problem(["body"], f"body is not valid JSON: {e}", "json_invalid") from None
    if nested_deeper_than(doc, MAX_JSON_DEPTH):
        raise field_problem(["body"], f"JSON nested deeper than {MAX_JSON_DEPTH} levels", "json_depth")
    return doc


class NotSplittable(Exception):
    """The body is not a plain ``{"<key>": [{...}, ...]}``: parse it whole instead."""


def array_slices(body: bytes | bytearray, key: str) -> Iterator[list]:
    """The elements of ``body = {"<key>": [...]}`` as lists, about SLICE_BYTES of JSON each.

    The array is cut after a ``}`` followed by ``,`` and ``{``; every slice must parse on
    its own as an array, which holds only when each cut fell between two top-level
    elements (a cut inside a string leaves it unterminated, one inside a nested value
    leaves brackets unbalanced). Raises :class:`NotSplittable` (possibly after slices were
    yielded: start over with :func:`parse_json`) for any other shape or invalid JSON."""
    head = re.match(rb'\s*{\s*"' + re.escape(key.encode()) + rb'"\s*:\s*\[', body)
    end = len(body)
    while end and body[end - 1] in _WS:
        end -= 1
    stop = end - 1  # the closing brace
    while stop > 0 and body[stop - 1] in _WS:
        stop -= 1
    if head is None or body[end - 1:end] != b"}" or body[stop - 1:stop] != b"]":
        raise NotSplittable(key)
    pos, stop = head.end(), stop - 1  # the array's inside: body[pos:stop]
    while pos < stop:
        m = _BOUNDARY.search(body, pos + SLICE_BYTES, stop) if stop - pos > SLICE_BYTES else None
        cut, nxt = (m.start() + 1, m.end() - 1) if m else (stop, stop)
        try:
            items = orjson.loads(b"[" + body[pos:cut] + b"]")
        except orjson.JSONDecodeError:
            raise NotSplittable(key) from None
        if nested_deeper_than(items, MAX_JSON_DEPTH - 1):
            raise NotSplittable(key)
        yield items
        pos = nxt


def parse_bulk(body: bytes | bytearray, validate: Callable[[Iterator[list]], T]) -> T:
    """``validate`` applied to the entries of a ``{"entries": [...]}`` body, as lists. A
    large body is parsed slice by slice (:func:`array_slices`) so its parsed form stays
    small; any other shape is parsed whole, and a body that is not such an object is 422."""
    if len(body) > 2 * SLICE_BYTES:
        try:
            return validate(array_slices(body, "entries"))
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
    return validate(iter([entries]))


def check_token(token: str | None, authorization: str | None) -> None:
    """401 unless ``authorization`` is ``Bearer <token>`` (nothing to check without a token)."""
    if token is None:
        return
    given = ""
    if authorization and authorization[:7].lower() == "bearer ":
        given = authorization[7:].strip()
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise HTTPProblem(401, "missing or invalid bearer token (Authorization: Bearer <token>)",
                          {"WWW-Authenticate": "Bearer"})


def check_flush_access(token: str | None, authorization: str | None, loopback: bool) -> None:
    """The token when one is configured; without one, only a caller on loopback."""
    if token is not None:
        check_token(token, authorization)
    elif not loopback:
        raise HTTPProblem(403, "/flush without LATENCY_API_TOKEN is allowed from loopback only; "
                               "set LATENCY_API_TOKEN to flush from another host")


def require_json(request: Request) -> None:
    """415 unless the body is declared ``application/json`` (UTF-8)."""
    raw = request.headers.get("content-type")
    if raw is None:
        raise HTTPProblem(415, "Content-Type missing: send the body as application/json")
    media, *params = [p.strip() for p in raw.split(";")]
    charset = {k.strip().lower(): v.strip().strip('"').lower()
               for k, _, v in (p.partition("=") for p in params)}.get("charset", "utf-8")
    if media.lower() != "application/json" or charset not in ("utf-8", "utf8"):
        raise HTTPProblem(415, f"Content-Type {raw[:100]!r} is not supported: send the body as application/json")


def from_loopback(request: Request) -> bool:
    """True when the peer (after uvicorn's trusted proxy headers) is 127.0.0.0/8 or ::1."""
    host = request.client.host if request.client is not None else ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


class InflightBytes:
    """Bytes of request bodies in flight. Used from the event loop only (no lock)."""

    def __init__(self, limit: int, on_refuse: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.used = 0
        self.on_refuse = on_refuse

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            if self.on_refuse is not None:
                self.on_refuse()
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


@asynccontextmanager
async def admitted_body(request: Request, limit: int, budget: InflightBytes) -> AsyncIterator[bytearray]:
    """The body, read only once admitted (see the module docstring); the reservation is
    released when the block exits."""
    cl = request.headers.get("content-length")
    declared = None
    if cl is not None:
        try:
            declared = int(cl)
        except ValueError:
            raise field_problem(["header", "content-length"], "not an integer", "int_parsing", 400) from None
        if declared > limit:
            raise HTTPProblem(413, f"body of {declared} bytes exceeds the limit of {limit} bytes")
        if not budget.take(declared):
            raise _busy(budget)
    held = declared or 0
    try:
        buf = bytearray(declared) if declared else bytearray()
        size = 0
        try:
            async for chunk in request.stream():
                n = len(chunk)
                if declared is not None:
                    buf[size:size + n] = chunk  # in place while within the declared length
                else:
                    if size + n > limit:
                        raise HTTPProblem(413, f"body exceeds the limit of {limit} bytes")
                    if not budget.take(n):
                        raise _busy(budget)
                    held += n
                    buf += chunk
                size += n
        except ClientDisconnect:
            raise HTTPProblem(400, "the client went away before sending its whole body") from None
        if declared is not None and size != declared:
            del buf[size:]
        yield buf
    finally:
        budget.give(held)


def _busy(budget: InflightBytes) -> HTTPProblem:
    return too_busy(f"busy: {budget.used} bytes of request bodies in flight (limit {budget.limit}); retry later")
