"""``latency-predictor up``: the README's first command starts a wired pair and stops cleanly."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from load.ports import free_ports
from conftest import REPO
from latency_cli.up import build_children, parse_args, port_in_use


def test_children_follow_the_port_contract():
    children = build_children("127.0.0.1", 9000, 3, "/tmp/d", 9001)
    assert [c.url for c in children] == [f"http://127.0.0.1:{p}" for p in (9000, 9001, 9002, 9003)]
    assert children[0].argv == ["latency-training-server", "--host", "127.0.0.1", "--port", "9000", "--data-dir", "/tmp/d"]
    for c in children[1:]:
        assert c.argv[0] == "latency-prediction-server"
        assert c.argv[-2:] == ["--training-server-url", "http://127.0.0.1:9000"]


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--port", "65535", "--prediction-servers", "2"])
    assert "no room" in capsys.readouterr().err


def test_ports_come_from_the_environment_unless_a_flag_is_given(tmp_path):
    env = {"LATENCY_TRAINING_PORT": "9100", "LATENCY_PREDICTION_PORT": "9200"}
    a = parse_args(["--prediction-servers", "2", "--data-dir", str(tmp_path)], env)
    assert (a.port, a.prediction_port) == (9100, 9200)
    children = build_children("127.0.0.1", a.port, 2, str(tmp_path), a.prediction_port)
    assert [c.url for c in children] == ["http://127.0.0.1:9100", "http://127.0.0.1:9200", "http://127.0.0.1:9201"]
    assert children[1].argv[children[1].argv.index("--port") + 1] == "9200"
    a = parse_args(["--port", "9300", "--prediction-port", "9400", "--data-dir", str(tmp_path)], env)
    assert (a.port, a.prediction_port) == (9300, 9400)  # flags win
    a = parse_args(["--data-dir", str(tmp_path)], {"LATENCY_TRAINING_PORT": "9100"})
    assert (a.port, a.prediction_port) == (9100, 9101)  # prediction servers follow the training port
    a = parse_args(["--data-dir", str(tmp_path)], {})
    assert (a.port, a.prediction_port) == (8000, 8001)


@pytest.mark.parametrize("argv,env,named", [
    ([], {"LATENCY_TRAINING_PORT": "http"}, "LATENCY_TRAINING_PORT"),
    ([], {"LATENCY_PREDICTION_PORT": "0"}, "LATENCY_PREDICTION_PORT"),
    ([], {"LATENCY_PREDICTION_PORT": "70000"}, "LATENCY_PREDICTION_PORT"),
    (["--prediction-servers", "3"], {"LATENCY_TRAINING_PORT": "9001", "LATENCY_PREDICTION_PORT": "9000"},
     "LATENCY_PREDICTION_PORT"),
    (["--port", "9001", "--prediction-port", "9000", "--prediction-servers", "3"], {}, "--prediction-port"),
])
def test_bad_or_overlapping_ports_are_refused_naming_the_source(argv, env, named, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args([*argv, "--data-dir", str(tmp_path)], env)
    assert e.value.code == 2
    assert named in capsys.readouterr().err


def test_data_dir_that_is_a_file_is_a_clear_error(tmp_path, capsys):
    a_file = tmp_path / "data"
    a_file.write_text("not a directory")
    for argv, env, named in ((["--data-dir", str(a_file)], {}, "--data-dir"),
                             (["--data-dir", str(a_file / "sub")], {}, "--data-dir"),
                             ([], {"LATENCY_DATA_DIR": str(a_file)}, "LATENCY_DATA_DIR")):
        with pytest.raises(SystemExit) as e:
            parse_args(argv, env)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert named in err and "not a directory" in err and str(a_file) in err
    with pytest.raises(SystemExit):  # two bad sources: both named
        parse_args(["--data-dir", str(a_file)], {"LATENCY_TRAINING_PORT": "http"})
    err = capsys.readouterr().err
    assert "LATENCY_TRAINING_PORT: must be an integer" in err and "--data-dir: " in err
    # the real command: exit 2 and a message, no traceback
    r = subprocess.run([sys.executable, "-m", "latency_cli.main", "up", "--data-dir", str(a_file)],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--data-dir" in r.stderr and "Traceback" not in r.stderr


def test_a_standalone_training_server_refuses_a_data_dir_in_use_or_unusable(tmp_path):
    from training_server.datadir import claim

    fd = claim(tmp_path / "d")  # this process holds the directory, as a running server does
    try:
        r = subprocess.run([sys.executable, "-m", "training_server", "--port", str(free_ports(1)),
                            "--data-dir", str(tmp_path / "d")], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip() == (f"latency-training-server: --data-dir {tmp_path / 'd'}: "
                                    f"in use by another training server (pid {os.getpid()})")
    finally:
        os.close(fd)
    assert not (tmp_path / "d" / "samples.sqlite3").exists()  # the store was never opened
    # a directory it cannot create (EPERM even as root), named by the variable it came from
    r = subprocess.run([sys.executable, "-m", "training_server", "--port", str(free_ports(1))], cwd=REPO,
                       env=dict(os.environ, LATENCY_DATA_DIR="/sys/latency-data"), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("latency-training-server: LATENCY_DATA_DIR /sys/latency-data:")
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_server_errors_name_the_flag_the_user_passed(tmp_path):
    for module, prog in (("training_server", "latency-training-server"), ("prediction_server", "latency-prediction-server")):
        r = subprocess.run([sys.executable, "-m", module, "--port", "99999"], cwd=REPO, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.startswith(f"{prog}: bad setting --port: "), r.stderr
        var = "LATENCY_TRAINING_PORT" if module == "training_server" else "LATENCY_PREDICTION_PORT"
        r = subprocess.run([sys.executable, "-m", module], cwd=REPO, capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, **{var: "99999"}))
        assert r.returncode == 2 and r.stderr.startswith(f"{prog}: bad setting {var}: "), r.stderr


def test_up_starts_wired_servers_and_ctrl_c_stops_them(tmp_path):
    # the ports come from the servers' own variables (no --port flag)
    port = free_ports(3)
    pport = port + 1
    env = dict(os.environ, LATENCY_TRAINING_PORT=str(port), LATENCY_PREDICTION_PORT=str(pport))
    proc = subprocess.Popen([sys.executable, "-m", "latency_cli.main", "up",
                             "--prediction-servers", "2", "--data-dir", str(tmp_path / "data")],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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
        assert f"PREDICTION_SERVER_URL=http://127.0.0.1:{pport},http://127.0.0.1:{pport + 1}" in out
        assert f"training server on port {port} (LATENCY_TRAINING_PORT)" in out
        assert f"prediction servers on ports {pport}-{pport + 1} (LATENCY_PREDICTION_PORT)" in out
        with httpx.Client(timeout=5) as c:
            for p in (pport, pport + 1):
                st = c.get(f"http://127.0.0.1:{p}/status").json()
                assert st["training_server_url"] == f"http://127.0.0.1:{port}"
                r = c.post(f"http://127.0.0.1:{p}/predict/bulk/strict", json={"requests": [
                    {"kv_cache_percentage": 0.1, "input_token_length": 100, "num_request_waiting": 0,
                     "num_request_running": 1, "num_tokens_generated": 0, "prefix_cache_score": 0.0}]})
                assert r.status_code == 200 and r.json()["predictions"][0]["model_source"] == "prior"
            assert c.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        assert (tmp_path / "data" / "samples.sqlite3").exists()
        # a second up on the same ports, then on free ports but the same data directory: each
        # refuses before starting anything (one line, exit 2), and the first one keeps serving
        other = free_ports(2)
        for argv, named in ((["--prediction-servers", "2"], f"port {port} (LATENCY_TRAINING_PORT) is already in use"),
                            (["--port", str(other), "--prediction-port", str(other + 1)],
                             f"--data-dir {tmp_path / 'data'}: in use by another training server (pid ")):
            second = subprocess.run([sys.executable, "-m", "latency_cli.main", "up", *argv,
                                     "--data-dir", str(tmp_path / "data")],
                                    cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
            assert second.returncode == 2 and named in second.stderr, second.stderr
            assert second.stdout == "" and len(second.stderr.strip().splitlines()) == 1, second.stderr
        for p in (other, other + 1):  # nothing was started on the free ports
            assert not port_in_use("127.0.0.1", p)
        with httpx.Client(timeout=5) as c:
            assert c.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
            assert c.get(f"http://127.0.0.1:{pport}/status").json()["training_server_url"] == f"http://127.0.0.1:{port}"
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # every server is gone: the ports refuse connections
    for p in (port, pport, pport + 1):
        try:
            httpx.get(f"http://127.0.0.1:{p}/healthz", timeout=1)
            raise AssertionError(f"port {p} still answers after up stopped")
        except httpx.TransportError:
            pass
