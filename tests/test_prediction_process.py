"""Real prediction-server processes: peak memory against a hostile bundle server, and what
a routine poll writes to the log.

The hostile bundle server is a real HTTP server on loopback that sends gzip bombs (with
``Content-Encoding: gzip``), endless chunked streams and lying ``Content-Length``s, for
the manifest or for model files that its manifest declares huge or modest. The prediction
server is ``python -m prediction_server`` in its own process; its peak RSS is VmHWM of
/proc/<pid>/status.
"""
from __future__ import annotations

import functools
import json
import re
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from load.ports import free_port
from conftest import start_server, stop_server, wait_http
from features.bundle import MANIFEST, list_bundles
from load.demo_bundle import build_bundle
from support.servers import BundleServer

MB = 1024 * 1024
#: what the server sends at most for an endless stream (it stops by itself)
ENDLESS_CAP = 2048 * MB


@functools.lru_cache(maxsize=1)
def gzip_bomb() -> bytes:
    """About 0.5 MB of gzip that inflates to 512 MB of zeros."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MB)
    return b"".join([z.compress(zeros) for _ in range(512)] + [z.flush()])


class HostileBundleServer:
    """``mode`` picks the attack; ``declared`` is the size its manifest gives each model file."""

    def __init__(self, manifest: dict) -> None:
        self.manifest = manifest
        self.mode = "file_bomb"
        self.declared = 30 * MB
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _head(self, headers: dict) -> None:
                self.send_response(200)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()

            def _endless(self) -> None:
                self._head({"Transfer-Encoding": "chunked"})
                chunk = b"%x\r\n" % (256 * 1024) + bytes(256 * 1024) + b"\r\n"
                sent = 0
                while sent < ENDLESS_CAP:
                    self.wfile.write(chunk)
                    sent += 256 * 1024

            def _bomb(self) -> None:
                body = gzip_bomb()
                self._head({"Content-Encoding": "gzip", "Content-Length": str(len(body))})
                self.wfile.write(body)

            def _lying(self) -> None:  # says 1000 bytes (or a terabyte), then never stops
                self._head({"Content-Length": "1000" if outer.mode == "file_lying" else str(1 << 40)})
                sent = 0
                while sent < ENDLESS_CAP:
                    self.wfile.write(bytes(256 * 1024))
                    sent += 256 * 1024

            def do_GET(self) -> None:
                outer.requests.append(self.path)
                mode = outer.mode
                try:
                    if self.path == "/v1/bundles/latest":
                        if mode == "manifest_bomb":
                            return self._bomb()
                        if mode == "manifest_endless":
                            return self._endless()
                        m = json.loads(json.dumps(outer.manifest))
                        for spec in m["models"].values():
                            spec["size"] = outer.declared
                        body = json.dumps(m).encode()
                        self._head({"Content-Type": "application/json", "Content-Length": str(len(body))})
                        return self.wfile.write(body)
                    {"file_bomb": self._bomb, "file_endless": self._endless, "file_lying": self._lying,
                     "file_huge_length": self._lying}[mode]()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up: what it should do

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, address: None  # clients hanging up are the point
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) / 1024


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bundles")
    build_bundle(root, 1, "xgboost")
    return json.loads((list_bundles(root)[0] / MANIFEST).read_text())


# mode, MB declared per model file (two files), reasons the sync may fail with
ATTACKS = [
    ("manifest_bomb", 1, {"too_large"}),
    ("manifest_endless", 1, {"too_large"}),
    ("file_bomb", 250, {"too_large"}),  # declared beyond LATENCY_MAX_BUNDLE_BYTES: refused unread
    ("file_endless", 250, {"too_large"}),
    ("file_bomb", 30, {"too_large"}),  # declared within it: downloaded, cut at the declared size
    ("file_endless", 30, {"too_large"}),
    ("file_lying", 30, {"truncated", "network"}),
    ("file_huge_length", 30, {"too_large"}),  # refused on its Content-Length
]


@pytest.mark.parametrize("mode,declared_mb,reasons", ATTACKS, ids=[f"{m}-{d}MB" for m, d, _ in ATTACKS])
def test_peak_memory_bounded_whatever_the_bundle_server_sends(manifest, tmp_path, mode, declared_mb, reasons):
    hostile = HostileBundleServer(manifest)
    hostile.mode, hostile.declared = mode, declared_mb * MB
    port = free_port()
    proc = start_server("prediction_server", [], env={
        "TRAINING_SERVER_URL": hostile.url, "LATENCY_PREDICTION_PORT": str(port), "MODEL_SYNC_INTERVAL_SEC": "3600",
        "LATENCY_SYNC_TIMEOUT_SEC": "20", "LATENCY_LOG_LEVEL": "warning"}, log=tmp_path / "server.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/healthz", 60, proc)
        with httpx.Client(base_url=url, timeout=300) as c:
            answers = [c.post("/reload") for _ in range(3)]
            peak = peak_rss_mb(proc.pid)
            print(f"\n{mode} ({declared_mb} MB declared per file): peak RSS {peak:.0f} MB")
            for r in answers:
                assert r.status_code == 502 and r.json()["reason"] in reasons, r.text
            assert c.get("/healthz").status_code == 200
            assert c.get("/status").json()["model_version"] == "prior-default"
        files = [p for p in hostile.requests if p != "/v1/bundles/latest"]
        if mode.startswith("file_") and declared_mb * 2 * MB > 64 * MB:
            assert files == []  # refused on the manifest's word alone
        elif mode.startswith("file_"):
            assert len(files) >= 3  # the attack was really downloaded
        assert peak < 300
    finally:
        stop_server(proc)
        hostile.stop()


def test_routine_polls_log_at_debug_swaps_and_refusals_at_info(tmp_path):
    root = tmp_path / "registry"
    build_bundle(root, 1, "xgboost")
    bs = BundleServer(root)
    port = free_port()
    log = tmp_path / "server.log"
    proc = start_server("prediction_server", [], env={
        "TRAINING_SERVER_URL": bs.url, "LATENCY_PREDICTION_PORT": str(port), "MODEL_SYNC_INTERVAL_SEC": "0.1",
        "LATENCY_LOG_LEVEL": "info"}, log=log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/healthz", 60, proc)
        end = time.monotonic() + 60
        while sum(p == "/v1/bundles/latest" for p in bs.requests) < 10:  # ten polls at least
            assert time.monotonic() < end and proc.poll() is None
            time.sleep(0.1)
        build_bundle(root, 2, "prior")  # a prior-only bundle: refused (logged once)
        n = len(bs.requests)
        while len(bs.requests) < n + 10:
            assert time.monotonic() < end and proc.poll() is None
            time.sleep(0.1)
    finally:
        stop_server(proc)
        bs.stop()
    lines = log.read_text().splitlines()
    info = [ln for ln in lines if " INFO " in ln]
    assert any("serving bundle v000001-" in ln for ln in info)
    assert sum("v000002-" in ln and "refused" in ln for ln in info) == 1
    routine = [ln for ln in info if ("/v1/bundles" in ln or "poll" in ln) and "listening on" not in ln]
    assert routine == [] and len(info) < 12, info
