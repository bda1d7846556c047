"""Prediction-server speed benchmark (docs/evaluation.md §2).

    python -m load.bench_predict [--seconds 10] [--repeats 3] [--rows 16,64] [--concurrency 1,8,32]
                                 [--model xgboost] [--out results.json] [--no-swap-check]

Trains a quick real model from the recorded llm-d trace (``load.data.SHAREGPT``),
writes it as a bundle into a temporary directory and starts ONE prediction server process
on loopback in local-bundle-directory mode (pinned to core 0 with ``taskset`` when the
machine has 2+ cores), with ``LATENCY_ENABLE_BENCH_ROUTES=true`` so that ``POST
/bench/noop`` (same stack, body read, no parsing or prediction, a response of the same
size) gives the floor of the HTTP stack. The load generator (this process, pinned to core
1) is a lean asyncio HTTP/1.1 keep-alive client on raw sockets: each of C connections
sends a request and waits for its response (closed loop).

For each row count and concurrency, ``--repeats`` runs of ``--seconds`` each; medians are
reported: requests/s, predictions/s, p50/p99 latency (ms, client side), server
CPU-seconds per 1,000 predictions (from /proc/<pid>/stat), the floor's requests/s and
our share of it. The swap check runs 16 rows at concurrency 8: a steady period, then the
same period while new bundles are published every second (the server polls every 0.25 s);
it reports errors, p99 of both periods and their ratio, and the versions seen.
Everything runs on 127.0.0.1 and stops by itself.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from load.ports import free_port
from training_server.trainer import DEFAULT_XGB

HOST = "127.0.0.1"



def _sample_rows(n: int) -> list[dict]:
    from features.schema import row_from_raw
    from load.demo_bundle import load_trace

    raw, _, _ = load_trace()
    return [row_from_raw(raw[(i * 37) % len(raw)]) for i in range(n)]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """One prediction server subprocess in local bundle-directory mode."""

    def __init__(self, bundle_dir: Path, pin: str | None, sync_interval: float) -> None:
        self.port = free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "LATENCY_ENABLE_BENCH_ROUTES": "true",
               "TRAINING_SERVER_URL": "", "LATENCY_BUNDLE_DIR": str(bundle_dir),
               "MODEL_SYNC_INTERVAL_SEC": str(sync_interval), "LATENCY_LOG_LEVEL": "warning"}
        cmd = [sys.executable, "-m", "prediction_server", "--host", HOST, "--port", str(self.port)]
        if pin is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", pin, *cmd]
        self.proc = subprocess.Popen(cmd, env=env, cwd=Path(__file__).resolve().parents[1])
        self.pid = self.proc.pid
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prediction server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://{HOST}:{self.port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("prediction server did not become ready in 60 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _request(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _worker(port: int, req: bytes, stop_at: float, measure_from: float, lat: list, stats: dict,
                  sample: list) -> None:
    reader, writer = await asyncio.open_connection(HOST, port)
    perf = time.perf_counter
    try:
        while True:
            t0 = perf()
            if t0 >= stop_at:
                break
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            i = head.lower().find(b"content-length:")
            n = int(head[i + 15:head.index(b"\r\n", i)])
            body = await reader.readexactly(n)
            t1 = perf()
            stats["all"] += 1
            if t0 >= measure_from:
                if head.startswith(b"HTTP/1.1 200"):
                    lat.append(t1 - t0)
                    if len(sample) < 1 or stats["ok"] % 200 == 0:
                        sample.append(body)
                    stats["ok"] += 1
                else:
                    stats["errors"] += 1
    finally:
        writer.close()


async def _run_point(port: int, req: bytes, concurrency: int, seconds: float, warmup: float) -> dict:
    now = time.perf_counter()
    measure_from = now + warmup
    stop_at = measure_from + seconds
    lat: list[float] = []
    stats = {"ok": 0, "errors": 0, "all": 0}
    sample: list[bytes] = []
    await asyncio.gather(*[_worker(port, req, stop_at, measure_from, lat, stats, sample)
                           for _ in range(concurrency)])
    return {"lat": lat, **stats, "sample": sample}


def run_point(server: Server, path: str, body: bytes, rows: int, concurrency: int, seconds: float,
              warmup: float = 0.5) -> dict:
    req = _request(path, body)
    cpu0 = _cpu_seconds(server.pid)
    t0 = time.perf_counter()
    out = asyncio.run(_run_point(server.port, req, concurrency, seconds, warmup))
    wall = time.perf_counter() - t0
    cpu = _cpu_seconds(server.pid) - cpu0
    lat = sorted(out["lat"])
    n = len(lat)
    rps = n / seconds
    return {
        "path": path, "rows": rows, "concurrency": concurrency, "requests": n, "errors": out["errors"],
        "rps": rps, "predictions_per_s": rps * rows,
        "p50_ms": lat[n // 2] * 1000 if n else float("nan"),
        "p99_ms": lat[min(n - 1, int(n * 0.99))] * 1000 if n else float("nan"),
        # server CPU over the whole point (warm-up included) per request / prediction made in it
        "cpu_s_per_1k_pred": cpu / max(1, out["all"] * rows) * 1000,
        "rps_per_cpu_s": out["all"] / cpu if cpu > 0 else float("nan"),
        "server_cpu_share": cpu / wall,
        "samples": out["sample"],
    }


def _median_point(runs: list[dict]) -> dict:
    keys = ("rps", "predictions_per_s", "p50_ms", "p99_ms", "cpu_s_per_1k_pred", "rps_per_cpu_s", "server_cpu_share")
    m = {k: statistics.median(r[k] for r in runs) for k in keys}
    m["errors"] = sum(r["errors"] for r in runs)
    return m


def swap_check(server: Server, bundle_dir: Path, body: bytes, seconds: float, kind: str, rounds: int,
               max_depth: int) -> dict:
    """Steady p99 vs p99 while a new bundle is published every second. Bundles are built
    before measuring (in a staging directory) and published by an atomic rename, the last
    step of ``features.bundle.write_bundle``, so the load generator is not disturbed."""
    import os

    from features.bundle import list_bundles, version_seq
    from load.demo_bundle import build_bundle

    staging = bundle_dir.parent / "staging"
    seq0 = version_seq(list_bundles(bundle_dir)[-1].name)
    n = int(seconds) + 2
    staged = [build_bundle(staging, seq0 + 1 + i, kind, rounds=rounds + (i + 1) % 2, max_depth=max_depth)
              for i in range(n)]
    path = "/predict/bulk/strict"
    steady = run_point(server, path, body, 16, 8, seconds)
    stop = threading.Event()
    published = []

    def publisher() -> None:
        for b in staged:
            if stop.wait(1.0):
                return
            os.rename(b, bundle_dir / b.name)
            published.append(b.name)

    t = threading.Thread(target=publisher, daemon=True)
    t.start()
    try:
        during = run_point(server, path, body, 16, 8, seconds)
    finally:
        stop.set()
        t.join()
        shutil.rmtree(staging, ignore_errors=True)
    versions = set()
    mixed = 0
    for b in during["samples"]:
        d = json.loads(b)
        vs = {p["model_version"] for p in d["predictions"]}
        mixed += len(vs) > 1
        versions |= vs
    return {"steady_p99_ms": steady["p99_ms"], "swap_p99_ms": during["p99_ms"],
            "p99_ratio": during["p99_ms"] / steady["p99_ms"], "errors": steady["errors"] + during["errors"],
            "bundles_published": len(published), "versions_seen": len(versions),
            "responses_with_mixed_versions": mixed, "steady_rps": steady["rps"], "swap_rps": during["rps"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.bench_predict", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per point (default 10)")
    p.add_argument("--repeats", type=int, default=3, help="repetitions per point; medians reported (default 3)")
    p.add_argument("--rows", default="16,64", help="rows per request, comma-separated (default 16,64)")
    p.add_argument("--concurrency", default="1,8,32", help="connections, comma-separated (default 1,8,32)")
    p.add_argument("--model", choices=("xgboost", "lightgbm"), default="xgboost")
    p.add_argument("--rounds", type=int, default=DEFAULT_XGB["n_estimators"],
                   help="boosting rounds per target (default: the training server's default recipe)")
    p.add_argument("--max-depth", type=int, default=DEFAULT_XGB["max_depth"],
                   help="tree depth (default: the training server's default recipe)")
    p.add_argument("--no-pin", action="store_true", help="do not pin server/client to cores 0/1")
    p.add_argument("--no-swap-check", action="store_true", help="skip the bundle-swap-under-load check")
    p.add_argument("--out", help="also write the results as JSON to this file")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.repeats < 1:
        p.error("--seconds must be > 0 and --repeats >= 1")
    rows_list = [int(x) for x in args.rows.split(",")]
    conc_list = [int(x) for x in args.concurrency.split(",")]

    from load.demo_bundle import build_bundle

    pin = None
    if not args.no_pin and (os.cpu_count() or 1) >= 2 and hasattr(os, "sched_setaffinity"):
        pin = "0"
        os.sched_setaffinity(0, {1})
    try:
        import uvloop  # noqa: F401  (the client is lean too)
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass

    tmp = Path(tempfile.mkdtemp(prefix="bench-predict-"))
    server = None
    results: dict = {"setting": {"seconds": args.seconds, "repeats": args.repeats, "model": args.model,
                                 "rounds": args.rounds, "max_depth": args.max_depth,
                                 "pinned": pin is not None, "cpus": os.cpu_count()}, "points": []}
    try:
        bundle_dir = tmp / "bundles"
        build_bundle(bundle_dir, 1, args.model, rounds=args.rounds, max_depth=args.max_depth)
        server = Server(bundle_dir, pin, sync_interval=0.25)
        print(f"server pid {server.pid} on {HOST}:{server.port}, pinned={pin is not None}, model={args.model}",
              file=sys.stderr)
        for rows in rows_list:
            body = json.dumps({"requests": _sample_rows(rows)}).encode()
            for conc in conc_list:
                point: dict = {"rows": rows, "concurrency": conc}
                for name, path in (("predict", "/predict/bulk/strict"), ("noop", "/bench/noop")):
                    runs = [run_point(server, path, body, rows, conc, args.seconds) for _ in range(args.repeats)]
                    point[name] = _median_point(runs)
                point["share_of_floor"] = point["predict"]["rps"] / point["noop"]["rps"]
                results["points"].append(point)
                pr = point["predict"]
                print(f"rows={rows} c={conc}: {pr['rps']:.0f} req/s p50 {pr['p50_ms']:.2f} ms "
                      f"p99 {pr['p99_ms']:.2f} ms; floor {point['noop']['rps']:.0f} req/s", file=sys.stderr)
        if not args.no_swap_check:
            body = json.dumps({"requests": _sample_rows(16)}).encode()
            results["swap"] = swap_check(server, bundle_dir, body, args.seconds, args.model, args.rounds,
                                         args.max_depth)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    print(render_markdown(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


def render_markdown(results: dict) -> str:
    s = results["setting"]
    lines = [f"Prediction server, {s['model']} bundle ({s['rounds']} rounds x depth {s['max_depth']} per target), "
             f"{s['seconds']:g} s x {s['repeats']} repeats (medians), server pinned to one core: {s['pinned']}. "
             "'req/CPU-s' = requests per second of server CPU (capacity of one uncontended core); "
             "'CPU share' = server CPU / wall time (1.0 = had its core to itself).",
             "",
             "| rows | conc | req/s | pred/s | p50 ms | p99 ms | CPU s/1k pred | req/CPU-s | CPU share "
             "| floor req/s | floor req/CPU-s | share of floor (req/s) | share of floor (CPU) | errors |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for pt in results["points"]:
        pr, nf = pt["predict"], pt["noop"]
        lines.append(f"| {pt['rows']} | {pt['concurrency']} | {pr['rps']:.0f} | {pr['predictions_per_s']:.0f} "
                     f"| {pr['p50_ms']:.2f} | {pr['p99_ms']:.2f} | {pr['cpu_s_per_1k_pred']:.4f} "
                     f"| {pr['rps_per_cpu_s']:.0f} | {pr['server_cpu_share']:.2f} | {nf['rps']:.0f} "
                     f"| {nf['rps_per_cpu_s']:.0f} | {pt['share_of_floor']:.0%} "
                     f"| {pr['rps_per_cpu_s'] / nf['rps_per_cpu_s']:.0%} | {pr['errors'] + nf['errors']} |")
    sw = results.get("swap")
    if sw:
        lines += ["", f"Bundle swap under load (16 rows, c=8): {sw['bundles_published']} bundles published, "
                      f"{sw['versions_seen']} versions seen in sampled responses, "
                      f"{sw['responses_with_mixed_versions']} responses with mixed versions, "
                      f"{sw['errors']} errors; p99 steady {sw['steady_p99_ms']:.2f} ms, during swaps "
                      f"{sw['swap_p99_ms']:.2f} ms (x{sw['p99_ratio']:.2f})."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
