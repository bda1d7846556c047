"""Strict predictions of concurrent requests batched into one model call per loop iteration."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import orjson

from features.render import rfc3339

from .service import HTTPError, PredictionService


class StrictBatcher:
    """``POST /predict/bulk/strict`` for concurrent requests on one event loop: each request
    is validated on its own (its own 422), then the rows of all requests waiting in the same
    loop iteration go through ONE ``bundle.predict`` call (the model runtime's fixed cost,
    mostly XGBoost's per-call overhead, is paid once per batch instead of once per request).
    Trees score rows independently, so every row's numbers are exactly those of a request
    alone; the batch uses one bundle reference, so a response never mixes bundles. A lone
    request waits one loop iteration. The queue is bounded by the open connections (one
    request in flight per HTTP/1.1 connection)."""

    ENDPOINT = "/predict/bulk/strict"

    def __init__(self, service: PredictionService) -> None:
        self.service = service
        self._pending: list[tuple[np.ndarray, Any, float]] = []
        self._loop: Any = None
        self.flushes = 0  # batches predicted (observability, tests)

    async def __call__(self, body: bytes) -> tuple[int, bytes]:
        svc = self.service
        t0 = time.perf_counter()
        try:
            raw = svc._strict_raw(body, svc._served)
        except HTTPError as e:
            svc.metrics.count(self.ENDPOINT, e.status)
            return e.status, e.body()
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # (a loop that stopped with requests pending leaves none behind)
            self._loop, self._pending = loop, []
        fut = loop.create_future()
        self._pending.append((raw, fut, t0))
        if len(self._pending) == 1:
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        self.flushes += 1
        svc = self.service
        served = svc._served  # one bundle for every row of the batch
        try:
            raw = batch[0][0] if len(batch) == 1 else np.concatenate([b[0] for b in batch])
            ttft, tpot = served.bundle.predict(raw)
            predicted_at = rfc3339(time.time())
            off = 0
            for raw_i, fut, t0 in batch:
                n = raw_i.shape[0]
                out = svc._strict_out(served, ttft[off:off + n], tpot[off:off + n], predicted_at)
                off += n
                dt = time.perf_counter() - t0
                out["processing_time_ms"] = dt * 1000.0
                payload = orjson.dumps(out)
                svc.metrics.observe(self.ENDPOINT, 200, dt, n, served.bundle.source)
                if not fut.done():
                    fut.set_result((200, payload))
        except Exception as e:  # a bug: every waiting request gets it (the HTTP layer answers 500)
            for _, fut, _ in batch:
                if not fut.done():
                    fut.set_exception(e)
