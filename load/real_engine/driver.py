"""The client side of the real-engine run: a multi-turn workload driven through the gateway, one
streamed completion at a time, timed at the client (TTFT, TPOT, end to end)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
import orjson

from .workload import Workload, prompt_for


@dataclass
class Result:
    policy: str
    cid: int
    turn: int
    status: int
    ok: bool
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    tokens: int = 0
    cache_n: int | None = None      # llama-server timings: prompt tokens reused from the slot cache
    prompt_n: int | None = None     # prompt tokens evaluated
    endpoint: str = ""
    request_id: str = ""
    text: str = ""
    error: str = ""


async def one_request(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, wl: Workload,
                      policy: str, cid: int, turn: int) -> Result:
    body = {"model": "gemma-3-270m", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "temperature": 0.7, "seed": cid * 100 + turn, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    headers = {"x-llm-d-slo-ttft-ms": str(wl.ttft_slo_ms), "x-llm-d-slo-tpot-ms": str(wl.tpot_slo_ms)}
    res = Result(policy, cid, turn, 0, False)
    t0 = time.monotonic()
    t_first = None
    parts: list[str] = []
    n_events = 0
    buf = b""
    try:
        async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
            res.status = r.status_code
            res.endpoint = r.headers.get("x-gateway-destination-endpoint", "")
            res.request_id = r.headers.get("x-request-id", "")
            if r.status_code != 200:
                res.error = (await r.aread()).decode(errors="replace")[:300]
                return res
            async for chunk in r.aiter_raw():
                buf += chunk
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    if not ev.startswith(b"data: ") or ev[6:].strip() == b"[DONE]":
                        continue
                    obj = orjson.loads(ev[6:])
                    for ch in obj.get("choices") or ():
                        if ch.get("text"):
                            if t_first is None:
                                t_first = time.monotonic()
                            parts.append(ch["text"])
                            n_events += 1
                    if isinstance(obj.get("usage"), dict):
                        res.tokens = int(obj["usage"].get("completion_tokens") or 0)
                    tm = obj.get("timings")
                    if isinstance(tm, dict):
                        res.cache_n = tm.get("cache_n")
                        res.prompt_n = tm.get("prompt_n")
    except (httpx.HTTPError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    t_end = time.monotonic()
    res.tokens = res.tokens or n_events
    res.text = "".join(parts)
    res.e2e_ms = (t_end - t0) * 1000
    if t_first is not None:
        res.ttft_ms = (t_first - t0) * 1000
        if res.tokens > 1:
            res.tpot_ms = (t_end - t_first) * 1000 / (res.tokens - 1)
    res.ok = t_first is not None
    return res


async def drive(url: str, wl: Workload, policy: str, max_seconds: float) -> list[Result]:
    results: list[Result] = []
    queue: asyncio.Queue = asyncio.Queue()
    for c in wl.conversations:
        queue.put_nowait(c)
    deadline = time.monotonic() + max_seconds
    limits = httpx.Limits(max_connections=wl.concurrency * 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
        async def user() -> None:
            while not queue.empty() and time.monotonic() < deadline:
                conv = queue.get_nowait()
                history: list[tuple[str, str]] = []
                for k, turn in enumerate(conv.turns):
                    if time.monotonic() >= deadline:
                        return
                    r = await one_request(client, url, prompt_for(conv, history, turn.question),
                                          turn.max_tokens, wl, policy, conv.cid, k)
                    results.append(r)
                    if not r.ok:
                        break
                    history.append((turn.question, r.text))
                    await asyncio.sleep(turn.think_s)

        await asyncio.gather(*(user() for _ in range(wl.concurrency)))
    return results


def fetch_records(gw_url: str, admin_token: str) -> list[dict]:
    """The gateway's per-request records (its prediction, endpoint, prefix match, outcome), page by page."""
    out: list[dict] = []
    since = 0
    while True:
        page = httpx.get(gw_url + "/gateway/requests", params={"since": since}, timeout=10,
                         headers={"authorization": f"Bearer {admin_token}"}).raise_for_status().json()
        out.extend(page["records"])
        if not page["records"]:
            return out
        since = page["next"]
