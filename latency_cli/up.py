"""``latency-predictor up``: one training server and N prediction servers on loopback.

The training server listens on ``--port`` (default 8000) and the prediction servers on
the ports after it, each polling the training server for bundles. Ctrl-C (or SIGTERM)
stops all of them; if one of them dies, the others are stopped too and the exit code is
non-zero. Every child is a real server process started with the same console commands a
deployment uses (``latency-training-server`` / ``latency-prediction-server``).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 8000
DEFAULT_DATA_DIR = "./latency-data"
STARTUP_TIMEOUT_SEC = 60.0
STOP_TIMEOUT_SEC = 10.0


@dataclass
class Child:
    name: str
    url: str
    argv: list[str]
    proc: subprocess.Popen | None = None


def build_children(host: str, port: int, count: int, data_dir: str) -> list[Child]:
    """The processes ``up`` runs, in start order (pure function: tested directly)."""
    train_url = f"http://{host}:{port}"
    children = [Child("training-server", train_url,
                      ["latency-training-server", "--host", host, "--port", str(port), "--data-dir", data_dir])]
    for i in range(1, count + 1):
        p = port + i
        children.append(Child(f"prediction-server-{i}", f"http://{host}:{p}",
                              ["latency-prediction-server", "--host", host, "--port", str(p),
                               "--training-server-url", train_url]))
    return children


def _module_argv(argv: list[str]) -> list[str]:
    """Run a console command through this interpreter (works without the scripts on PATH)."""
    module = {"latency-training-server": "training_server", "latency-prediction-server": "prediction_server"}[argv[0]]
    return [sys.executable, "-m", module, *argv[1:]]


def _wait_healthy(child: Child, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if child.proc is not None and child.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(child.url + "/healthz", timeout=1.0) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    return False


def _stop(children: list[Child]) -> None:
    for c in reversed(children):
        if c.proc is not None and c.proc.poll() is None:
            c.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_SEC
    for c in children:
        if c.proc is None:
            continue
        try:
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"[up] {c.name} did not stop in {STOP_TIMEOUT_SEC:.0f}s; killing it", file=sys.stderr)
            c.proc.kill()
            c.proc.wait()


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="latency-predictor up", description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help="training server port; prediction servers use the next N ports (default 8000)")
    ap.add_argument("--prediction-servers", type=int, default=1, metavar="N", help="number of prediction servers (default 1)")
    ap.add_argument("--data-dir", default=os.environ.get("LATENCY_DATA_DIR", DEFAULT_DATA_DIR), help="sample store and bundles (default ./latency-data)")
    ap.add_argument("--host", default="127.0.0.1", help="bind address for every server (default 127.0.0.1)")
    args = ap.parse_args(argv)
    if not 1 <= args.port <= 65535 - args.prediction_servers:
        ap.error(f"--port {args.port} leaves no room for {args.prediction_servers} prediction server ports")
    if not 0 <= args.prediction_servers <= 64:
        ap.error("--prediction-servers must be between 0 and 64")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    children = build_children(args.host, args.port, args.prediction_servers, args.data_dir)
    stopping = False

    def on_signal(signum, _frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SEC
        for c in children:
            print(f"[up] starting {c.name}: {' '.join(c.argv)}", flush=True)
            c.proc = subprocess.Popen(_module_argv(c.argv), start_new_session=True)
            if c.name == "training-server" and not _wait_healthy(c, deadline):
                print(f"[up] {c.name} failed to start (see its log above)", file=sys.stderr)
                return 1
        for c in children[1:]:
            if not _wait_healthy(c, deadline):
                print(f"[up] {c.name} failed to start (see its log above)", file=sys.stderr)
                return 1
        print(f"[up] training server   {children[0].url}  (data in {Path(args.data_dir).resolve()})", flush=True)
        for c in children[1:]:
            print(f"[up] prediction server {c.url}", flush=True)
        urls = ",".join(c.url for c in children[1:])
        print(f"[up] EPP settings: TRAINING_SERVER_URL={children[0].url} PREDICTION_SERVER_URL={urls}", flush=True)
        print("[up] ready; Ctrl-C stops all servers", flush=True)
        while not stopping:
            for c in children:
                if c.proc.poll() is not None:
                    print(f"[up] {c.name} exited with code {c.proc.returncode}; stopping the others", file=sys.stderr)
                    return 1
            time.sleep(0.3)
        print("[up] stopping", flush=True)
        return 0
    finally:
        _stop(children)
