"""The EPP's fetch of the learned engine step model (epp_client.engine_fetch) from a server on
loopback: nothing before the server has one (404), the section and its version once it does, a
fetch on the refresh interval or as soon as the predictions name another bundle version (the
clock injected), and the last good section kept through a server error or a garbled answer."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from epp_client.engine_fetch import EngineFetcher

SECTION = {"rows": 60, "classes": {"default": {"coefficients": {"fixed_ms": 1.0}}}}


class Engine:
    """What the stand-in server answers at /v1/engine: (status, body), and the requests seen."""

    def __init__(self) -> None:
        self.answer: tuple[int, bytes] = (404, b'{"detail": "no engine step model learned: none yet"}')
        self.requests = 0


@pytest.fixture
def server():
    state = Engine()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            state.requests += 1
            status, body = state.answer if self.path == "/v1/engine" else (404, b"{}")
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield state, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def wait_fetches(f: EngineFetcher, n: int) -> None:
    end = time.monotonic() + 10
    while f.fetches < n or f._busy:
        assert time.monotonic() < end, "the background fetch never finished"
        time.sleep(0.01)


def test_fetches_on_the_interval_and_on_a_new_bundle_version(server):
    state, url = server
    now = [100.0]
    f = EngineFetcher([url], refresh_s=10.0, min_gap_s=1.0, clock=lambda: now[0])
    assert f.current() is None          # the first ask starts a fetch; nothing yet
    wait_fetches(f, 1)
    assert f.current() is None and f.failures == 0      # 404: nothing learned, not a failure
    assert f.fetches == 1                               # not due again before the interval
    state.answer = (200, json.dumps({"model_version": "v000002-20261201T000000Z", "engine": SECTION}).encode())
    now[0] += 0.5
    f.current("v000002-20261201T000000Z")               # a new version, but within min_gap: no fetch
    assert f.fetches == 1
    now[0] += 1.0
    f.current("v000002-20261201T000000Z")               # a version the section did not come with: fetch
    wait_fetches(f, 2)
    assert f.current("v000002-20261201T000000Z") == ("v000002-20261201T000000Z", SECTION)
    now[0] += 5.0
    f.current("v000002-20261201T000000Z")               # the same version, within the interval: no fetch
    assert f.fetches == 2 and state.requests == 2
    for bad in ((500, b"{}"), (200, b"not json"), (200, b'{"model_version": 3}')):
        state.answer = bad
        now[0] += 10.0
        before = f.fetches
        f.current()
        wait_fetches(f, before + 1)
        assert f.current() == ("v000002-20261201T000000Z", SECTION)   # the last good one kept
    assert f.failures == 3


def test_an_unreachable_server_is_a_failure_not_an_error():
    f = EngineFetcher(["http://127.0.0.1:9"], timeout_s=0.5)
    assert f.fetch_now() is None and f.failures == 1
