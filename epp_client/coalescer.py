"""B1.6 coalescing of concurrent asyncio prediction calls into one bulk POST."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class Coalescer:
    """The first submission starts a timer of ``window_s``; the batch is dispatched when it
    fires or as soon as ``max_rows`` (> 0) is reached, as one call of ``dispatch`` (rows
    concatenated in arrival order, at most ``max_concurrent`` dispatches at once); each
    caller's future gets its slice (``result.slice(offset, n)``), or None on failure."""

    def __init__(self, window_s: float, max_rows: int, max_concurrent: int,
                 dispatch: Callable[[list[dict]], Awaitable[Any]]) -> None:
        self.window_s = window_s
        self.max_rows = max_rows
        self.dispatch = dispatch
        self.pending: list[tuple[list[dict], asyncio.Future]] = []
        self.pending_rows = 0
        self.timer: asyncio.TimerHandle | None = None
        self.sem = asyncio.Semaphore(max_concurrent)
        self.tasks: set[asyncio.Task] = set()
        self.batches = 0

    def submit(self, rows: list[dict]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.pending.append((rows, fut))
        self.pending_rows += len(rows)
        if self.timer is None:
            self.timer = loop.call_later(self.window_s, self.flush)
        if self.max_rows > 0 and self.pending_rows >= self.max_rows:
            self.flush()
        return fut

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.pending, self.pending_rows = self.pending, [], 0
        if batch:
            task = asyncio.get_running_loop().create_task(self._dispatch(batch))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _dispatch(self, batch: list[tuple[list[dict], asyncio.Future]]) -> None:
        self.batches += 1
        rows = [r for rs, _ in batch for r in rs]
        async with self.sem:
            result = await self.dispatch(rows)
        off = 0
        for rs, fut in batch:
            n = len(rs)
            if not fut.done():
                fut.set_result(None if result is None else result.slice(off, n))
            off += n

    def shutdown(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for _, fut in self.pending:
            if not fut.done():
                fut.set_result(None)
        self.pending = []
        for t in self.tasks:
            t.cancel()
