"""The whole loop on a real engine: llama-server x2, training + prediction servers, the
gateway per policy, a multi-turn workload, and a markdown report with plots.

    python -m load.real_engine [--out DIR] [--policies llmd-default,llmd-token-load,predicted]
                               [--conversations 24] [--turns 4] [--concurrency 6]

Everything listens on 127.0.0.1 and stops by itself. The engines are restarted (cold
caches) before each policy; the training and prediction servers live through the whole
run, so the predictor keeps learning from every real request (every policy's gateway
reports TTFT/TPOT samples; only ``predicted`` and ``predicted-llmd`` route on the predictions).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from load.ports import free_port, free_ports

from .build import build_llama_server, install_model
from .driver import Result, drive, fetch_records
from .gateway_policy import DEFAULT_POLICIES, POLICIES
from .procs import Proc
from .stats import engine_speed, pool_rounds, summarize
from .workload import make_workload


def _log(msg: str) -> None:
    print(f"[real_engine] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


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
           "LATENCY_RETRAINING_INTERVAL_SEC": "2", "LATENCY_GATEWAY_ADMIN_TOKEN": secrets.token_hex(16)}
    try:
        tport = free_ports(2)
        pport = tport + 1
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
            records = fetch_records(gw_url, env["LATENCY_GATEWAY_ADMIN_TOKEN"])
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
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
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
