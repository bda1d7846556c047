"""PredictorClient (A.2.8, B1.6) against the real prediction server on loopback, with
failure injection (dead ports, a slow / failing tiny HTTP server), and TrainingReporter
(B1.7) against a collecting HTTP endpoint."""
from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from epp_client.predictor import CircuitBreaker, PredictorClient
from epp_client.training import TrainingReporter, stratified_downsample
from features.loaded import LoadedBundle
from features.matrix import raw_matrix
from load.ports import free_port


class InjectServer:
    """Tiny HTTP/1.1 server for failure injection: ``handler(path, body) -> (status, body)``
    after ``delay`` seconds, or, with ``hold``, once ``release`` is set (at the latest when the
    server stops). Records every request body and counts the answers sent (``answered``): a
    client that returned while ``answered`` is 0 did not wait for the answer."""

    def __init__(self, handler, delay: float = 0.0, hold: bool = False):
        self.handler, self.delay, self.bodies = handler, delay, []
        self.release, self.answered = threading.Event(), 0
        if not hold:
            self.release.set()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.bodies.append(json.loads(body))
                if outer.delay:
                    time.sleep(outer.delay)
                outer.release.wait(30)
                status, out = outer.handler(self.path, body)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:
                    pass
                outer.answered += 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@contextmanager
def inject(handler, delay=0.0, hold=False):
    s = InjectServer(handler, delay, hold)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def prediction_server():
    """The real prediction server app (serving the built-in prior) on loopback."""
    from prediction_server.app import create_app
    from prediction_server.settings import Settings
    from support.servers import run_app

    settings = Settings.from_env({}, host="127.0.0.1", port="0", training_server_url="")
    with run_app(create_app(settings)) as url:
        yield url


def rows(n=16, seed=0):
    rng = random.Random(seed)
    return [{"kv_cache_percentage": rng.random(), "input_token_length": rng.randrange(1, 4000),
             "num_request_waiting": rng.randrange(0, 5), "num_request_running": rng.randrange(0, 20),
             "num_tokens_generated": 0, "prefix_cache_score": rng.random(),
             "prefill_tokens_in_flight": rng.randrange(0, 5000)} for _ in range(n)]


def expected(rs):
    t, p = LoadedBundle.builtin_prior().predict(raw_matrix(rs))
    return t, p


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


def test_circuit_breaker_states():
    now = [0.0]
    b = CircuitBreaker(failure_threshold=2, open_s=5, clock=lambda: now[0])
    b.failure()
    assert b.allows()
    b.failure()
    assert not b.allows() and b.opened == 1
    now[0] = 5.0
    assert b.allows()
    b.success()
    b.failure()
    assert b.allows()


def test_from_env(monkeypatch):
    monkeypatch.setenv("PREDICTION_SERVER_URL", " http://127.0.0.1:9001 , http://127.0.0.1:9002")
    monkeypatch.setenv("LATENCY_MAX_BULK_SIZE", "")  # blank: the default
    monkeypatch.setenv("LATENCY_COALESCE_WINDOW_MS", "2")
    c = PredictorClient.from_env()
    assert [s.url for s in c.servers] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert c.max_bulk_size == 100 and c.coalesce_window_s == 0.002 and c.deadline_s == 0.05
    assert PredictorClient.from_env(deadline_ms=7).deadline_s == 0.007  # a keyword wins
    monkeypatch.setenv("TRAINING_SERVER_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("LATENCY_MAX_SAMPLE_SIZE", "10000")
    r = TrainingReporter.from_env(autostart=False)
    assert r.addr.port == 9000 and r.max_sample_size == 10000 and r.flush_interval_s == 1.0


@pytest.mark.parametrize("env,value", [
    ("LATENCY_MAX_BULK_SIZE", "500"), ("LATENCY_MAX_BULK_SIZE", "0"), ("LATENCY_COALESCE_WINDOW_MS", "-1"),
    ("LATENCY_COALESCE_WINDOW_MS", "1ms"), ("LATENCY_MAX_COALESCED_ROWS", "-5"),
    ("LATENCY_MAX_CONCURRENT_DISPATCHES", "0"), ("LATENCY_PREDICTION_DEADLINE_MS", "fast"),
    ("PREDICTION_SERVER_URL", "localhost:8001"), ("PREDICTION_SERVER_URL", "http://a:1,ftp://b"),
])
def test_predictor_from_env_refuses_a_bad_value_naming_the_variable(monkeypatch, env, value):
    """Invalid values used to fall back to the default silently; now start-up stops."""
    from epp_client.settings import SettingsError

    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError) as e:
        PredictorClient.from_env()
    assert e.value.env == env and f"{env}: " in str(e.value) and value.split(",")[-1] in str(e.value)


@pytest.mark.parametrize("env,value", [
    ("TRAINING_SERVER_URL", "trainer:8000"), ("LATENCY_MAX_SAMPLE_SIZE", "0"), ("LATENCY_MAX_SAMPLE_SIZE", "many"),
    ("LATENCY_FLUSH_INTERVAL_SEC", "-1"), ("LATENCY_FLUSH_INTERVAL_SEC", "0.5"), ("LATENCY_HTTP_TIMEOUT_SEC", "0"),
])
def test_reporter_from_env_refuses_a_bad_value_naming_the_variable(monkeypatch, env, value):
    from epp_client.settings import SettingsError

    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError) as e:
        TrainingReporter.from_env(autostart=False)
    assert e.value.env == env and f"{env}: " in str(e.value) and value in str(e.value)


def test_from_env_reports_every_bad_variable_at_once(monkeypatch):
    from epp_client.settings import SettingsError

    monkeypatch.setenv("LATENCY_MAX_SAMPLE_SIZE", "0")
    monkeypatch.setenv("LATENCY_HTTP_TIMEOUT_SEC", "soon")
    with pytest.raises(SettingsError) as e:
        TrainingReporter.from_env(autostart=False)
    assert [env for env, _ in e.value.problems] == ["LATENCY_MAX_SAMPLE_SIZE", "LATENCY_HTTP_TIMEOUT_SEC"]


# ------------------------------------------------------------------ training reporter
def entry(ttft=0.0, tpot=0.0, i=0):
    return {"kv_cache_percentage": 0.1, "input_token_length": i, "num_request_waiting": 0, "num_request_running": 0,
            "num_tokens_generated": 0, "prefix_cache_score": 0.0, "actual_ttft_ms": ttft, "actual_tpot_ms": tpot}


def test_stratified_downsampling_quotas():
    es = [entry(ttft=1, i=i) for i in range(1500)] + [entry(tpot=1, i=i) for i in range(450)] + \
        [entry(i=i) for i in range(50)]
    out = stratified_downsample(es, 1000, random.Random(1))
    kinds = [("ttft" if e["actual_ttft_ms"] > 0 else "tpot" if e["actual_tpot_ms"] > 0 else "other") for e in out]
    assert (kinds.count("ttft"), kinds.count("tpot"), kinds.count("other")) == (750, 225, 25)
    # remainder goes to the largest group: 699 + 2, capped by the 700 it has
    es = [entry(ttft=1, i=i) for i in range(700)] + [entry(tpot=1, i=i) for i in range(200)] + \
        [entry(i=i) for i in range(101)]
    out = stratified_downsample(es, 1000, random.Random(1))
    assert sum(e["actual_ttft_ms"] > 0 for e in out) == 700 and len(out) == 999
    # remainder with a tie among the largest groups goes to TTFT first
    es = [entry(tpot=1, i=i) for i in range(3)] + [entry(ttft=1, i=i) for i in range(3)]
    out = stratified_downsample(es, 5, random.Random(1))
    assert sum(e["actual_ttft_ms"] > 0 for e in out) == 3 and len(out) == 5
    assert stratified_downsample(es, 10, random.Random(1)) == es
    # sampling is random within a group
    picks = {tuple(e["input_token_length"] for e in stratified_downsample(
        [entry(ttft=1, i=i) for i in range(100)], 10, random.Random(s))) for s in range(5)}
    assert len(picks) == 5


def test_reporter_posts_expects_202_and_counts_failures():
    status = [202]
    with inject(lambda path, body: (status[0], b'{"accepted": 1}')) as srv:
        r = TrainingReporter(srv.url, autostart=False)
        r.add([entry(ttft=5, i=1), entry(tpot=2, i=2)])
        assert r.flush() == 2 and r.sent == 2
        assert srv.bodies[0] == {"entries": [entry(ttft=5, i=1), entry(tpot=2, i=2)]}
        status[0] = 200  # anything but 202 is a failure; no retry
        r.add([entry(ttft=5)])
        assert r.flush() == 0 and r.failed == 1 and r.failed_posts == 1 and r.buffered() == 0
        r.flush()
        assert len(srv.bodies) == 2  # an empty buffer posts nothing
    r = TrainingReporter(f"http://127.0.0.1:{free_port()}", autostart=False)
    r.add([entry(ttft=1)])
    assert r.flush() == 0 and r.failed == 1


def test_reporter_downsamples_above_max_and_bounds_its_buffer():
    with inject(lambda path, body: (202, b"{}")) as srv:
        r = TrainingReporter(srv.url, max_sample_size=10, max_buffer=50, autostart=False)
        r.add([entry(ttft=1, i=i) for i in range(30)] + [entry(tpot=1, i=i) for i in range(10)])
        r.add([entry(ttft=1, i=i) for i in range(25)])  # 65 > 50: the 15 oldest are dropped
        assert r.dropped == 15 and r.buffered() == 50
        assert r.flush() == 10 and r.downsampled == 40 and len(srv.bodies[0]["entries"]) == 10


def test_reporter_flushes_periodically_and_on_close():
    with inject(lambda path, body: (202, b"{}")) as srv:
        r = TrainingReporter(srv.url, flush_interval_s=0.05)
        r.add([entry(ttft=1, i=i) for i in range(3)])
        give_up = time.monotonic() + 10
        while r.sent < 3 and time.monotonic() < give_up:
            time.sleep(0.02)
        assert r.sent == 3 and r._thread.is_alive()
        r.add([entry(tpot=1)])
        r.close()
        assert r.sent == 4 and not r._thread.is_alive()
        r.add([entry(ttft=1)])  # after close: counted as dropped, never buffered
        assert r.dropped == 1 and r.buffered() == 0
