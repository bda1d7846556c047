"""The stub engine (``gateway.stub_engine``) on loopback in a thread, for the gateway tests.

A real HTTP server (uvicorn in a thread, raw ASGI) whose behaviour the test sets through
``engine.state``: delays, token counts, failures before or after the first byte, and the
Prometheus text it exposes (vLLM names). It records every request it received, which
ones completed and which were cancelled by a client disconnect.
"""
from __future__ import annotations

import threading
import time

import pytest
import uvicorn

from gateway.stub_engine import EngineState, make_app, token_text
from load.ports import free_port

__all__ = ["ADMIN", "ADMIN_TOKEN", "EngineState", "FakeEngine", "ServerThread", "engines", "free_port", "admin_get", "make_app", "token_text"]


class ServerThread:
    """Run an ASGI app with uvicorn on 127.0.0.1 in a daemon thread."""

    def __init__(self, app, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error", lifespan="on",
                             timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


class FakeEngine(ServerThread):
    def __init__(self, name: str = "fake", port: int | None = None) -> None:
        self.state = EngineState()
        self.name = name
        super().__init__(make_app(self.state, name), port)


@pytest.fixture
def engines():
    """Two fake engines named ``a`` and ``b`` (import this fixture into a test module)."""
    es = [FakeEngine("a").start(), FakeEngine("b").start()]
    yield es
    for e in es:
        e.stop()


ADMIN_TOKEN = "test-admin-token"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}   # headers for the gateway's /gateway/* endpoints


def admin_get(url: str, path: str, **kw):
    """GET one of the gateway's admin endpoints with the tests' token."""
    import httpx

    return httpx.get(url + path, headers=ADMIN, **kw)
