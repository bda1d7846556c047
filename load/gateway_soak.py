"""Soak the gateway with hostile and unlucky traffic on loopback, then check it healed.

    python -m load.gateway_soak [--minutes 30] [--requests 100000] [--concurrency 24]
        [--engines 3] [--no-flow-control] [--seed 0] [--out DIR]

Starts ``--engines`` stub engines (``python -m gateway.stub_engine``, injecting 500s,
hangs and streams cut mid-way) and the gateway (``latency-predictor gateway``, with flow
control unless ``--no-flow-control``) as processes on 127.0.0.1, then drives a mix of
requests until ``--minutes`` or ``--requests`` is reached: streams and plain replies, clients
that leave at random stages, odd headers (non-ASCII bytes, steering headers, headers named in
``Connection:``, oversized headers, long request ids), bad bodies, random priorities; one
engine is killed (SIGKILL) and restarted every ``--restart-every`` seconds. At the end it
checks: nothing in flight on any endpoint and flow control drained, every endpoint healthy
again, the gateway's RSS within ``--rss-slack-mb`` of its warm level, no 5xx but the 502s that
name the upstream, no traceback in the gateway's log. Prints a summary; exit status 1 on a
violation, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

from load.gateway_configs import PLAIN_CONFIG, concurrency_gate_config
from load.ports import free_ports
from load.real_engine.procs import Proc

REPO = Path(__file__).resolve().parents[1]
FLOW_CONFIG = concurrency_gate_config(8, "10s", priority_bands=(10,))
KINDS = {"stream": 30, "plain": 15, "chat-stream": 15, "leave-before-first-byte": 5, "leave-mid-stream": 8,
         "odd-headers": 10, "oversized-header": 3, "bad-body": 4, "stream-null": 4, "long-id": 2, "steering": 4}


@dataclass
class Tally:
    statuses: collections.Counter = field(default_factory=collections.Counter)   # (kind, status)
    error_events: int = 0
    violations: list[str] = field(default_factory=list)
    sent: int = 0


class Restartable(Proc):
    """A child process (``load.real_engine.procs.Proc``) that can be killed and started again."""

    def __init__(self, name: str, cmd: list[str], out: Path, env: dict[str, str] | None = None) -> None:
        (out / f"{name}.log").write_bytes(b"")
        self.cmd, self.env = cmd, {"PYTHONPATH": str(REPO), **(env or {})}
        super().__init__(name, cmd, out, self.env)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(10)

    def restart(self) -> None:
        self.p = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env={**os.environ, **self.env})


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def request_for(kind: str, rng: random.Random) -> tuple[str, object, list[tuple[bytes, bytes]]]:
    """(path, JSON body or raw bytes, headers) of one request of ``kind``."""
    prompt = "soak " * rng.randint(1, 200)
    body: dict = {"model": "stub", "prompt": prompt, "max_tokens": rng.randint(1, 24), "stream": True}
    path = "/v1/completions"
    headers = [(b"x-llm-d-priority", rng.choice([b"-1", b"0", b"10", b"999999", str(rng.randint(-10**6, 10**6))
                                                 .encode()]))]
    if kind == "plain":
        body["stream"] = False
    elif kind == "chat-stream":
        path = "/v1/chat/completions"
        body = {"model": "stub", "messages": [{"role": "user", "content": prompt}], "max_tokens": body["max_tokens"],
                "stream": True, "stream_options": {"include_usage": True}}
    elif kind == "odd-headers":
        headers += [(b"x-user", b"Jos\xe9"), (b"x-bin", bytes(range(0x80, 0x100))), (b"connection", b"x-named"),
                    (b"x-named", b"1"), (b"x-request-id", b"dup")]
    elif kind == "oversized-header":
        headers.append((b"x-big", b"x" * rng.choice([20_000, 200_000, 1_000_000])))
    elif kind == "bad-body":
        return path, rng.choice([b"{", b"[]", b'{"prompt": 5}', b'{"prompt": "x", "stream": "yes"}']), headers
    elif kind == "stream-null":
        body["stream"] = None
    elif kind == "long-id":
        headers.append((b"x-request-id", b"i" * 129))
    elif kind == "steering":
        headers += [(b"x-prefiller-host-port", b"169.254.169.254:80"), (b"x-encoder-hosts-ports", b"10.0.0.1:1"),
                    (b"x-gateway-destination-endpoint", b"169.254.169.254:80"), (b"proxy-connection", b"keep-alive")]
    return path, body, headers


EXPECTED = {"oversized-header": {431}, "bad-body": {400}, "long-id": {400}}


async def one(client: httpx.AsyncClient, url: str, kind: str, rng: random.Random, tally: Tally) -> None:
    path, body, headers = request_for(kind, rng)
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    headers.append((b"content-type", b"application/json"))
    status = 0
    try:
        if kind == "leave-before-first-byte":
            timeout = httpx.Timeout(10, read=rng.uniform(0.001, 0.05))
        else:
            timeout = httpx.Timeout(30)
        async with client.stream("POST", url + path, content=content, headers=headers, timeout=timeout) as r:
            status = r.status_code
            leave_after = rng.randint(0, 4) if kind == "leave-mid-stream" else None
            data = b""
            async for chunk in r.aiter_raw():
                data += chunk
                if leave_after is not None and data.count(b"\n\n") > leave_after:
                    status = -1    # left mid-stream
                    break
            if status == 200 and b'data: {"error"' in data:
                tally.error_events += 1
            if status >= 500 and not (status == 502 and b"upstream" in data):
                tally.violations.append(f"{kind}: HTTP {status}: {data[:200]!r}")
    except httpx.TimeoutException:
        status = -2 if kind == "leave-before-first-byte" else -3
    except httpx.HTTPError as e:
        status = -4
        if kind not in ("leave-mid-stream", "leave-before-first-byte"):
            tally.violations.append(f"{kind}: transport error {type(e).__name__}: {e}")
    if kind in EXPECTED and status not in EXPECTED[kind]:
        tally.violations.append(f"{kind}: HTTP {status}, expected {sorted(EXPECTED[kind])}")
    if status == -3:
        tally.violations.append(f"{kind}: no answer within 30 s")
    tally.statuses[(kind, status)] += 1


async def drive(url: str, a: argparse.Namespace, tally: Tally, deadline: float, warm: dict) -> None:
    kinds, weights = list(KINDS), list(KINDS.values())
    limits = httpx.Limits(max_connections=a.concurrency * 2, max_keepalive_connections=a.concurrency)
    t0 = time.monotonic()
    async with httpx.AsyncClient(limits=limits) as client:
        async def worker(i: int) -> None:
            rng = random.Random(a.seed * 1000 + i)
            while tally.sent < a.requests and time.monotonic() < deadline:
                tally.sent += 1
                if "rss" not in warm and (tally.sent >= a.requests * a.warm_share
                                          or time.monotonic() - t0 >= (deadline - t0) * a.warm_share):
                    warm["rss"] = rss_mb(warm["pid"])
                await one(client, url, rng.choices(kinds, weights)[0], rng, tally)

        await asyncio.gather(*(worker(i) for i in range(a.concurrency)))


async def restarts(engines: list[Restartable], every: float, rng: random.Random, stop: asyncio.Event,
                   log: list) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
            return
        except TimeoutError:
            pass
        e = rng.choice(engines)
        e.kill()
        log.append(e.name)
        await asyncio.sleep(0.5)
        e.restart()


def final_checks(gw_url: str, token: str, a: argparse.Namespace, tally: Tally) -> dict:
    """Wait (bounded) until the gateway is drained and every endpoint healthy again; report what is not."""
    hdr = {"authorization": f"Bearer {token}"}
    deadline = time.monotonic() + a.ejection_max_s + 10
    eps: list = []
    flow: dict = {}
    while time.monotonic() < deadline:
        eps = httpx.get(gw_url + "/gateway/endpoints", headers=hdr, timeout=5).json()
        flow = httpx.get(gw_url + "/gateway/flow", headers=hdr, timeout=5).json() if a.flow_control else {}
        drained = all(e["inflight_requests"] == 0 and e["inflight_tokens"] == 0 for e in eps)
        if drained and all(e["healthy"] for e in eps) and flow.get("queued", 0) == 0 \
                and flow.get("saturation", 0.0) == 0.0:
            break
        time.sleep(0.2)
    for e in eps:
        if e["inflight_requests"] or e["inflight_tokens"]:
            tally.violations.append(f"{e['name']}: {e['inflight_requests']} requests / {e['inflight_tokens']} "
                                    "tokens still in flight")
        if not e["healthy"]:
            tally.violations.append(f"{e['name']}: excluded though its engine is up ({e})")
    if a.flow_control and (flow.get("queued") or flow.get("saturation")):
        tally.violations.append(f"flow control not drained: saturation {flow.get('saturation')}, "
                                f"queued {flow.get('queued')}")
    keep = ("name", "inflight_requests", "inflight_tokens", "healthy", "ejections", "scrape_failures")
    return {"endpoints": [{k: e[k] for k in keep} for e in eps],
            "flow": {k: flow.get(k) for k in ("saturation", "queued", "rejected")}}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m load.gateway_soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--engines", type=int, default=3)
    ap.add_argument("--restart-every", type=float, default=20.0, help="seconds between engine kills (0: none)")
    ap.add_argument("--error-rate", type=float, default=0.02)
    ap.add_argument("--hang-rate", type=float, default=0.005)
    ap.add_argument("--die-rate", type=float, default=0.02)
    ap.add_argument("--no-flow-control", dest="flow_control", action="store_false")
    ap.add_argument("--rss-slack-mb", type=float, default=50.0)
    ap.add_argument("--warm-share", type=float, default=0.2, help="share of the run after which RSS is 'warm'")
    ap.add_argument("--ejection-max-s", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="directory for the logs (default: a temporary one)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.minutes <= 0 or a.requests < 1 or a.concurrency < 1 or a.engines < 1 or not 0 < a.warm_share < 1:
        ap.error("--minutes, --requests, --concurrency, --engines must be positive; --warm-share in (0, 1)")
    out = a.out or Path(tempfile.mkdtemp(prefix="gateway-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "epp.yaml").write_text(FLOW_CONFIG if a.flow_control else PLAIN_CONFIG)
    base = free_ports(a.engines + 1)   # below the ephemeral range: a restarted engine gets its port back
    ports = list(range(base, base + a.engines + 1))
    py = sys.executable
    engines = [Restartable(f"engine{i}", [py, "-m", "gateway.stub_engine", "--port", str(p), "--name", f"e{i}",
                                   "--first-token-ms", "5", "--token-ms", "2", "--error-rate", str(a.error_rate),
                                   "--hang-rate", str(a.hang_rate), "--die-rate", str(a.die_rate),
                                   "--seed", str(a.seed + i)], out)
               for i, p in enumerate(ports[:-1])]
    token = secrets.token_hex(16)
    gw_url = f"http://127.0.0.1:{ports[-1]}"
    gw = Restartable("gateway", [py, "-m", "latency_cli.main", "gateway", "--port", str(ports[-1]), "--endpoints",
                          ",".join(f"http://127.0.0.1:{p}" for p in ports[:-1]), "--config", str(out / "epp.yaml"),
                          "--first-byte-timeout", "2", "--idle-timeout", "2", "--request-timeout", "60",
                          "--log-level", "warning"], out,
              {"LATENCY_GATEWAY_ADMIN_TOKEN": token, "LATENCY_GATEWAY_EJECTION_BASE_S": "1",
               "LATENCY_GATEWAY_EJECTION_MAX_S": str(a.ejection_max_s), "PYTHONUNBUFFERED": "1"})
    tally = Tally()
    killed: list[str] = []
    try:
        for e, p in zip(engines, ports, strict=False):
            e.wait_http(f"http://127.0.0.1:{p}/metrics", 60)
        gw.wait_http(gw_url + "/healthz", 60)
        warm: dict = {"pid": gw.p.pid}
        t0 = time.monotonic()

        async def run() -> None:
            stop = asyncio.Event()
            rs = (asyncio.create_task(restarts(engines, a.restart_every, random.Random(a.seed), stop, killed))
                  if a.restart_every > 0 else None)
            try:
                await drive(gw_url, a, tally, t0 + a.minutes * 60.0, warm)
            finally:
                stop.set()
                if rs is not None:
                    await rs

        asyncio.run(run())
        wall = time.monotonic() - t0
        for e, p in zip(engines, ports, strict=False):
            e.wait_http(f"http://127.0.0.1:{p}/metrics", 60)
        state = final_checks(gw_url, token, a, tally)
        rss_end = rss_mb(gw.p.pid)
        rss_warm = warm.get("rss", rss_end)
        if rss_end - rss_warm > a.rss_slack_mb:
            tally.violations.append(f"RSS grew {rss_end - rss_warm:.1f} MB after warm-up (limit {a.rss_slack_mb})")
    finally:
        gw.stop()
        for e in engines:
            e.stop()
    if "Traceback" in gw.log_path.read_text(errors="replace"):
        tally.violations.append(f"traceback in the gateway's log {gw.log_path}")
    by_status: collections.Counter = collections.Counter()
    for (_kind, status), n in tally.statuses.items():
        by_status[status] += n
    summary = {"requests": sum(tally.statuses.values()), "wall_s": round(wall, 1),
               "requests_per_s": round(sum(tally.statuses.values()) / max(wall, 1e-9), 1),
               "by_status": {str(k): n for k, n in sorted(by_status.items())},
               "by_kind_status": {f"{k} {s}": n for (k, s), n in sorted(tally.statuses.items())},
               "stream_error_events": tally.error_events, "engine_kills": len(killed),
               "rss_warm_mb": round(rss_warm, 1), "rss_end_mb": round(rss_end, 1), **state,
               "logs": str(out), "violations": tally.violations[:50], "violation_count": len(tally.violations)}
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    print("(statuses: -1 left mid-stream, -2 left before the first byte, -4 transport error)")
    return 1 if tally.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
