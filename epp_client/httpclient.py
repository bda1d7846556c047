"""A lean HTTP/1.1 keep-alive client for JSON POSTs, async (asyncio streams) and sync
(blocking sockets), with a bounded connection pool per server and one response parser.

Hand-written rather than ``httpx`` because it is measurably faster on the routing path
(``docs/architecture.md``, "HTTP client"): it writes head and body in one send and does
little per request. Only what the prediction and training calls need: ``POST`` with a
Content-Length body, responses framed by Content-Length, chunked encoding or the close of
the connection.

Errors: every failure of an exchange (refused, reset, closed mid-response, a malformed
status line, header, Content-Length or chunk size, a truncated body) is raised as
:class:`TransportError`; a spent time budget as ``TimeoutError``. Nothing else escapes.
A keep-alive connection that turns out to be closed before any byte of the answer is
retried once on a fresh connection; a garbled answer is never retried.
"""
from __future__ import annotations

import asyncio
import socket
import threading
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import urlsplit

#: longest status or header line accepted (asyncio's default stream limit)
_LINE_LIMIT = 64 * 1024


class TransportError(ConnectionError):
    """The server could not be reached, closed the connection or sent a malformed answer."""


class _StaleConnection(TransportError):
    """A kept-alive connection was closed before any byte of the answer arrived."""


@dataclass(frozen=True)
class ServerAddress:
    url: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> ServerAddress:
        u = urlsplit(url.strip())
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"only http://host:port URLs are supported, got {url!r}")
        return cls(url.strip().rstrip("/"), u.hostname, u.port or 80, u.path.rstrip("/"))


# -- response parsing: one generator, driven by a sync and an async reader -------------
#: what the parser asks its driver for: a line, all bytes up to the close, or (an int) n bytes
_LINE, _REST = "line", "rest"


def _status(line: bytes) -> tuple[int, bool]:
    """(status, keep-alive by default) from a status line; TransportError if malformed."""
    parts = line.split(None, 2)
    if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or not (
            len(parts[1]) == 3 and parts[1].isdigit() and parts[1][:1] != b"0"):
        raise TransportError(f"bad status line {line[:60]!r}")
    return int(parts[1]), parts[0] == b"HTTP/1.1"


def _size(text: bytes, what: str, base: int = 10) -> int:
    """A non-negative Content-Length (decimal) or chunk size (hex)."""
    text = text.strip()
    digits = b"0123456789abcdefABCDEF" if base == 16 else b"0123456789"
    if not text or text.strip(digits):
        raise TransportError(f"bad {what} {text[:40]!r}")
    return int(text, base)


def _response() -> Generator[Any, bytes, tuple[int, bytes, bool]]:
    """Parse one response from what the driver sends back for each request (``_LINE``,
    ``_REST`` or a byte count; a short read is the driver's TransportError); returns
    (status, body, whether the connection may be kept)."""
    status_line = yield _LINE
    if not status_line:
        raise _StaleConnection("connection closed before the status line")
    status, keep = _status(status_line)
    length: int | None = None
    chunked = False
    while (line := (yield _LINE)) not in (b"\r\n", b"\n"):
        name, colon, value = line.partition(b":")
        if not line.endswith(b"\n") or not colon:
            raise TransportError(f"connection closed or bad line in the headers: {line[:60]!r}")
        name = name.strip().lower()
        if name == b"content-length":
            n = _size(value, "Content-Length")
            if length is not None and n != length:
                raise TransportError("conflicting Content-Length headers")
            length = n
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif name == b"connection":
            v = value.strip().lower()
            keep = v != b"close" and (keep or v == b"keep-alive")
    if status in (204, 304):
        return status, b"", keep
    if not chunked:
        if length is None:
            return status, (yield _REST), False
        return status, (yield length), keep
    data = bytearray()
    while size := _size((yield _LINE).split(b";")[0], "chunk size", 16):
        data += yield size
        if (yield _LINE) not in (b"\r\n", b"\n"):
            raise TransportError("chunk not followed by CRLF")
    while (line := (yield _LINE)) not in (b"\r\n", b"\n"):  # trailers
        if not line.endswith(b"\n"):
            raise TransportError("connection closed in the chunk trailer")
    return status, bytes(data), keep


async def _aread_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    parser = _response()
    want = next(parser)
    while True:
        if want is _LINE:
            try:
                got = await reader.readline()
            except ValueError:  # longer than the stream limit
                raise TransportError("line too long") from None
        elif want is _REST:
            got = await reader.read()
        else:
            try:
                got = await reader.readexactly(want)
            except asyncio.IncompleteReadError as e:
                raise TransportError(f"body truncated after {len(e.partial)} of {want} bytes") from None
        try:
            want = parser.send(got)
        except StopIteration as done:
            return done.value


def _read_response(rfile: BinaryIO) -> tuple[int, bytes, bool]:
    parser = _response()
    want = next(parser)
    while True:
        if want is _LINE:
            got = rfile.readline(_LINE_LIMIT + 1)
            if len(got) > _LINE_LIMIT:
                raise TransportError("line too long")
        elif want is _REST:
            got = rfile.read()
        else:
            got = rfile.read(want)
            if len(got) < want:
                raise TransportError(f"body truncated after {len(got)} of {want} bytes")
        try:
            want = parser.send(got)
        except StopIteration as done:
            return done.value


def _head(addr: ServerAddress, path: str, content_type: str, length: int) -> bytes:
    return (f"POST {addr.base_path}{path} HTTP/1.1\r\nHost: {addr.host}:{addr.port}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {length}\r\n\r\n").encode("latin-1")


class AsyncPool:
    """Keep-alive connections to one server (asyncio). At most ``max_idle`` are kept."""

    def __init__(self, addr: ServerAddress, max_idle: int = 32) -> None:
        self.addr = addr
        self.max_idle = max_idle
        self._idle: deque = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _conns(self) -> deque:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to one event loop
            self._idle = deque()
            self._loop = loop
        return self._idle

    async def post(self, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, bytes]:
        """POST and return (status, body). Reuses an idle connection; one found closed
        before it answered is retried once on a fresh connection."""
        idle = self._conns()
        head = _head(self.addr, path, content_type, len(body))
        while idle:
            reader, writer = idle.pop()
            if reader.at_eof() or writer.is_closing():
                writer.close()
                continue
            try:
                return await self._exchange(reader, writer, head + body)
            except _StaleConnection:
                break
        try:
            reader, writer = await asyncio.open_connection(self.addr.host, self.addr.port, limit=_LINE_LIMIT)
        except OSError as e:
            raise TransportError(f"{self.addr.url}: {e}") from None
        try:
            return await self._exchange(reader, writer, head + body)
        except _StaleConnection as e:
            raise TransportError(f"{self.addr.url}: {e}") from None

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        request: bytes) -> tuple[int, bytes]:
        keep = False
        try:
            try:
                writer.write(request)
                status, payload, keep = await _aread_response(reader)
            except TransportError:
                raise
            except (ConnectionResetError, BrokenPipeError) as e:
                raise _StaleConnection(repr(e)) from None
            except OSError as e:
                raise TransportError(f"{self.addr.url}: {e!r}") from None
            return status, payload
        finally:  # also on cancellation (deadline): a half-read connection is never reused
            if keep and len(self._idle) < self.max_idle:
                self._idle.append((reader, writer))
            else:
                writer.close()

    def close(self) -> None:
        while self._idle:
            _, writer = self._idle.pop()
            writer.close()


class _SyncConn:
    """A blocking socket and its buffered reader (kept together across requests)."""

    def __init__(self, addr: ServerAddress, timeout: float) -> None:
        self.sock = socket.create_connection((addr.host, addr.port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile = self.sock.makefile("rb")

    def exchange(self, request: bytes, timeout: float) -> tuple[int, bytes, bool]:
        self.sock.settimeout(timeout)
        self.sock.sendall(request)
        return _read_response(self.rfile)

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


class SyncPool:
    """Keep-alive blocking connections to one server; thread-safe checkout."""

    def __init__(self, addr: ServerAddress, max_idle: int = 8) -> None:
        self.addr = addr
        self.max_idle = max_idle
        self._idle: list[_SyncConn] = []
        self._lock = threading.Lock()

    def post(self, path: str, body: bytes, timeout: float,
             content_type: str = "application/json") -> tuple[int, bytes]:
        """POST; ``timeout`` bounds each socket operation. Reuses an idle connection; one
        found closed before it answered is retried once on a fresh connection."""
        request = _head(self.addr, path, content_type, len(body)) + body
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is not None:
            try:
                return self._exchange(conn, request, timeout)
            except _StaleConnection:
                pass
        try:
            conn = _SyncConn(self.addr, timeout)
        except TimeoutError:
            raise TimeoutError(f"{self.addr.url}: connect timed out") from None
        except OSError as e:
            raise TransportError(f"{self.addr.url}: {e}") from None
        try:
            return self._exchange(conn, request, timeout)
        except _StaleConnection as e:
            raise TransportError(f"{self.addr.url}: {e}") from None

    def _exchange(self, conn: _SyncConn, request: bytes, timeout: float) -> tuple[int, bytes]:
        keep = False
        try:
            try:
                status, payload, keep = conn.exchange(request, timeout)
            except (TransportError, TimeoutError):
                raise
            except (ConnectionResetError, BrokenPipeError) as e:
                raise _StaleConnection(repr(e)) from None
            except OSError as e:
                raise TransportError(f"{self.addr.url}: {e!r}") from None
            return status, payload
        finally:
            if keep:
                with self._lock:
                    if len(self._idle) < self.max_idle:
                        self._idle.append(conn)
                        conn = None
            if conn is not None:
                conn.close()

    def close(self) -> None:
        with self._lock:
            for c in self._idle:
                c.close()
            self._idle.clear()


class HttpTransport:
    """Both pools for one server: ``post`` (sync, per-operation timeout) and ``apost``
    (asyncio; the caller bounds the time with ``asyncio.timeout``)."""

    def __init__(self, addr: ServerAddress, max_idle_async: int = 32, max_idle_sync: int = 8) -> None:
        self.addr = addr
        self._async = AsyncPool(addr, max_idle_async)
        self._sync = SyncPool(addr, max_idle_sync)

    def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        return self._sync.post(path, body, timeout)

    async def apost(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self._async.post(path, body)

    def close(self) -> None:
        self._sync.close()

    async def aclose(self) -> None:
        self._async.close()
        self._sync.close()
