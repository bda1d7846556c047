"""The two sides of one gateway request: reading the client's body and noticing when it goes
away; reading the upstream's first chunk and closing it.

An ASGI server reports ``http.disconnect`` both when the client really leaves and, on the
next ``receive()``, after a response has completed normally; only the first is a client
disconnect. :class:`ClientWatch` tells them apart by remembering whether the final body
message was sent.
"""
from __future__ import annotations

import asyncio


class TooLarge(Exception):
    """The request body is over the gateway's limit."""


class Disconnected(Exception):
    """The client left while its request body was being read."""


async def read_body(receive, limit: int) -> bytes:
    parts: list[bytes] = []
    n = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise Disconnected
        b = msg.get("body", b"")
        n += len(b)
        if n > limit:
            raise TooLarge
        parts.append(b)
        if not msg.get("more_body", False):
            return b"".join(parts)


class ClientWatch:
    """Cancel the current task when the client disconnects before its response completed.

    Use ``send`` (it tracks ``started`` and ``completed``) for every response message;
    ``gone`` is set only for a real disconnect, i.e. one before the final body message.
    """

    def __init__(self, receive, send) -> None:
        self._receive = receive
        self._send = send
        self.started = False
        self.completed = False
        self.gone = False
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("ClientWatch must be created inside the task that handles the request")
        self._task = task
        self._watcher = asyncio.create_task(self._watch())

    async def send(self, msg) -> None:
        if msg["type"] == "http.response.start":
            self.started = True
        elif msg["type"] == "http.response.body" and not msg.get("more_body", False):
            self.completed = True  # whatever is received after this is the end of the exchange
        await self._send(msg)

    async def _watch(self) -> None:
        while True:
            msg = await self._receive()
            if msg["type"] == "http.disconnect":
                if not self.completed:
                    self.gone = True
                    self._task.cancel()
                return

    @property
    def task(self) -> asyncio.Task:
        """The task that a disconnect cancels (the one that created this watch)."""
        return self._task

    def close(self) -> None:
        self._watcher.cancel()


async def first_nonempty(it) -> bytes | None:
    """The first non-empty chunk of an upstream body (None: it ended without one)."""
    async for chunk in it:
        if chunk:
            return chunk
    return None


async def aclose_quietly(resp) -> None:
    """Close an upstream response (best effort, even while being cancelled)."""
    try:
        await asyncio.shield(resp.aclose())
    except BaseException:  # noqa: BLE001 - closing is best effort
        pass
