"""A stub OpenAI-compatible engine: streaming completions and chat, vLLM-style gauges.

    python -m gateway.stub_engine [--host 127.0.0.1] [--port 8000] [--name a]
        [--first-token-ms 20] [--token-ms 5] [--tokens 16]
        [--error-rate 0] [--hang-rate 0] [--die-rate 0] [--seed 0]

Serves ``POST /v1/completions`` and ``POST /v1/chat/completions`` (``stream: true`` as SSE,
one token ``tokN`` per event, ``stream_options.include_usage`` honoured; otherwise one
JSON body with ``usage``), ``GET /metrics`` (``vllm:kv_cache_usage_perc``,
``vllm:num_requests_waiting``, ``vllm:num_requests_running``) and ``GET /health``.
``max_tokens`` sets the number of tokens (default ``--tokens``). Failure injection, drawn
per request: ``--error-rate`` answers 500, ``--hang-rate`` never answers,
``--die-rate`` cuts a stream after ``--die-after`` tokens. It stands in for vLLM in the
gateway demo, the gateway tests (``tests/fake_engine.py`` runs it in a thread) and the
soak (``python -m load.gateway_soak``). No dependency beyond the gateway's own.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass, field

import orjson

MODES = ("ok", "error500", "error503", "hang", "die_mid", "empty")


@dataclass
class EngineState:
    """What the engine does (a test may change it while the engine runs) and what it saw."""

    mode: str = "ok"                 # one of MODES, for every request
    first_token_delay: float = 0.0   # seconds before the first token
    token_delay: float = 0.0         # seconds between tokens
    default_tokens: int = 5
    die_after: int = 2               # die_mid: tokens sent before the connection is cut
    error_rate: float = 0.0          # share of requests answered 500 (when mode is "ok")
    hang_rate: float = 0.0           # share of requests never answered
    die_rate: float = 0.0            # share of streams cut after die_after tokens
    usage_chunk: bool = True         # a stream asked for usage ends with the usage chunk (False: ignores the ask)
    piece_bytes: int = 0             # a stream's bytes are sent in pieces of this size (0: one event at a time)
    kv_cache_usage: float = 0.1
    waiting: int = 0
    running: int = 0
    rng: random.Random = field(default_factory=random.Random)
    received: list[dict] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)      # the bodies of ``received``, as sent
    headers: list[dict] = field(default_factory=list)
    raw_headers: list[list[tuple[bytes, bytes]]] = field(default_factory=list)
    keep_received: int = 10_000      # most requests remembered (bounded for long runs)
    completed: int = 0
    cancelled: int = 0
    active: int = 0
    spans: list[tuple[float, float]] = field(default_factory=list)   # (start, end) monotonic s of served requests

    def draw_mode(self) -> str:
        """This request's behaviour: the fixed mode, else one drawn from the rates."""
        if self.mode != "ok":
            return self.mode
        r = self.rng.random()
        for mode, rate in (("error500", self.error_rate), ("hang", self.hang_rate), ("die_mid", self.die_rate)):
            if r < rate:
                return mode
            r -= rate
        return "ok"


def token_text(i: int) -> str:
    return f"tok{i} "


class _Abort(Exception):
    """Raised inside the app to make the server drop the connection."""


def metrics_text(state: EngineState) -> bytes:
    return (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{model_name="stub"}} {state.kv_cache_usage}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="stub"}} {state.waiting}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="stub"}} {state.running + state.active}\n'
    ).encode()


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
        if scope["path"] in ("/metrics", "/health"):
            body = metrics_text(state) if scope["path"] == "/metrics" else b"{}"
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain; version=0.0.4")]})
            await send({"type": "http.response.body", "body": body})
            return
        chunks = []
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        try:
            req = orjson.loads(b"".join(chunks))
        except orjson.JSONDecodeError:
            req = None
        if not isinstance(req, dict):
            return await _json(send, 400, {"error": {"message": "body: not a JSON object"}}, name)
        state.received.append(req)
        state.bodies.append(b"".join(chunks))
        state.headers.append({k.decode(): v.decode("latin-1") for k, v in scope["headers"]})
        state.raw_headers.append(list(scope["headers"]))
        for seen in (state.received, state.bodies, state.headers, state.raw_headers, state.spans):
            if len(seen) > state.keep_received:
                del seen[: len(seen) - state.keep_received]
        chat = scope["path"].endswith("/chat/completions")
        n = req.get("max_tokens")
        n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else state.default_tokens
        me = asyncio.current_task()
        assert me is not None
        gone = asyncio.Event()

        async def watch():
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            me.cancel()

        w = asyncio.create_task(watch())
        state.active += 1
        start = time.monotonic()
        try:
            await _serve(send, state, req, chat, n, name)
            state.completed += 1
        except asyncio.CancelledError:
            if not gone.is_set():
                raise
            state.cancelled += 1
        finally:
            state.active -= 1
            state.spans.append((start, time.monotonic()))
            w.cancel()

    return app


async def _send(send, state: EngineState, body: bytes, more_body: bool = True) -> None:
    step = state.piece_bytes or len(body)
    for i in range(0, len(body), step):
        if i:
            await asyncio.sleep(0.001)   # each piece its own write: a later read may split an event
        await send({"type": "http.response.body", "body": body[i:i + step],
                    "more_body": more_body or i + step < len(body)})


async def _event(send, state: EngineState, ev: dict) -> None:
    await _send(send, state, b"data: " + orjson.dumps(ev) + b"\n\n")


async def _json(send, status: int, obj: dict, name: str) -> None:
    body = orjson.dumps(obj)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"x-engine", name.encode())]})
    await send({"type": "http.response.body", "body": body})


async def _serve(send, state: EngineState, req: dict, chat: bool, n: int, name: str) -> None:
    mode = state.draw_mode()
    if mode in ("error500", "error503"):
        return await _json(send, int(mode[-3:]), {"error": {"message": "stub engine: injected failure"}}, name)
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
            ev = {"id": "c1", "object": obj, "created": created, "model": "stub",
                  "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            await _event(send, state, ev)
        await asyncio.sleep(state.first_token_delay)
        for i in range(n):
            if i:
                await asyncio.sleep(state.token_delay)
            if mode == "die_mid" and i == state.die_after:
                raise _Abort("dying mid-stream")
            choice = ({"index": 0, "delta": {"content": token_text(i)}, "finish_reason": None} if chat
                      else {"index": 0, "text": token_text(i), "finish_reason": None})
            ev = {"id": "c1", "object": obj, "created": created, "model": "stub", "choices": [choice]}
            await _event(send, state, ev)
        so = req.get("stream_options") or {}
        if isinstance(so, dict) and so.get("include_usage") and state.usage_chunk:
            ev = {"id": "c1", "object": obj, "created": created, "model": "stub", "choices": [],
                  "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}}
            await _event(send, state, ev)
        await _send(send, state, b"data: [DONE]\n\n", more_body=False)
        return
    await asyncio.sleep(state.first_token_delay + state.token_delay * max(0, n - 1))
    if mode == "die_mid":
        raise _Abort("dying before the body")
    text = "".join(token_text(i) for i in range(n))
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"} if chat
              else {"index": 0, "text": text, "finish_reason": "length"})
    await _json(send, 200, {"id": "c1", "object": "chat.completion" if chat else "text_completion",
                            "created": created, "model": "stub", "choices": [choice],
                            "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}}, name)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m gateway.stub_engine",
                                 description="stub OpenAI-compatible engine with vLLM-style metrics")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--name", default="stub", help="sent back in the x-engine response header")
    ap.add_argument("--first-token-ms", type=float, default=20.0)
    ap.add_argument("--token-ms", type=float, default=5.0)
    ap.add_argument("--tokens", type=int, default=16, help="tokens per reply without max_tokens")
    ap.add_argument("--error-rate", type=float, default=0.0, help="share of requests answered 500")
    ap.add_argument("--hang-rate", type=float, default=0.0, help="share of requests never answered")
    ap.add_argument("--die-rate", type=float, default=0.0, help="share of replies cut mid-stream")
    ap.add_argument("--die-after", type=int, default=2, help="tokens sent before a cut")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-level", default="warning")
    return ap


def state_from_args(a: argparse.Namespace) -> EngineState:
    rates = (a.error_rate, a.hang_rate, a.die_rate)
    if any(not 0.0 <= r <= 1.0 for r in rates) or sum(rates) > 1.0:
        raise ValueError("--error-rate, --hang-rate and --die-rate must be in [0, 1] and sum to at most 1")
    if a.first_token_ms < 0 or a.token_ms < 0 or a.tokens < 1 or a.die_after < 0:
        raise ValueError("--first-token-ms and --token-ms must be >= 0, --tokens >= 1, --die-after >= 0")
    return EngineState(first_token_delay=a.first_token_ms / 1000.0, token_delay=a.token_ms / 1000.0,
                       default_tokens=a.tokens, die_after=a.die_after, error_rate=a.error_rate,
                       hang_rate=a.hang_rate, die_rate=a.die_rate, rng=random.Random(a.seed), keep_received=0)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        state = state_from_args(a)
    except ValueError as e:
        ap.error(str(e))
    import uvicorn

    print(f"[stub-engine] {a.name} on http://{a.host}:{a.port} (POST /v1/completions, /v1/chat/completions; "
          "GET /metrics)", flush=True)
    uvicorn.run(make_app(state, a.name), host=a.host, port=a.port, log_level=a.log_level, lifespan="on",
                timeout_graceful_shutdown=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
