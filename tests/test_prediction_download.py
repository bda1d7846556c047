"""Bounded downloads of bundle files from a real HTTP server on loopback: at most ``limit``
decoded bytes reach the sink whatever the server sends (gzip inflating past the limit, a
Content-Length over it), and every failure is a SyncFailure with its metrics reason."""
from __future__ import annotations

import gzip
import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from load.ports import free_port
from prediction_server.download import SyncFailure, bounded_get

PLAIN = bytes(range(256)) * 40                     # 10 240 bytes
ZEROS = gzip.compress(b"\0" * 4_000_000)           # about 4 KB inflating to 4 MB
ROUTES = {                                         # path -> (status, headers, body)
    "/plain": (200, {}, PLAIN),
    "/gzip": (200, {"Content-Encoding": "gzip"}, gzip.compress(PLAIN)),
    "/bomb": (200, {"Content-Encoding": "gzip"}, ZEROS),
    "/brotli": (200, {"Content-Encoding": "br"}, PLAIN),
    "/missing": (404, {}, b"no"),
    "/same": (304, {}, b""),
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        status, headers, body = ROUTES[self.path]
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if status != 304:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:            # the client refused the body unread and closed
            pass


@pytest.fixture(scope="module")
def client():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    with httpx.Client(base_url=f"http://127.0.0.1:{httpd.server_address[1]}", timeout=10) as c:
        yield c
    httpd.shutdown()
    httpd.server_close()


def _get(client, path, limit=1_000_000):
    sink = io.BytesIO()
    return bounded_get(client, path, limit, time.monotonic() + 30, sink), sink.getvalue()


def test_plain_and_gzip_bodies_arrive_whole_and_a_304_writes_nothing(client):
    assert _get(client, "/plain") == (len(PLAIN), PLAIN)
    assert _get(client, "/gzip") == (len(PLAIN), PLAIN)
    assert _get(client, "/same") == (None, b"")


@pytest.mark.parametrize("path, limit, reason", [
    ("/plain", 10_000, "too_large"),        # its Content-Length is over the limit: refused unread
    ("/bomb", 1_000_000, "too_large"),      # inflates past the limit: cut there
    ("/brotli", 1_000_000, "bad_encoding"),
    ("/missing", 1_000_000, "http_status"),
])
def test_a_body_over_the_limit_or_unusable_is_a_named_failure(client, path, limit, reason):
    sink = io.BytesIO()
    with pytest.raises(SyncFailure) as e:
        bounded_get(client, path, limit, time.monotonic() + 30, sink)
    assert e.value.reason == reason
    assert len(sink.getvalue()) <= limit
    if reason == "http_status":
        assert e.value.status == 404


def test_no_server_is_a_network_failure():
    with httpx.Client(base_url=f"http://127.0.0.1:{free_port()}", timeout=5) as c, pytest.raises(SyncFailure) as e:
        bounded_get(c, "/x", 10, time.monotonic() + 30, io.BytesIO())
    assert e.value.reason == "network"
