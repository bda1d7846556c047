"""epp_client.coalescer: concurrent predictor calls within the window share one bulk call."""
from __future__ import annotations

import asyncio

import numpy as np

from epp_client.predictor import PredictorClient
from support.predictor import expected, rows


def test_coalescing_window_merges_concurrent_calls(prediction_server):
    async def go(window, cap, n):
        c = PredictorClient([prediction_server], deadline_ms=3000, coalesce_window_ms=window, max_coalesced_rows=cap)
        out = await asyncio.gather(*(c.apredict_bulk(rows(3, seed=i)) for i in range(n)))
        batches = c._coalescer.batches
        await c.aclose()
        return out, batches

    out, batches = asyncio.run(go(20, 0, 6))
    assert batches == 1
    for i, r in enumerate(out):  # each caller gets its own slice
        t, p = expected(rows(3, seed=i))
        assert np.allclose(r.ttft_ms, t) and np.allclose(r.tpot_ms, p)
    out, batches = asyncio.run(go(10_000, 6, 6))  # the row cap dispatches at once (no 10 s wait)
    assert batches == 3 and all(r is not None for r in out)
