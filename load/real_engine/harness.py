"""The whole loop on a real engine: llama-server x2, training + prediction servers, the
gateway per policy, a multi-turn workload, and a markdown report with plots.

    python -m load.real_engine [--out DIR] [--policies llmd-default,llmd-token-load,predicted]
                               [--conversations 24] [--turns 4] [--concurrency 6]

Everything listens on 127.0.0.1 and stops by itself. The engines are restarted (cold
caches) before each policy; the training and prediction servers live through the whole
run, so the predictor keeps learning from every real request (every policy's gateway
reports TTFT/TPOT samples; only ``predicted`` routes on the predictions).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import orjson

from features.scoring import pinball_loss

from .build import build_llama_server, install_model
from .gateway_policy import POLICIES
from .workload import Workload, make_workload, prompt_for

QUANTILE = 0.9


def _log(msg: str) -> None:
    print(f"[real_engine] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process with its output in a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name: str, cmd: list[str], log_dir: Path, env: dict | None = None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")
        self.p = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env={**os.environ, **(env or {})})

    def wait_http(self, url: str, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.p.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.name} exited with {self.p.returncode}:\n{tail}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} not ready at {url} after {timeout:.0f} s")

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self._log.close()


# ---- one request through the gateway --------------------------------------------------------

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


# ---- statistics ------------------------------------------------------------------------------

def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def pinball(actual: list[float], pred: list[float], q: float = QUANTILE) -> float | None:
    return pinball_loss(actual, pred, q) if actual else None


def accuracy(records: list[dict]) -> dict:
    """Coverage (share of actuals <= prediction) and pinball loss of the predictions the
    gateway made for the endpoint that served each request, against the measured outcome,
    overall and split by the model that predicted (the built-in prior or a learned bundle)."""
    out: dict = {}
    for tgt in ("ttft", "tpot"):
        groups: dict[str, list[tuple[float, float]]] = {"all": [], "learned": [], "prior": []}
        for r in records:
            a, p = r.get(f"{tgt}_ms"), r.get(f"predicted_{tgt}_ms")
            if not r["ok"] or a is None or p is None:
                continue
            groups["all"].append((a, p))
            groups["prior" if r["model_version"].startswith("prior") else "learned"].append((a, p))
        for source, sel in groups.items():
            out[f"{tgt}_{source}_n"] = len(sel)
            out[f"{tgt}_{source}_coverage"] = (sum(a <= p for a, p in sel) / len(sel)) if sel else None
            out[f"{tgt}_{source}_pinball_ms"] = pinball([a for a, _ in sel], [p for _, p in sel])
    return out


def summarize(policy: str, results: list[Result], records: list[dict], wl: Workload, wall_s: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_ms for r in ok]
    tpot = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    met = [r for r in ok if r.ttft_ms <= wl.ttft_slo_ms and (r.tpot_ms is None or r.tpot_ms <= wl.tpot_slo_ms)]
    cache = [(r.cache_n, r.prompt_n) for r in ok if r.cache_n is not None and r.prompt_n is not None]
    reused = sum(c for c, _ in cache)
    total = sum(c + p for c, p in cache)
    gw_hit = sum(r["prefix_match_blocks"] for r in records)
    gw_tot = sum(r["prefix_total_blocks"] for r in records)
    per_ep: dict[str, int] = {}
    for r in ok:
        per_ep[r.endpoint] = per_ep.get(r.endpoint, 0) + 1
    s = {"policy": policy, "requests": len(results), "ok": len(ok), "failed": len(results) - len(ok),
         "wall_s": wall_s, "ttft_p50_ms": pct(ttft, .5), "ttft_p90_ms": pct(ttft, .9),
         "tpot_p50_ms": pct(tpot, .5), "tpot_p90_ms": pct(tpot, .9),
         "e2e_p50_ms": pct([r.e2e_ms for r in ok], .5),
         "slo_attainment": len(met) / len(results) if results else None,
         "engine_prefix_hit_rate": reused / total if total else None,
         "gateway_prefix_hit_rate": gw_hit / gw_tot if gw_tot else None,
         "per_endpoint": per_ep,
         "model_versions": sorted({r["model_version"] for r in records if r["model_version"]}),
         "fallbacks": sum(1 for r in records if r["fallback"])}
    s.update(accuracy(records))
    return s


# ---- the run -----------------------------------------------------------------------------------

@dataclass
class Options:
    out: Path
    policies: list[str]
    conversations: int = 16
    turns: int = 4
    concurrency: int = 4
    max_seconds_per_policy: float = 240.0
    ctx: int = 16384
    seed: int = 7
    engine_threads: int = 1
    slots: int = 4
    system_words: int = 160
    ttft_slo_ms: float = 2000.0
    tpot_slo_ms: float = 120.0
    rounds: int = 1


def engine_speed(metrics_text: str) -> dict:
    """Prefill tokens/s and decode ms/token over the phase, from llama-server's counters."""
    v: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith("llamacpp:") and " " in line:
            k, _, x = line.partition(" ")
            try:
                v[k] = float(x)
            except ValueError:
                pass
    pt, ps = v.get("llamacpp:prompt_tokens_total", 0), v.get("llamacpp:prompt_seconds_total", 0)
    dt, ds = v.get("llamacpp:tokens_predicted_total", 0), v.get("llamacpp:tokens_predicted_seconds_total", 0)
    return {"prompt_tokens": pt, "prefill_tok_per_s": pt / ps if ps else None,
            "decode_ms_per_token": 1000 * ds / dt if dt else None,
            "prompt_tokens_cached": v.get("llamacpp:prompt_tokens_cached_total")}


def fetch_records(gw_url: str) -> list[dict]:
    return httpx.get(gw_url + "/gateway/requests", timeout=10).json()["records"]


def pool_rounds(policies, summaries, records, results, wl) -> tuple[dict, dict]:
    """Per policy, one summary over all its rounds (phase keys ``"<policy> #<round>"``);
    alternating the order of the rounds evens out drift in the machine's load."""
    pooled, pooled_records = {}, {}
    for policy in policies:
        keys = [k for k in summaries if k.startswith(policy + " #")]
        recs = [r for k in keys for r in records[k]]
        agg = summarize(policy, [r for k in keys for r in results[k]], recs, wl,
                        sum(summaries[k]["wall_s"] for k in keys))
        agg["engine_speed"] = [e for k in keys for e in summaries[k].get("engine_speed", [])]
        agg["loadavg_1m"] = [x for k in keys for x in summaries[k].get("loadavg_1m", [])]
        agg["data_status"] = summaries[keys[-1]].get("data_status")
        pooled[policy], pooled_records[policy] = agg, recs
    return pooled, pooled_records


def _terminate(signum, frame):  # SIGTERM: unwind so every child process is stopped
    raise SystemExit(128 + signum)


def run(opts: Options) -> dict:
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
    opts.out.mkdir(parents=True, exist_ok=True)
    logs = opts.out / "logs"
    logs.mkdir(exist_ok=True)
    _log("building/locating llama-server and the model (cached after the first run)")
    binary = build_llama_server()
    model = install_model()
    wl = make_workload(opts.seed, opts.conversations, opts.turns, system_words=opts.system_words,
                       concurrency=opts.concurrency, ttft_slo_ms=opts.ttft_slo_ms, tpot_slo_ms=opts.tpot_slo_ms)
    data_dir = Path(tempfile.mkdtemp(prefix="real-engine-data-"))
    procs: list[Proc] = []
    summaries: dict[str, dict] = {}
    raw_results: dict[str, list[Result]] = {}
    all_records: dict[str, list[dict]] = {}
    all_results: dict[str, list[dict]] = {}
    py = sys.executable
    env = {"OMP_NUM_THREADS": "1", "LATENCY_LOG_LEVEL": "warning", "LATENCY_MIN_SAMPLES_FOR_RETRAIN": "40",
           "LATENCY_RETRAINING_INTERVAL_SEC": "2"}
    try:
        tport, pport = free_port(), free_port()
        train = Proc("training-server", [py, "-m", "training_server", "--port", str(tport), "--data-dir",
                                         str(data_dir)], logs, env)
        procs.append(train)
        train.wait_http(f"http://127.0.0.1:{tport}/healthz")
        pred = Proc("prediction-server", [py, "-m", "prediction_server", "--port", str(pport),
                                          "--training-server-url", f"http://127.0.0.1:{tport}",
                                          "--sync-interval", "2"], logs, env)
        procs.append(pred)
        pred.wait_http(f"http://127.0.0.1:{pport}/healthz")
        training_url, prediction_url = f"http://127.0.0.1:{tport}", f"http://127.0.0.1:{pport}"
        phases = [(p, k) for k in range(opts.rounds)
                  for p in (opts.policies if k % 2 == 0 else list(reversed(opts.policies)))]
        for policy, k in phases:
            key = policy if opts.rounds == 1 else f"{policy} #{k + 1}"
            tag = key.replace(" #", "-r")
            _log(f"phase {key}: starting two llama-servers (cold caches)")
            engines = []
            for i in range(2):
                port = free_port()
                e = Proc(f"{tag}-engine{i}", [str(binary), "-m", str(model), "--host", "127.0.0.1",
                                                  "--port", str(port), "-np", str(opts.slots),
                                                  "-t", str(opts.engine_threads), "-tb", str(opts.engine_threads),
                                                  "--metrics", "-c", str(opts.ctx), "--no-webui"], logs)
                engines.append((e, f"http://127.0.0.1:{port}"))
                procs.append(e)
            for e, u in engines:
                e.wait_http(u + "/health", 180)
            gport = free_port()
            gw = Proc(f"{tag}-gateway", [py, "-m", "load.real_engine.gateway_policy", "--policy", policy,
                                             "--endpoints", ",".join(u for _, u in engines), "--port", str(gport),
                                             "--prediction-urls", prediction_url, "--training-url", training_url],
                      logs, env)
            procs.append(gw)
            gw_url = f"http://127.0.0.1:{gport}"
            gw.wait_http(gw_url + "/healthz")
            _log(f"phase {key}: {wl.requests} requests, {wl.concurrency} concurrent conversations")
            t0 = time.monotonic()
            load_before = os.getloadavg()[0]
            results = asyncio.run(drive(gw_url, wl, policy, opts.max_seconds_per_policy))
            wall = time.monotonic() - t0
            load_after = os.getloadavg()[0]
            time.sleep(1.5)  # let the reporter flush the last samples
            records = fetch_records(gw_url)
            (opts.out / f"gateway-metrics-{tag}.txt").write_text(httpx.get(gw_url + "/metrics").text)
            speeds = []
            for e, u in engines:
                try:
                    text = httpx.get(u + "/metrics").text
                    (opts.out / f"engine-metrics-{tag}-{e.name[-1]}.txt").write_text(text)
                    speeds.append(engine_speed(text))
                except httpx.HTTPError:
                    pass
            for p in (gw, *[e for e, _ in engines]):
                p.stop()
                procs.remove(p)
            s = summarize(policy, results, records, wl, wall)
            s["data_status"] = httpx.get(training_url + "/data/status", timeout=10).json()
            s["engine_speed"] = speeds
            s["loadavg_1m"] = [round(load_before, 2), round(load_after, 2)]
            summaries[key] = s
            all_records[key] = records
            all_results[key] = [{f: v for f, v in asdict(r).items() if f != "text"} for r in results]
            raw_results[key] = results
            _log(f"phase {key}: done in {wall:.0f} s: TTFT p50 {s['ttft_p50_ms']}, SLO {s['slo_attainment']}")
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    per_policy, per_policy_records = summaries, all_records
    if opts.rounds > 1:
        per_policy, per_policy_records = pool_rounds(opts.policies, summaries, all_records, raw_results, wl)
    run_info = {"workload": {"conversations": opts.conversations, "turns": opts.turns,
                             "concurrency": opts.concurrency, "ttft_slo_ms": wl.ttft_slo_ms,
                             "tpot_slo_ms": wl.tpot_slo_ms, "requests": wl.requests, "seed": opts.seed},
                "engine": {"binary": str(binary), "model": model.name, "slots": opts.slots,
                           "threads": opts.engine_threads, "ctx": opts.ctx},
                "rounds": opts.rounds, "summaries": per_policy, "phases": summaries}
    (opts.out / "summary.json").write_text(json.dumps(run_info, indent=2, default=str))
    (opts.out / "records.json").write_text(json.dumps({"gateway": all_records, "client": all_results}, default=str))
    from .report import write_report

    write_report(opts.out, run_info, per_policy_records, all_results)
    return run_info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m load.real_engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("real-engine-report"))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4, help="conversations in flight at once")
    ap.add_argument("--system-words", type=int, default=160, help="length of each shared system prompt")
    ap.add_argument("--ttft-slo-ms", type=float, default=2000.0)
    ap.add_argument("--tpot-slo-ms", type=float, default=120.0)
    ap.add_argument("--max-seconds-per-policy", type=float, default=240.0)
    ap.add_argument("--ctx", type=int, default=16384, help="llama-server context (shared by its slots)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the policy list this many times, alternating its order; the report pools the rounds")
    a = ap.parse_args(argv)
    policies = [p for p in a.policies.split(",") if p]
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        ap.error(f"--policies: unknown {bad} (known: {', '.join(POLICIES)})")
    run(Options(a.out, policies, a.conversations, a.turns, a.concurrency, a.max_seconds_per_policy, a.ctx, a.seed,
                system_words=a.system_words, ttft_slo_ms=a.ttft_slo_ms, tpot_slo_ms=a.tpot_slo_ms,
                rounds=max(1, a.rounds)))
    print(a.out / "report.md")
    return 0
