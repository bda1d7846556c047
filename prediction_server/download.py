"""Bounded HTTP downloads of bundle files: whatever a bundle server sends, at most ``limit``
decoded bytes are kept, and they go to a sink (a temporary file for model files).

* ``Accept-Encoding: identity`` is asked for and the body is read raw (``iter_raw``):
  httpx's own decoder would inflate a whole received chunk at once, so a small gzip bomb
  could become hundreds of megabytes before any limit is checked. A server that sends
  ``Content-Encoding: gzip`` anyway is decoded here with an output bound per step; any
  other encoding is refused.
* A declared ``Content-Length`` above the limit is refused before reading; an endless or
  lying stream is cut as soon as it passes the limit; a total deadline bounds a trickle.
"""
from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from typing import Protocol

import httpx

#: raw bytes read per step
CHUNK = 64 * 1024


class Sink(Protocol):
    """Where :func:`bounded_get` writes the body (a file, a BytesIO, a hashing wrapper)."""

    def write(self, data: bytes, /) -> object: ...


class SyncFailure(Exception):
    """A bundle sync failed; ``reason`` is the metrics label."""

    def __init__(self, reason: str, msg: str, status: int | None = None) -> None:
        self.reason = reason
        self.status = status
        super().__init__(msg)


class _Gunzip:
    """gzip decoding in pieces of at most STEP bytes, never past ``room + 1`` in all."""

    STEP = 1024 * 1024

    def __init__(self) -> None:
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def feed(self, data: bytes, room: int) -> Iterator[bytes]:
        while data:
            try:
                out = self._z.decompress(data, min(self.STEP, room + 1))
            except zlib.error as e:
                raise SyncFailure("bad_encoding", f"gzip body does not decode: {e}") from None
            data = self._z.unconsumed_tail
            room -= len(out)
            yield out
            if room < 0:
                return


def bounded_get(client: httpx.Client, path: str, limit: int, deadline: float, sink: Sink,
                headers: dict | None = None) -> int | None:
    """GET ``path`` into ``sink``; returns the number of bytes written, or None for a 304.
    Raises SyncFailure (reasons: http_status, too_large, bad_encoding, timeout, network)."""
    try:
        with client.stream("GET", path, headers={"Accept-Encoding": "identity", **(headers or {})}) as resp:
            if resp.status_code == 304:
                return None
            if resp.status_code != 200:
                raise SyncFailure("http_status", f"GET {path}: HTTP {resp.status_code}", resp.status_code)
            encoding = resp.headers.get("content-encoding", "identity").strip().lower()
            if encoding in ("gzip", "x-gzip"):
                decoder: _Gunzip | None = _Gunzip()
            elif encoding in ("", "identity"):
                decoder = None
                declared = resp.headers.get("content-length")
                if declared is not None and (not declared.isdigit() or int(declared) > limit):
                    raise SyncFailure("too_large", f"GET {path}: Content-Length {declared[:20]} > limit {limit}")
            else:
                raise SyncFailure("bad_encoding", f"GET {path}: unsupported Content-Encoding {encoding[:40]!r}")
            size = 0
            for raw in resp.iter_raw(CHUNK):
                for data in ((raw,) if decoder is None else decoder.feed(raw, limit - size)):
                    size += len(data)
                    if size > limit:
                        raise SyncFailure("too_large", f"GET {path}: more than {limit} bytes")
                    sink.write(data)
                if time.monotonic() > deadline:
                    raise SyncFailure("timeout", f"GET {path}: download exceeded its deadline")
            return size
    except httpx.TimeoutException as e:
        raise SyncFailure("timeout", f"GET {path}: {type(e).__name__}") from None
    except httpx.HTTPError as e:
        raise SyncFailure("network", f"GET {path}: {type(e).__name__}: {str(e)[:200]}") from None
