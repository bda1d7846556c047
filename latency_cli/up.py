"""``latency-predictor up``: one training server and N prediction servers on loopback.

The training server listens on ``--port`` (else ``LATENCY_TRAINING_PORT``, else 8000) and
the prediction servers on consecutive ports from ``--prediction-port`` (else
``LATENCY_PREDICTION_PORT``, else the port after the training server's), each polling the
training server for bundles. The data directory is ``--data-dir`` (else ``LATENCY_DATA_DIR``).
The variables are parsed by the servers' own settings; a bad one is refused (exit 2) naming it,
and so are busy ports and a data directory another training server holds, before anything
starts. Ctrl-C (or SIGTERM)
stops all of them; if one of them dies, the others are stopped too and the exit code is
non-zero. Every child is a real server process started with the same console commands a
deployment uses (``latency-training-server`` / ``latency-prediction-server``).
"""
from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

STARTUP_TIMEOUT_SEC = 60.0
STOP_TIMEOUT_SEC = 10.0


@dataclass
class Child:
    name: str
    url: str
    argv: list[str]
    proc: subprocess.Popen | None = None


def build_children(host: str, port: int, count: int, data_dir: str,
                   prediction_port: int | None = None) -> list[Child]:
    """The processes ``up`` runs, in start order (pure function: tested directly)."""
    train_url = f"http://{host}:{port}"
    children = [Child("training-server", train_url,
                      ["latency-training-server", "--host", host, "--port", str(port), "--data-dir", data_dir])]
    first = port + 1 if prediction_port is None else prediction_port
    for i in range(1, count + 1):
        p = first + i - 1
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


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Flags, then the servers' own variables, then the defaults; ``port_source`` and
    ``prediction_port_source`` say where each port came from."""
    from features.settings import SettingsError
    from prediction_server.settings import Settings as PredictionSettings
    from training_server.settings import Settings as TrainingSettings

    env = os.environ if environ is None else environ
    ap = argparse.ArgumentParser(prog="latency-predictor up", description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, help="training server port (else LATENCY_TRAINING_PORT, else 8000)")
    ap.add_argument("--prediction-port", type=int, metavar="PORT",
                    help="first prediction server port; the others follow it (else LATENCY_PREDICTION_PORT, "
                         "else the port after the training server's)")
    ap.add_argument("--prediction-servers", type=int, default=1, metavar="N",
                    help="number of prediction servers (default 1)")
    ap.add_argument("--data-dir",
                    help=f"sample store and bundles (else LATENCY_DATA_DIR, else {TrainingSettings.data_dir})")
    ap.add_argument("--host", default="127.0.0.1", help="bind address for every server (default 127.0.0.1)")
    args = ap.parse_args(argv)
    if not 0 <= args.prediction_servers <= 64:
        ap.error("--prediction-servers must be between 0 and 64")
    read = ("LATENCY_TRAINING_PORT", "LATENCY_DATA_DIR")
    try:  # only the variables up reads: the children validate the rest themselves
        ts = TrainingSettings.from_cli({k: env[k] for k in read if k in env},
                                       {"port": ("--port", args.port), "data_dir": ("--data-dir", args.data_dir)})
    except SettingsError as e:
        ap.error(str(e))
    args.port_source = "--port" if args.port is not None else (
        "LATENCY_TRAINING_PORT" if env.get("LATENCY_TRAINING_PORT") else "default")
    args.data_dir_source = "--data-dir" if args.data_dir is not None else (
        "LATENCY_DATA_DIR" if env.get("LATENCY_DATA_DIR") else "data directory")
    args.port, args.data_dir = ts.port, str(ts.data_dir)
    if args.prediction_port is not None:
        args.prediction_port_source = "--prediction-port"
    elif env.get("LATENCY_PREDICTION_PORT", "").strip():
        args.prediction_port_source = "LATENCY_PREDICTION_PORT"
        try:
            args.prediction_port = PredictionSettings.from_env(
                {"LATENCY_PREDICTION_PORT": env["LATENCY_PREDICTION_PORT"]}).port
        except SettingsError as e:
            ap.error(str(e))
    else:
        args.prediction_port, args.prediction_port_source = args.port + 1, "after the training port"
    derived = args.prediction_port_source == "after the training port"
    src = f"{args.port_source} {args.port}" if derived else f"{args.prediction_port_source} {args.prediction_port}"
    last = args.prediction_port + args.prediction_servers - 1
    if args.prediction_servers and args.prediction_port < 1:
        ap.error(f"{src}: up starts prediction servers on fixed ports in 1-65535 (0 = any free port is not supported)")
    if args.prediction_servers and last > 65535:
        ap.error(f"{src} leaves no room for {args.prediction_servers} prediction server port(s) up to 65535")
    if args.prediction_servers and args.prediction_port <= args.port <= last:
        ap.error(f"{src}: prediction server ports {args.prediction_port}-{last} include the training server's "
                 f"port {args.port} ({args.port_source})")
    return args


def describe_ports(args: argparse.Namespace) -> list[str]:
    """The ports ``up`` starts and where each came from."""
    lines = [f"[up] training server on port {args.port} ({args.port_source})"]
    n, first = args.prediction_servers, args.prediction_port
    if n == 1:
        lines.append(f"[up] prediction server on port {first} ({args.prediction_port_source})")
    elif n > 1:
        lines.append(f"[up] prediction servers on ports {first}-{first + n - 1} ({args.prediction_port_source})")
    return lines


def port_in_use(host: str, port: int) -> bool:
    """True if a server listens on ``host:port`` (bound as uvicorn binds: SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def preflight(args: argparse.Namespace) -> list[str]:
    """Why ``up`` cannot start (empty: it can): a port already taken, the data directory in use by
    another training server or not usable. Checked before anything starts, so a second ``up``
    leaves the first one alone."""
    from training_server.datadir import DataDirError, check_free

    problems = []
    ports = [(args.port, args.port_source)]
    ports += [(p, args.prediction_port_source)
              for p in range(args.prediction_port, args.prediction_port + args.prediction_servers)]
    for port, source in ports:
        if port_in_use(args.host, port):
            problems.append(f"port {port} ({source}) is already in use on {args.host}")
    try:
        check_free(Path(args.data_dir))
    except DataDirError as e:
        problems.append(f"{args.data_dir_source} {e}")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    problems = preflight(args)
    if problems:
        print(f"latency-predictor up: {'; '.join(problems)}; nothing started", file=sys.stderr)
        return 2
    children = build_children(args.host, args.port, args.prediction_servers, args.data_dir, args.prediction_port)
    for line in describe_ports(args):
        print(line, flush=True)
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
                if c.proc is not None and c.proc.poll() is not None:  # (every child was started above)
                    print(f"[up] {c.name} exited with code {c.proc.returncode}; stopping the others", file=sys.stderr)
                    return 1
            time.sleep(0.3)
        print("[up] stopping", flush=True)
        return 0
    finally:
        _stop(children)
