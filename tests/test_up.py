"""``latency-predictor up``: the README's first command starts a wired pair and stops cleanly."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx

from conftest import REPO, free_port
from latency_cli.up import build_children, parse_args


def test_children_follow_the_port_contract():
    children = build_children("127.0.0.1", 9000, 3, "/tmp/d")
    assert [c.url for c in children] == [f"http://127.0.0.1:{p}" for p in (9000, 9001, 9002, 9003)]
    assert children[0].argv == ["latency-training-server", "--host", "127.0.0.1", "--port", "9000", "--data-dir", "/tmp/d"]
    for c in children[1:]:
        assert c.argv[0] == "latency-prediction-server"
        assert c.argv[-2:] == ["--training-server-url", "http://127.0.0.1:9000"]


def test_bad_arguments_are_refused(capsys):
    import pytest

    with pytest.raises(SystemExit):
        parse_args(["--port", "65535", "--prediction-servers", "2"])
    assert "no room" in capsys.readouterr().err


def test_up_starts_wired_servers_and_ctrl_c_stops_them(tmp_path):
    # find a base port with two free ports after it
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "latency_cli.main", "up", "--port", str(port),
                             "--prediction-servers", "2", "--data-dir", str(tmp_path / "data")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "[up] ready" in line:
                break
        out = "".join(lines)
        assert "[up] ready" in out, out
        assert f"PREDICTION_SERVER_URL=http://127.0.0.1:{port + 1},http://127.0.0.1:{port + 2}" in out
        with httpx.Client(timeout=5) as c:
            for p in (port + 1, port + 2):
                st = c.get(f"http://127.0.0.1:{p}/status").json()
                assert st["training_server_url"] == f"http://127.0.0.1:{port}"
                r = c.post(f"http://127.0.0.1:{p}/predict/bulk/strict", json={"requests": [
                    {"kv_cache_percentage": 0.1, "input_token_length": 100, "num_request_waiting": 0,
                     "num_request_running": 1, "num_tokens_generated": 0, "prefix_cache_score": 0.0}]})
                assert r.status_code == 200 and r.json()["predictions"][0]["model_source"] == "prior"
            assert c.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        assert (tmp_path / "data" / "samples.sqlite3").exists()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # every server is gone: the ports refuse connections
    for p in (port, port + 1, port + 2):
        try:
            httpx.get(f"http://127.0.0.1:{p}/healthz", timeout=1)
            raise AssertionError(f"port {p} still answers after up stopped")
        except httpx.TransportError:
            pass
