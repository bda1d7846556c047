"""Test support: run an ASGI app (either server) on loopback in a thread, and a stand-in bundle server.

``BundleServer`` speaks the model-distribution protocol of docs/wire-api.md §2
(``GET /v1/bundles/latest`` with ETag / If-None-Match -> 304, 404 before any bundle;
``GET /v1/bundles/{version}/{file}``) over a bundle directory, with switches to inject
the failures a real network and a buggy publisher produce (5xx, bad JSON, corrupted or
truncated files, an older bundle offered as the latest).
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from features.bundle import MANIFEST, list_bundles
from load.ports import free_port


@contextlib.contextmanager
def run_app(app, timeout: float = 20.0) -> Iterator[str]:
    """Serve an ASGI app with uvicorn (lifespan on) on 127.0.0.1:<free port> in a thread."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                            lifespan="on", http="httptools", loop="asyncio")
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None
    thread = threading.Thread(target=server.run, name=f"app-{port}", daemon=True)
    thread.start()
    give_up = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > give_up:
            raise RuntimeError("app did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)


class BundleServer:
    """Serves ``root`` (a bundle registry directory) on loopback; see the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        #: None, "error500", "bad_json", "corrupt", "truncate"
        self.fault: str | None = None
        #: serve this version as the latest instead of the newest one
        self.latest: str | None = None
        #: while set, model-file requests stall until ``release_files`` is called (a hung publisher)
        self.stall_files = False
        self._released = threading.Event()
        #: model-file requests stalled right now (an ordering witness for timeout tests)
        self.stalled = 0
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _reply(self, status: int, body: bytes, headers: dict | None = None, length: int | None = None):
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                outer.requests.append(self.path)
                if outer.fault == "error500":
                    return self._reply(500, b"boom")
                parts = self.path.strip("/").split("/")
                if parts[:2] != ["v1", "bundles"] or len(parts) not in (3, 4):
                    return self._reply(404, b"{}")
                if len(parts) == 3 and parts[2] == "latest":
                    bundles = list_bundles(outer.root)
                    version = outer.latest or (bundles[-1].name if bundles else None)
                    if version is None:
                        return self._reply(404, b'{"detail":"no bundle yet"}')
                    etag = f'"{version}"'
                    if self.headers.get("If-None-Match") == etag:
                        return self._reply(304, b"", {"ETag": etag})
                    body = (outer.root / version / MANIFEST).read_bytes()
                    if outer.fault == "bad_json":
                        body = body[: len(body) // 2]
                    return self._reply(200, body, {"ETag": etag, "Content-Type": "application/json"})
                if len(parts) == 4:
                    path = outer.root / parts[2] / parts[3]
                    if not path.is_file() or parts[3] == MANIFEST:
                        return self._reply(404, b"{}")
                    data = path.read_bytes()
                    if outer.stall_files:
                        outer.stalled += 1
                        outer._released.wait(60)
                        outer.stalled -= 1
                    if outer.fault == "corrupt":
                        data = bytes([data[0] ^ 0xFF]) + data[1:]
                    if outer.fault == "truncate":
                        data = data[: len(data) // 2]
                    return self._reply(200, data, {"Content-Type": "application/octet-stream"})
                return self._reply(404, b"{}")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="bundle-server", daemon=True)
        self._thread.start()

    def release_files(self) -> None:
        """End every stall of model-file requests, and stall no more."""
        self.stall_files = False
        self._released.set()

    def stop(self) -> None:
        """Shut down and close the listening socket (clients then get connection refused)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def manifest(self, version: str) -> dict:
        return json.loads((self.root / version / MANIFEST).read_bytes())
