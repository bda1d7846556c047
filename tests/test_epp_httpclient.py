"""epp_client's HTTP client (epp_client/httpclient.py) against a raw loopback server that
sends exactly the bytes a case needs: chunked answers are read and the connection kept;
every malformed, truncated or cut answer is a transport failure — ``predict_bulk`` and
``apredict_bulk`` return None, the circuit breaker counts it, nothing raises."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
from contextlib import contextmanager

import pytest

from epp_client.predictor import PredictorClient
from epp_client.training import TrainingReporter

ROWS = [{"kv_cache_percentage": 0.5, "input_token_length": 100 + i, "num_request_waiting": 0,
         "num_request_running": 1, "num_tokens_generated": 0, "prefix_cache_score": 0.0,
         "prefill_tokens_in_flight": 0} for i in range(3)]
ANSWER = json.dumps({"predictions": [{"ttft_ms": 10.0 + i, "tpot_ms": 2.0 + i} for i in range(3)]}).encode()


class RawServer:
    """Loopback server: reads each request (head + Content-Length body), then sends
    ``respond(index)`` -> (raw bytes, close?) where ``index`` counts requests overall."""

    def __init__(self, respond):
        self.respond = respond
        self.connections = 0
        self.requests = 0
        self._lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by stop()
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn, conn.makefile("rb") as rfile:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = rfile.readline()
                    if not line:
                        return
                    head += line
                length = next(int(h.split(b":")[1]) for h in head.lower().split(b"\r\n")
                              if h.startswith(b"content-length:"))
                rfile.read(length)
                with self._lock:
                    index, self.requests = self.requests, self.requests + 1
                data, close = self.respond(index)
                try:
                    conn.sendall(data)
                except OSError:
                    return
                if close:
                    return

    def stop(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (close alone does not)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(5)
        assert not self.thread.is_alive(), "the raw server's accept thread did not stop"


@contextmanager
def raw_server(respond):
    s = RawServer(respond)
    try:
        yield s
    finally:
        s.stop()


def chunked(body: bytes, sizes=(7, 1, 40)) -> bytes:
    """``body`` in chunks of the given sizes (the rest in one), with an extension and a trailer."""
    out, i = [], 0
    for n in (*sizes, len(body)):
        part, i = body[i:i + n], i + n
        if part:
            out.append(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
    return b"".join(out) + b"0\r\nX-Trailer: t\r\n\r\n"


OK_CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
              + chunked(ANSWER))
OK_LENGTH = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)


def call(client: PredictorClient, mode: str):
    if mode == "sync":
        return client.predict_bulk(ROWS)
    return asyncio.run(client.apredict_bulk(ROWS))


def assert_predictions(result):
    assert result is not None
    assert result.ttft_ms == [10.0, 11.0, 12.0] and result.tpot_ms == [2.0, 3.0, 4.0]


def predict_twice(c, mode):
    """Two bulk predictions on one client, sync or async, each with the server's answer."""
    async def twice():
        return [await c.apredict_bulk(ROWS), await c.apredict_bulk(ROWS)]

    results = [c.predict_bulk(ROWS), c.predict_bulk(ROWS)] if mode == "sync" else asyncio.run(twice())
    for r in results:
        assert_predictions(r)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_chunked_answers_are_read_and_the_connection_reused(mode):
    with raw_server(lambda i: (OK_CHUNKED, False)) as srv:
        c = PredictorClient([srv.url], deadline_ms=2000)
        predict_twice(c, mode)
        assert srv.requests == 2 and srv.connections == 1  # kept alive after a chunked answer
        assert c.metrics.successes == 2 and c.metrics.failures == {}
        c.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_kept_connection_closed_by_the_server_is_retried_on_a_fresh_one(mode):
    # the first answer keeps the connection, then the server closes it: the second call
    # finds it dead before any byte of the answer and reconnects, without a failure
    with raw_server(lambda i: (OK_LENGTH, True) if i == 0 else (OK_LENGTH, False)) as srv:
        c = PredictorClient([srv.url], deadline_ms=2000)
        predict_twice(c, mode)
        assert srv.requests == 2 and srv.connections == 2
        assert c.metrics.failures == {} and c.breakers[srv.url].consecutive == 0
        c.close()


STATUS = b"HTTP/1.1 200 OK\r\n"
MALFORMED = {
    "bad Content-Length": STATUS + b"Content-Length: 12abc\r\n\r\n" + ANSWER,
    "negative Content-Length": STATUS + b"Content-Length: -5\r\n\r\n" + ANSWER,
    "conflicting Content-Lengths": STATUS + b"Content-Length: %d\r\nContent-Length: 3\r\n\r\n%s" % (
        len(ANSWER), ANSWER),
    "status not a number": b"HTTP/1.1 2OO OK\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER),
    "status out of range": b"HTTP/1.1 42 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER),
    "not HTTP": b"ICY 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER),
    "garbage status line": b"hello there\r\n\r\n",
    "header without a colon": STATUS + b"Content-Length %d\r\n\r\n%s" % (len(ANSWER), ANSWER),
    "bad chunk size": STATUS + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + ANSWER + b"\r\n0\r\n\r\n",
    "negative chunk size": STATUS + b"Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n",
    "chunk not followed by CRLF": STATUS + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%sXX0\r\n\r\n" % (
        len(ANSWER), ANSWER),
    "truncated body": STATUS + b"Content-Length: %d\r\n\r\n%s" % (len(ANSWER) + 50, ANSWER),
    "truncated chunk": STATUS + b"Transfer-Encoding: chunked\r\n\r\n64\r\n" + ANSWER[:10],
    "closed after the last chunk": STATUS + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(ANSWER)[:-20],
    "closed before the status line": b"",
    "closed after the status line": STATUS,
    "closed in a header": STATUS + b"Content-Le",
    "closed after the headers": STATUS + b"Content-Type: application/json\r\n",
}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_or_cut_answers_are_transport_failures(case, mode):
    with raw_server(lambda i: (MALFORMED[case], True)) as srv:
        c = PredictorClient([srv.url], deadline_ms=2000)
        assert call(c, mode) is None  # never raises
        m = c.metrics
        assert srv.requests == 1  # the request reached the server; a garbled answer is not retried
        assert m.failures == {"connection": 1} and m.fallbacks == 1 and m.successes == 0
        assert c.breakers[srv.url].consecutive == 1
        c.close()


def test_breaker_opens_on_repeated_malformed_answers_then_calls_stop():
    with raw_server(lambda i: (MALFORMED["bad chunk size"], True)) as srv:
        c = PredictorClient([srv.url], deadline_ms=2000, failure_threshold=2, circuit_open_s=60)
        assert [c.predict_bulk(ROWS), asyncio.run(c.apredict_bulk(ROWS)), c.predict_bulk(ROWS)] == [None] * 3
        assert c.breakers[srv.url].is_open and srv.requests == 2  # the third call never left
        assert c.metrics.failures == {"connection": 2, "circuit_open": 1} and c.metrics.fallbacks == 3
        c.close()


def test_training_reporter_counts_a_malformed_answer_as_a_failed_post():
    answers = [MALFORMED["bad Content-Length"], b"HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\n\r\n{}"]
    with raw_server(lambda i: (answers[min(i, 1)], i == 0)) as srv:
        r = TrainingReporter(srv.url, autostart=False)
        r.add([dict(ROWS[0], actual_ttft_ms=5.0, actual_tpot_ms=0.0)])
        assert r.flush() == 0 and r.failed_posts == 1 and r.failed == 1 and r.last_status is None
        r.add([dict(ROWS[1], actual_ttft_ms=5.0, actual_tpot_ms=0.0)])
        assert r.flush() == 1 and r.sent == 1 and r.last_status == 202  # the next POST goes through
        r.close()
