"""Ingestion benchmark of the training server (docs/evaluation.md §3).

Starts a real training server process on 127.0.0.1 (fresh temp data dir, pinned to one
core with ``taskset`` when available), then one client posts ``POST /add_training_data_bulk``
back to back with batches of recorded sharegpt-h200 entries for a fixed duration per point.
Each point runs twice: with retraining idle, and with retraining running continuously
(interval 0.5 s, retrain after every 100 new samples). Prints a table of entries/s and
request latency (p50/p99, receive to durable commit acknowledged), then the time from the
first 100 samples to a served learned model when the trace is replayed at 200 entries/s
with the default retraining settings, and finally the retrain wall time and peak memory
with 10k/100k (optionally 1M) stored samples spread over the load regimes, in a fresh
process each. Stops by itself.

    python load/bench_ingest.py [--seconds 5] [--batches 100,1000] [--retrain-sizes 10000,100000,1000000]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from load.data import load_entries  # noqa: E402
from load.ports import free_port  # noqa: E402


def _start(data_dir: Path, port: int, interval: str) -> subprocess.Popen:
    env = {**os.environ, "LATENCY_LOG_LEVEL": "warning", "LATENCY_RETRAINING_INTERVAL_SEC": interval,
           "LATENCY_MIN_SAMPLES_FOR_RETRAIN": "100"}
    cmd = [sys.executable, "-m", "training_server", "--port", str(port), "--data-dir", str(data_dir)]
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        cmd = ["taskset", "-c", "0", *cmd]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("training server did not start")


def _point(batch: int, seconds: float, training: bool, entries: list[dict]) -> dict:
    data_dir = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    port = free_port()
    proc = _start(data_dir, port, "0.5" if training else "3600")
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})  # the client on the other core
    try:
        body = orjson.dumps({"entries": [entries[i % len(entries)] for i in range(batch)]})
        lat = []
        sent = 0
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                          headers={"Content-Type": "application/json"}) as c:
            for _ in range(3):  # warm-up
                c.post("/add_training_data_bulk", content=body)
            t_end = time.perf_counter() + seconds
            t0 = time.perf_counter()
            while time.perf_counter() < t_end:
                t = time.perf_counter()
                r = c.post("/add_training_data_bulk", content=body)
                lat.append(time.perf_counter() - t)
                if r.status_code != 202:
                    raise RuntimeError(f"status {r.status_code}: {r.text[:200]}")
                sent += batch
            elapsed = time.perf_counter() - t0
            status = c.get("/data/status").json()
        a = np.array(lat) * 1000
        return {"batch": batch, "training": training, "requests": len(lat), "entries_s": sent / elapsed,
                "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
                "retrains": status["retrain_cycles"], "stored": status["stored_rows"]}
    finally:
        _stop(proc, data_dir)
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))


def _stop(proc: subprocess.Popen, data_dir: Path) -> None:
    """Stop a benchmark server (SIGTERM, then SIGKILL after 15 s) and remove its data."""
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(data_dir, ignore_errors=True)


def _first_model(entries: list[dict], rate: float = 200.0, timeout: float = 30.0) -> dict:
    """Replays the trace in recorded order at ``rate`` entries/s into a server with default
    retraining settings (interval 2 s, 100 new samples); returns the seconds from the 100th
    entry to /readyz = 200 (a learned model published) and the entries sent by then."""
    data_dir = Path(tempfile.mkdtemp(prefix="bench-first-"))
    port = free_port()
    proc = _start(data_dir, port, "2")  # the default interval
    step = 50
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            sent, t100 = 0, None
            t_start = time.perf_counter()
            while c.get("/readyz").status_code != 200:
                now = time.perf_counter()
                if t100 is not None and now - t100 > timeout:
                    return {"seconds": None, "sent": sent, "version": None}
                due = int((now - t_start) * rate) + step
                while sent < min(due, len(entries)):
                    batch = entries[sent:sent + step]
                    assert c.post("/add_training_data_bulk", json={"entries": batch}).status_code == 202
                    sent += len(batch)
                    if t100 is None and sent >= 100:
                        t100 = time.perf_counter()
                time.sleep(0.02)
            if t100 is None:
                raise RuntimeError(f"/readyz answered 200 after only {sent} entries (fewer than 100)")
            return {"seconds": time.perf_counter() - t100, "sent": sent,
                    "version": c.get("/readyz").json()["model_version"]}
    finally:
        _stop(proc, data_dir)


_RETRAIN_CODE = r"""
import resource, sys, tempfile, time, json
from pathlib import Path
import numpy as np
from features.schema import parse_training_entry, COL
from training_server.metrics import TrainingMetrics
from training_server.registry import Registry
from training_server.store import SampleStore, entries_to_rows
from load.data import load_entries
from training_server.trainer import TrainConfig
from training_server.worker import RetrainWorker
n = int(sys.argv[1])
base = [parse_training_entry(e) for e in load_entries()]
rng = np.random.default_rng(0)
d = Path(tempfile.mkdtemp(prefix="bench-retrain-"))
store = SampleStore(d / "s.sqlite3", max_rows=max(n, 100), queue_size=10**7, test_ratio=0.1).open()
t0 = time.perf_counter()
for start in range(0, n, 20000):
    k = min(20000, n - start)
    picks = rng.integers(0, len(base), k)
    entries = []
    for i in picks:  # spread over load regimes so that many strata fill up
        e = base[i]
        raw = list(e.raw)
        raw[COL["num_request_waiting"]] = float(rng.integers(0, 8))
        raw[COL["kv_cache_percentage"]] = float(rng.random())
        entries.append(e.__class__(tuple(raw), e.actual_ttft_ms, e.actual_tpot_ms, None))
    store.submit(entries_to_rows(entries)).result()
fill = time.perf_counter() - t0
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
worker = RetrainWorker(store, Registry(d / "bundles", keep=2), TrainingMetrics(), config=TrainConfig(),
                       interval=1, min_new=1, max_per_bucket=5000, tolerance=0.02)
t0 = time.perf_counter()
report = worker.run_once()
took = time.perf_counter() - t0
m = worker.registry.served.manifest
print(json.dumps({"stored": store.rows, "fill_s": fill, "retrain_s": took, "outcome": report.outcome,
                  "n_train": {t: m.n_train(t) for t in ("ttft", "tpot")},
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_before_retrain_mb": rss0 / 1024}))
store.close()
"""


def _retrain(n: int) -> dict:
    """Retrain wall time and peak RSS (fresh process) with ``n`` stored samples."""
    out = subprocess.run([sys.executable, "-c", _RETRAIN_CODE, str(n)], cwd=REPO, capture_output=True, text=True,
                         timeout=1800, check=True)
    return orjson.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each point")
    p.add_argument("--batches", default="100,1000", help="comma-separated batch sizes")
    p.add_argument("--retrain-sizes", default="10000,100000",
                   help="stored-sample counts for the retrain time/memory table ('' to skip; 1000000 takes minutes)")
    args = p.parse_args(argv)
    entries = load_entries()
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        for training in (False, True):
            rows.append(_point(batch, args.seconds, training, entries))
    print(f"{'batch':>6} {'retraining':>10} {'requests':>9} {'entries/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'retrains':>8} {'stored':>8}")
    for r in rows:
        print(f"{r['batch']:>6} {'running' if r['training'] else 'idle':>10} {r['requests']:>9} "
              f"{r['entries_s']:>10.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['retrains']:>8} {r['stored']:>8}")
    sizes = [int(x) for x in args.retrain_sizes.split(",") if x.strip()]
    if sizes:
        print(f"\n{'stored':>8} {'n_train ttft':>12} {'n_train tpot':>12} {'retrain s':>9} {'peak RSS MB':>11} "
              f"{'outcome':>9}")
        for n in sizes:
            r = _retrain(n)
            print(f"{r['stored']:>8} {r['n_train']['ttft'] or 0:>12} {r['n_train']['tpot'] or 0:>12} "
                  f"{r['retrain_s']:>9.2f} {r['peak_rss_mb']:>11.0f} {r['outcome']:>9}")
    first = _first_model(entries)
    took = "not within 30 s" if first["seconds"] is None else f"{first['seconds']:.2f} s"
    print(f"\ntrace replayed in order at 200 entries/s, default retraining settings: learned model served "
          f"(/readyz 200) {took} after the 100th entry ({first['sent']} entries sent by then)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
