"""A small OpenAI-compatible streaming engine on loopback, for the gateway tests.

A real HTTP server (uvicorn in a thread, raw ASGI) whose behaviour the test sets through
``engine.state``: delays, token counts, failures before or after the first byte, and the
Prometheus text it exposes (vLLM names). It records every request it received, which
ones completed and which were cancelled by a client disconnect.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import orjson
import pytest
import uvicorn

from load.ports import free_port


@dataclass
class EngineState:
    mode: str = "ok"                 # ok | error503 | hang | die_mid | empty
    first_token_delay: float = 0.0   # seconds before the first token
    token_delay: float = 0.0         # seconds between tokens
    default_tokens: int = 5
    die_after: int = 2               # die_mid: tokens sent before the connection is cut
    kv_cache_usage: float = 0.1
    waiting: int = 0
    running: int = 0
    received: list[dict] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)
    completed: int = 0
    cancelled: int = 0
    active: int = 0


def token_text(i: int) -> str:
    return f"tok{i} "


class _Abort(Exception):
    pass


def make_app(state: EngineState, name: str):
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics":
            body = (
                "# TYPE vllm:kv_cache_usage_perc gauge\n"
                f'vllm:kv_cache_usage_perc{{model_name="fake"}} {state.kv_cache_usage}\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{model_name="fake"}} {state.waiting}\n'
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="fake"}} {state.running + state.active}\n'
            ).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain; version=0.0.4")]})
            await send({"type": "http.response.body", "body": body})
            return
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        req = orjson.loads(b"".join(chunks))
        state.received.append(req)
        state.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        chat = scope["path"].endswith("/chat/completions")
        n = int(req.get("max_tokens") or state.default_tokens)
        me = asyncio.current_task()
        gone = asyncio.Event()

        async def watch():
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            me.cancel()

        w = asyncio.create_task(watch())
        state.active += 1
        try:
            await _serve(send, state, req, chat, n, name)
            state.completed += 1
        except asyncio.CancelledError:
            if not gone.is_set():
                raise
            state.cancelled += 1
        finally:
            state.active -= 1
            w.cancel()

    return app


async def _serve(send, state, req, chat, n, name):
    mode = state.mode
    if mode == "error503":
        await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"error":"overloaded"}'})
        return
    if mode == "hang":
        await asyncio.sleep(3600)
    if mode == "empty":
        raise _Abort("closing without a response")
    created = 1700000000
    obj = "chat.completion.chunk" if chat else "text_completion"
    if req.get("stream"):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"x-engine", name.encode())]})
        if chat:  # like vLLM: a role-only chunk right away (not a token)
            ev = {"id": "c1", "object": obj, "created": created, "model": "fake",
                  "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(ev) + b"\n\n", "more_body": True})
        await asyncio.sleep(state.first_token_delay)
        for i in range(n):
            if i:
                await asyncio.sleep(state.token_delay)
            if mode == "die_mid" and i == state.die_after:
                raise _Abort("dying mid-stream")
            choice = ({"index": 0, "delta": {"content": token_text(i)}, "finish_reason": None} if chat
                      else {"index": 0, "text": token_text(i), "finish_reason": None})
            ev = {"id": "c1", "object": obj, "created": created, "model": "fake", "choices": [choice]}
            await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(ev) + b"\n\n", "more_body": True})
        so = req.get("stream_options") or {}
        if so.get("include_usage"):
            ev = {"id": "c1", "object": obj, "created": created, "model": "fake", "choices": [],
                  "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}}
            await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(ev) + b"\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        return
    await asyncio.sleep(state.first_token_delay + state.token_delay * max(0, n - 1))
    text = "".join(token_text(i) for i in range(n))
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"} if chat
              else {"index": 0, "text": text, "finish_reason": "length"})
    body = orjson.dumps({"id": "c1", "object": "chat.completion" if chat else "text_completion",
                         "created": created, "model": "fake", "choices": [choice],
                         "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}})
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"x-engine", name.encode())]})
    await send({"type": "http.response.body", "body": body})



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
