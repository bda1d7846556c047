"""Invariant 1 on a real server process: every acknowledged (202) entry survives kill -9;
SIGTERM shuts down cleanly with the queue committed."""
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from load.data import load_entries
from load.ports import free_port

REPO = Path(__file__).resolve().parents[1]
BASE = load_entries()[:50]



def start(data_dir: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "LATENCY_RETRAINING_INTERVAL_SEC": "3600", "LATENCY_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "training_server", "--port", str(port), "--data-dir",
                             str(data_dir)], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"server did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.1)


def stored_timestamps(data_dir: Path) -> set[float]:
    with sqlite3.connect(data_dir / "samples.sqlite3") as c:
        return {r[0] for r in c.execute("SELECT ts FROM samples")}


def batch(first_ts: int, n: int) -> list[dict]:
    # each entry is marked by a unique epoch timestamp
    return [{**BASE[i % len(BASE)], "timestamp": float(first_ts + i)} for i in range(n)]


def test_acknowledged_entries_survive_kill_9(tmp_path):
    port = free_port()
    proc = start(tmp_path, port)
    acked: set[float] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def client(k: int) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            for j in range(10_000):
                if stop.is_set():
                    return
                entries = batch(1_000_000 * (k + 1) + 100 * j, 100)
                try:
                    r = c.post("/add_training_data_bulk", json={"entries": entries})
                except httpx.HTTPError:
                    return  # the server died under us: this batch was not acknowledged
                if r.status_code == 202:
                    with lock:
                        acked.update(e["timestamp"] for e in entries)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    try:
        for t in threads:
            t.start()
        while len(acked) < 5000:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)  # mid-traffic: batches in flight are lost, acked ones must not be
        proc.wait(10)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        if proc.poll() is None:
            proc.kill()
    with lock:
        acked_now = set(acked)
    proc = start(tmp_path, port)
    try:
        status = httpx.get(f"http://127.0.0.1:{port}/data/status").json()
        stored = stored_timestamps(tmp_path)
        assert acked_now <= stored, f"{len(acked_now - stored)} acknowledged entries lost"
        assert status["stored_rows"] == len(stored) >= len(acked_now) >= 5000
    finally:
        proc.terminate()
        proc.wait(15)


def test_sigterm_shuts_down_cleanly(tmp_path):
    port = free_port()
    proc = start(tmp_path, port)
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/add_training_data_bulk", json={"entries": batch(10, 300)})
        assert r.status_code == 202
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0  # a hang guard, not a speed bound
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(stored_timestamps(tmp_path)) == 300
    assert not (tmp_path / "samples.sqlite3-wal").exists() or (tmp_path / "samples.sqlite3-wal").stat().st_size == 0
