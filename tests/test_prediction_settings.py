"""Prediction server settings and command line: defaults, validation naming the variable,
flags over env, exit status 2 on a bad setting, a real server process that starts,
serves a bundle from a directory and shuts down cleanly."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from prediction_server.__main__ import main
from load.demo_bundle import build_bundle
from prediction_server.settings import Settings, SettingsError
from load.ports import free_port

REPO = Path(__file__).resolve().parents[1]


def test_defaults():
    s = Settings.from_env({})
    assert (s.host, s.port, s.training_server_url, s.bundle_dir) == ("127.0.0.1", 8001, "http://127.0.0.1:8000", None)
    assert s.sync_interval_sec == 5 and s.refuse_without_model is False and s.api_token is None
    assert s.max_body_bytes == 4194304 and s.max_batch_rows == 10000 and s.quantile_alpha == 0.9
    assert s.log_level == "info" and s.enable_bench_routes is False and s.access_log is False
    assert s.sync_timeout_sec == 10 and s.max_bundle_bytes == 64 * 1024 * 1024


def test_env_and_overrides():
    env = {"LATENCY_PREDICTION_PORT": "9001", "TRAINING_SERVER_URL": "http://trainer:8000/",
           "MODEL_SYNC_INTERVAL_SEC": "0.5", "LATENCY_REFUSE_WITHOUT_MODEL": "true", "LATENCY_API_TOKEN": "token-123",
           "LATENCY_MAX_BATCH_ROWS": "64", "LATENCY_QUANTILE_ALPHA": "0.95", "LATENCY_LOG_LEVEL": "WARNING",
           "LATENCY_BUNDLE_DIR": "/tmp/b"}
    s = Settings.from_env(env)
    assert s.port == 9001 and s.training_server_url == "http://trainer:8000" and s.sync_interval_sec == 0.5
    assert s.refuse_without_model and s.api_token == "token-123" and s.max_batch_rows == 64 and s.quantile_alpha == 0.95
    assert s.log_level == "warning" and s.bundle_dir == "/tmp/b"
    s = Settings.from_env(env, port="9100", training_server_url="")
    assert s.port == 9100 and s.training_server_url == ""
    with pytest.raises(AttributeError):
        s.port = 1  # frozen


@pytest.mark.parametrize("env,value", [
    ("LATENCY_PREDICTION_PORT", "http"), ("LATENCY_PREDICTION_PORT", "70000"),
    ("TRAINING_SERVER_URL", "ftp://x"), ("TRAINING_SERVER_URL", "localhost:8000"),
    ("MODEL_SYNC_INTERVAL_SEC", "0"), ("MODEL_SYNC_INTERVAL_SEC", "soon"),
    ("LATENCY_REFUSE_WITHOUT_MODEL", "maybe"), ("LATENCY_MAX_BODY_BYTES", "10"),
    ("LATENCY_MAX_BATCH_ROWS", "0"), ("LATENCY_QUANTILE_ALPHA", "1"), ("LATENCY_QUANTILE_ALPHA", "nan"),
    ("LATENCY_LOG_LEVEL", "loud"), ("LATENCY_PREDICTION_HOST", "a b"), ("LATENCY_API_TOKEN", "short"),
    ("LATENCY_API_TOKEN", " padded-token "), ("LATENCY_MAX_BUNDLE_BYTES", "1000"),
    ("LATENCY_MAX_BUNDLE_BYTES", "lots"), ("LATENCY_MAX_BUNDLE_BYTES", str(2 << 30)),
])
def test_bad_values_name_the_variable(env, value):
    with pytest.raises(SettingsError) as e:
        Settings.from_env({env: value})
    assert e.value.env == env and env in str(e.value)


def test_typed_overrides_are_validated():
    with pytest.raises(SettingsError, match="LATENCY_MAX_BATCH_ROWS"):
        Settings.from_env({}, max_batch_rows=0)
    with pytest.raises(SettingsError, match="LATENCY_REFUSE_WITHOUT_MODEL"):
        Settings.from_env({}, refuse_without_model="perhaps")


def test_cli_bad_setting_exits_2(capsys, monkeypatch):
    monkeypatch.setenv("LATENCY_MAX_BATCH_ROWS", "lots")
    assert main(["--port", "0"]) == 2
    assert "LATENCY_MAX_BATCH_ROWS" in capsys.readouterr().err
    monkeypatch.delenv("LATENCY_MAX_BATCH_ROWS")
    assert main(["--port", "nope"]) == 2
    err = capsys.readouterr().err   # the flag the user passed is named, not its variable
    assert "bad setting --port: must be an integer" in err and "LATENCY_PREDICTION_PORT" not in err


def test_real_process_serves_bundle_dir_and_stops_cleanly(tmp_path):
    build_bundle(tmp_path, 1, "xgboost")
    port = free_port()
    env = {**os.environ, "TRAINING_SERVER_URL": "http://127.0.0.1:9"}  # the flag below overrides it
    proc = subprocess.Popen([sys.executable, "-m", "prediction_server", "--port", str(port), "--bundle-dir",
                             str(tmp_path), "--training-server-url", ""], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=2) as c:
            for _ in range(300):
                try:
                    if c.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None:
                    break
                import time
                time.sleep(0.1)
            s = c.get("/status").json()
            assert s["is_ready"] and s["training_server_url"] is None and s["model_type"] == "xgboost"
            assert c.post("/bench/noop", json={}).status_code in (404, 405)  # off by default
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.decode()
    # uvicorn drains, runs the lifespan shutdown, then re-raises SIGTERM (exit by the signal)
    assert proc.returncode in (0, -signal.SIGTERM), text
    assert "Finished server process" in text
    assert f"listening on http://127.0.0.1:{port}" in text and f"directory {tmp_path}" in text
