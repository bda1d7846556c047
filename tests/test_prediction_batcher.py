"""Strict predictions of concurrent requests batched into one model call, each answered
exactly as if alone, on a real XGBoost bundle."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from prediction_server.batcher import StrictBatcher
from prediction_server.service import PredictionService
from prediction_server.sync import BundleSync
from support.prediction import ROW, settings_for, trace_rows, xgb_bundle_root


@pytest.fixture(scope="module")
def xgb_dir(tmp_path_factory) -> Path:
    return xgb_bundle_root(tmp_path_factory)


def test_concurrent_strict_requests_share_one_model_call(xgb_dir):
    """Coalescing on the strict hot path: requests waiting together are predicted in one
    bundle.predict call, each answered exactly as if alone; a bad one still gets its own 422."""
    import asyncio

    settings = settings_for(xgb_dir)
    service = PredictionService(settings)
    assert BundleSync(settings, service).sync_once()["result"] == "updated"
    batcher = StrictBatcher(service)
    bodies = [json.dumps({"requests": trace_rows(k + 1, start=11 * k)}).encode() for k in range(5)]
    bodies.insert(2, json.dumps({"requests": [dict(ROW, prefix_cache_score=2)]}).encode())

    async def together():
        return await asyncio.gather(*[batcher(b) for b in bodies])

    results = asyncio.run(together())
    assert batcher.flushes == 1
    # a loop that stopped before flushing leaves nothing behind for the next loop
    batcher._pending.append(("stale", None, 0.0))
    async def bounded():
        return await asyncio.wait_for(together(), 10)

    again = asyncio.run(bounded())
    assert batcher.flushes == 2 and [r[0] for r in again] == [r[0] for r in results]
    assert results[2][0] == 422
    assert json.loads(results[2][1])["detail"][0]["loc"] == ["body", "requests", 0, "prefix_cache_score"]
    for body, (status, payload) in zip(bodies[:2] + bodies[3:], results[:2] + results[3:]):
        alone_status, alone = service.predict_strict(body)
        got, want = json.loads(payload), json.loads(alone)
        assert status == alone_status == 200 and got["total_requests"] == want["total_requests"]
        for g, w in zip(got["predictions"], want["predictions"]):
            assert {k: v for k, v in g.items() if k != "predicted_at"} == \
                   {k: v for k, v in w.items() if k != "predicted_at"}
