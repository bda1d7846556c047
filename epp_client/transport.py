"""HTTP transport of the EPP clients: JSON POSTs to one server over pooled keep-alive
connections, synchronous and asyncio, on ``httpx``.

:meth:`HttpTransport.post` / :meth:`HttpTransport.apost` return ``(status, body)``. Every
failure of the exchange (refused, reset, closed mid-response, a malformed status line,
header, Content-Length or chunk size, a truncated body) is raised as
:class:`TransportError`; a spent time budget as ``TimeoutError``. Nothing else escapes,
so callers have exactly two failure paths to handle.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

#: h11 (under httpx) may still raise its own protocol errors on a garbled answer
_EXCHANGE_ERRORS = (httpx.HTTPError, OSError, ValueError)


class TransportError(ConnectionError):
    """The server could not be reached, closed the connection or sent a malformed answer."""


@dataclass(frozen=True)
class ServerAddress:
    url: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> "ServerAddress":
        u = urlsplit(url.strip())
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"only http://host:port URLs are supported, got {url!r}")
        return cls(url.strip().rstrip("/"), u.hostname, u.port or 80, u.path.rstrip("/"))


def _limits(max_idle: int) -> httpx.Limits:
    return httpx.Limits(max_connections=None, max_keepalive_connections=max_idle)


class HttpTransport:
    """Keep-alive connections to one server: a thread-safe ``httpx.Client`` for the
    synchronous path (at most ``max_idle_sync`` idle connections) and an
    ``httpx.AsyncClient`` per event loop for the asyncio path (``max_idle_async``)."""

    def __init__(self, addr: ServerAddress, max_idle_async: int = 32, max_idle_sync: int = 8) -> None:
        self.addr = addr
        self.max_idle_async = max_idle_async
        self._headers = {"Content-Type": "application/json"}
        # trust_env=False: a proxy from the environment must not capture loopback calls
        self._client = httpx.Client(limits=_limits(max_idle_sync), trust_env=False)
        self._aclient: httpx.AsyncClient | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None

    def _url(self, path: str) -> str:
        return self.addr.url + path

    def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        """POST ``body``; ``timeout`` bounds each network operation (connect, write, read)."""
        try:
            r = self._client.post(self._url(path), content=body, headers=self._headers, timeout=timeout)
            return r.status_code, r.content
        except httpx.TimeoutException:
            raise TimeoutError(f"{self.addr.url}: timed out") from None
        except _EXCHANGE_ERRORS as e:
            raise TransportError(f"{self.addr.url}: {e!r}") from None

    def _async_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._aclient is None or loop is not self._aloop:  # connections belong to one event loop
            self._aclient = httpx.AsyncClient(limits=_limits(self.max_idle_async), trust_env=False, timeout=None)
            self._aloop = loop
        return self._aclient

    async def apost(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body``; the caller bounds the time (``asyncio.timeout``)."""
        try:
            r = await self._async_client().post(self._url(path), content=body, headers=self._headers)
            return r.status_code, r.content
        except httpx.TimeoutException:
            raise TimeoutError(f"{self.addr.url}: timed out") from None
        except _EXCHANGE_ERRORS as e:
            raise TransportError(f"{self.addr.url}: {e!r}") from None

    def close(self) -> None:
        self._client.close()

    async def aclose(self) -> None:
        """Close the asyncio connections (those of the running loop) and the synchronous ones."""
        client, self._aclient = self._aclient, None
        if client is not None and self._aloop is asyncio.get_running_loop():
            await client.aclose()
        self.close()


def make_transport(addr: ServerAddress, max_idle_async: int = 32, max_idle_sync: int = 8):
    """Temporary, for the comparison: ``EPP_HTTP_TRANSPORT=raw`` selects the hand-written client."""
    import os

    if os.environ.get("EPP_HTTP_TRANSPORT") == "raw":
        from .httpclient import RawTransport

        return RawTransport(addr, max_idle_async, max_idle_sync)
    return HttpTransport(addr, max_idle_async, max_idle_sync)
