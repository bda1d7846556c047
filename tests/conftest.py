"""Shared test helpers: the recorded trace, free ports, real server subprocesses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from load.data import SHAREGPT, open_data

REPO = Path(__file__).resolve().parents[1]
MYPY_TEST = "test_static_checks.py::test_mypy_finds_nothing"
MYPY_RUN = pytest.StashKey[subprocess.Popen]()


def start_mypy() -> subprocess.Popen:
    """``python -m mypy`` on the packages and options of pyproject's [tool.mypy], as a process."""
    return subprocess.Popen([sys.executable, "-m", "mypy"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    """When the mypy test runs with others, mypy starts at once: it checks on the second core
    while the other tests run, and its test reads the finished report."""
    if len(session.items) > 1 and any(item.nodeid.endswith(MYPY_TEST) for item in session.items):
        session.config.stash[MYPY_RUN] = start_mypy()


def pytest_sessionfinish(session: pytest.Session) -> None:
    proc = session.config.stash.get(MYPY_RUN, None)
    if proc is not None and proc.poll() is None:    # its test did not run (-x, a deselection)
        proc.kill()
        proc.communicate()


def load_jsonl(path: Path, limit: int | None = None) -> list[dict]:
    out = []
    with open_data(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
                if limit is not None and len(out) >= limit:
                    break
    return out


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return
        except Exception:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


def start_server(module: str, args: list[str], env: dict | None = None, log: Path | None = None) -> subprocess.Popen:
    """Start ``python -m module args`` as a real process (own session, so kill -9 is clean)."""
    full_env = {**os.environ, **(env or {})}
    out = open(log, "wb") if log else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", module, *args], env=full_env, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)


def stop_server(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def sharegpt_rows() -> list[dict]:
    return load_jsonl(SHAREGPT)


def training_entry(i: int) -> dict:
    """A valid, deterministic training entry (about 300 bytes of JSON), no data file needed."""
    return {"kv_cache_percentage": (i % 97) / 100, "input_token_length": 100 + i % 4000,
            "num_request_waiting": i % 7, "num_request_running": i % 13, "num_tokens_generated": i % 500,
            "actual_ttft_ms": 200.0 + i % 900, "actual_tpot_ms": 10.0 + i % 40, "prefix_cache_score": (i % 10) / 10,
            "prefill_tokens_in_flight": i % 2048, "decode_tokens_in_flight": i % 4096, "timestamp": 1.7e9 + i}


@pytest.fixture(scope="module")
def prediction_server():
    """The real prediction server app (serving the built-in prior) on loopback."""
    from prediction_server.app import create_app
    from prediction_server.settings import Settings
    from support.servers import run_app

    settings = Settings.from_env({}, host="127.0.0.1", port="0", training_server_url="")
    with run_app(create_app(settings)) as url:
        yield url
