"""A lean HTTP/1.1 keep-alive client for JSON POSTs, async (asyncio streams) and sync
(``http.client``), with a bounded connection pool per server.

Only what the prediction and training calls need: ``POST`` with a Content-Length body,
responses framed by Content-Length or chunked encoding. Errors are raised as
:class:`TransportError` (connection level: refused, reset, closed) or ``TimeoutError``.
"""
from __future__ import annotations

import asyncio
import http.client
import threading
from collections import deque


from .transport import ServerAddress, TransportError


class AsyncPool:
    """Keep-alive connections to one server (asyncio). At most ``max_idle`` are kept."""

    def __init__(self, addr: ServerAddress, max_idle: int = 32) -> None:
        self.addr = addr
        self.max_idle = max_idle
        self._idle: deque = deque()
        self._loop = None

    def _conns(self) -> deque:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to one event loop
            self._idle = deque()
            self._loop = loop
        return self._idle

    async def post(self, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, bytes]:
        """POST and return (status, body). Reuses an idle connection; a stale one is
        retried once on a fresh connection."""
        idle = self._conns()
        head = (f"POST {self.addr.base_path}{path} HTTP/1.1\r\nHost: {self.addr.host}:{self.addr.port}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n").encode("latin-1")
        while idle:
            reader, writer = idle.pop()
            if reader.at_eof() or writer.is_closing():
                writer.close()
                continue
            try:
                return await self._exchange(reader, writer, head, body)
            except (TransportError, ConnectionError, asyncio.IncompleteReadError):
                writer.close()  # stale keep-alive connection: open a fresh one
                break
        try:
            reader, writer = await asyncio.open_connection(self.addr.host, self.addr.port)
        except OSError as e:
            raise TransportError(f"{self.addr.url}: {e}") from None
        try:
            return await self._exchange(reader, writer, head, body)
        except (ConnectionError, asyncio.IncompleteReadError, OSError) as e:
            writer.close()
            raise TransportError(f"{self.addr.url}: {e!r}") from None

    async def _exchange(self, reader, writer, head: bytes, body: bytes) -> tuple[int, bytes]:
        ok = False
        try:
            writer.write(head + body)
            status_line = await reader.readline()
            if not status_line:
                raise TransportError("connection closed")
            parts = status_line.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                raise TransportError(f"bad status line {status_line[:60]!r}")
            status = int(parts[1])
            length = None
            chunked = False
            keep = parts[0] == b"HTTP/1.1"
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n"):
                    break
                if not line:
                    raise TransportError("connection closed in headers")
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
                elif name == b"connection":
                    v = value.strip().lower()
                    keep = v != b"close" and (keep or v == b"keep-alive")
            if chunked:
                data = bytearray()
                while True:
                    size = int((await reader.readline()).split(b";")[0], 16)
                    if size == 0:
                        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    data += await reader.readexactly(size)
                    await reader.readexactly(2)
                payload = bytes(data)
            elif length is not None:
                payload = await reader.readexactly(length)
            else:
                payload = await reader.read()
                keep = False
            ok = keep
            return status, payload
        finally:
            if ok and len(self._idle) < self.max_idle:
                self._idle.append((reader, writer))
            elif not ok:
                writer.close()

    def close(self) -> None:
        while self._idle:
            _, writer = self._idle.pop()
            writer.close()


class SyncPool:
    """Keep-alive ``http.client`` connections to one server; thread-safe checkout."""

    def __init__(self, addr: ServerAddress, max_idle: int = 8) -> None:
        self.addr = addr
        self.max_idle = max_idle
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def post(self, path: str, body: bytes, timeout: float,
             content_type: str = "application/json") -> tuple[int, bytes]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        fresh = conn is None
        for attempt in range(2):
            if conn is None:
                conn = http.client.HTTPConnection(self.addr.host, self.addr.port, timeout=timeout)
                fresh = True
            try:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.request("POST", self.addr.base_path + path, body=body,
                             headers={"Content-Type": content_type, "Content-Length": str(len(body))})
                resp = conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    conn.close()
                else:
                    with self._lock:
                        if len(self._idle) < self.max_idle:
                            self._idle.append(conn)
                            conn = None
                    if conn is not None:
                        conn.close()
                return resp.status, data
            except TimeoutError:
                conn.close()
                raise
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                conn = None
                if fresh or attempt == 1:
                    raise TransportError(f"{self.addr.url}: {e!r}") from None
        raise TransportError(f"{self.addr.url}: unreachable")

    def close(self) -> None:
        with self._lock:
            for c in self._idle:
                c.close()
            self._idle.clear()


class RawTransport:
    """The hand-written pools behind the ``HttpTransport`` interface (for the comparison)."""

    def __init__(self, addr: ServerAddress, max_idle_async: int = 32, max_idle_sync: int = 8) -> None:
        self.addr = addr
        self._a = AsyncPool(addr, max_idle_async)
        self._s = SyncPool(addr, max_idle_sync)

    def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        return self._s.post(path, body, timeout)

    async def apost(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self._a.post(path, body)

    def close(self) -> None:
        self._s.close()

    async def aclose(self) -> None:
        self._a.close()
        self._s.close()
