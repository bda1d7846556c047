"""``POST /reload`` without starving the server: concurrent reloads share syncs.

A sync can wait on a slow or hung training server for its whole timeout. Run naively in
the worker thread pool, N concurrent reloads hold N pool threads waiting on the sync lock,
and every other handler that needs the pool waits behind them. Here at most one sync runs
for reloads and at most one more is queued behind it: a reload that arrives while a sync
runs joins the queued one (which starts after the running one, so its result reflects a
sync begun after the request arrived), and every caller awaits on the event loop, not in
a thread. Each sync runs in one thread of the loop's default executor.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class CoalescedReload:
    """Awaitable ``sync_once`` shared by concurrent callers (one event loop)."""

    def __init__(self, sync_once: Callable[[], dict[str, Any]]) -> None:
        self._sync_once = sync_once
        self._running: asyncio.Task | None = None
        self._queued: asyncio.Task | None = None
        self.waiting = 0  # callers awaiting a result (observability, tests)
        self.syncs = 0  # syncs started for reloads

    async def __call__(self) -> dict[str, Any]:
        if self._queued is None:
            self._queued = asyncio.get_running_loop().create_task(self._run(self._running))
        task = self._queued
        self.waiting += 1
        try:
            # shield: a caller that goes away does not cancel the sync the others await
            return dict(await asyncio.shield(task))
        finally:
            self.waiting -= 1

    async def _run(self, previous: asyncio.Task | None) -> dict[str, Any]:
        if previous is not None:
            await asyncio.wait([previous])  # its outcome is its own callers' business
        me = asyncio.current_task()
        self._queued, self._running = None, me  # later callers queue behind this one
        self.syncs += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self._sync_once)
        finally:
            if self._running is me:
                self._running = None
