"""epp_client.predictor: PredictorClient (A.2.8, B1.6) against the real prediction server on
loopback, with failure injection (dead ports, a slow / failing tiny HTTP server)."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from epp_client.predictor import PredictorClient
from load.ports import free_port
from support.inject import inject
from support.predictor import expected, rows


def test_sync_and_async_predictions_match_the_model_by_position(prediction_server):
    c = PredictorClient([prediction_server], deadline_ms=2000)
    rs = rows()
    t, p = expected(rs)
    res = c.predict_bulk(rs)
    assert res is not None and np.allclose(res.ttft_ms, t) and np.allclose(res.tpot_ms, p)
    assert res.model_version and res.model_source == "prior"

    async def go():
        out = await asyncio.gather(*(c.apredict_bulk(rows(8, seed=i)) for i in range(10)))
        await c.aclose()
        return out

    for i, r in enumerate(asyncio.run(go())):
        t, p = expected(rows(8, seed=i))
        assert np.allclose(r.ttft_ms, t) and np.allclose(r.tpot_ms, p)
    m = c.metrics.snapshot()
    assert (m["calls"], m["successes"], m["fallbacks"]) == (11, 11, 0) and m["latency_ms"]["n"] == 11
    c.close()


def test_invalid_rows_fail_before_any_call(prediction_server):
    c = PredictorClient([prediction_server])
    bad = rows(2)
    bad[1]["kv_cache_percentage"] = 1.5
    assert c.predict_bulk(bad) is None
    assert c.predict_bulk([]) is None
    assert c.predict_bulk(rows(101)) is None  # MaxBulkSize 100
    assert c.metrics.failures == {"invalid_rows": 3} and c.metrics.fallbacks == 3
    assert c.metrics.per_server == {}  # no HTTP call was made


def test_spread_retry_on_connection_failure_and_circuit(prediction_server):
    dead = f"http://127.0.0.1:{free_port()}"
    now = [0.0]
    c = PredictorClient([dead, prediction_server], deadline_ms=2000, failure_threshold=3, circuit_open_s=1.0,
                        clock=lambda: now[0])
    for _ in range(10):
        assert c.predict_bulk(rows(4)) is not None  # a dead server never costs a prediction
    m = c.metrics
    assert m.failures["connection"] == 3 and m.retries == 3  # then its circuit is open
    assert c.breakers[dead].is_open and m.per_server[prediction_server]["calls"] == 10
    now[0] += 1.5  # half-open: one more try, it fails again and reopens
    assert c.predict_bulk(rows(4)) is not None
    assert m.failures["connection"] == 4 and c.breakers[dead].is_open
    c.close()


def test_all_servers_down_returns_none_and_counts_fallbacks():
    c = PredictorClient([f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"])
    for _ in range(4):
        assert c.predict_bulk(rows(4)) is None
    assert asyncio.run(c.apredict_bulk(rows(4))) is None
    m = c.metrics
    assert m.fallbacks == 5 and m.successes == 0
    assert m.failures["connection"] >= 3 and m.failures.get("circuit_open", 0) >= 1


def test_slow_server_gives_up_within_the_deadline_sync_and_async():
    def answer(path, body):
        n = len(json.loads(body)["requests"])
        return 200, json.dumps({"predictions": [{"ttft_ms": 1.0, "tpot_ms": 1.0}] * n}).encode()

    with inject(answer, hold=True) as slow:  # answers only once released
        c = PredictorClient([slow.url], deadline_ms=50)
        assert c.predict_bulk(rows(4)) is None
        assert asyncio.run(c.apredict_bulk(rows(4))) is None
        assert slow.answered == 0  # both calls gave up before the server answered
        assert c.metrics.failures["timeout"] == 2 and c.metrics.fallbacks == 2


@pytest.mark.parametrize("status,payload,kind", [
    (503, b'{"detail":"no model"}', "status_503"),
    (200, b'{"predictions":[{"ttft_ms":1,"tpot_ms":1}]}', "count_mismatch"),
    (200, b"not json", "bad_response"),
    (200, b'{"predictions":[{"ttft_ms":1},{"ttft_ms":1}]}', "bad_response"),
])
def test_bad_answers_are_failures(status, payload, kind):
    with inject(lambda path, body: (status, payload)) as srv:
        c = PredictorClient([srv.url], deadline_ms=2000)
        assert c.predict_bulk(rows(2)) is None
        assert asyncio.run(c.apredict_bulk(rows(2))) is None
        assert c.metrics.failures[kind] == 2 and srv.bodies[0] == {"requests": rows(2)}
