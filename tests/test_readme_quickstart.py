"""The README's quickstart, run as written against real servers on loopback (``latency-predictor
up``, curl): every output it shows must keep the shape of what the servers answer now (the keys
and their types) and tell the same story (TTFT grows with the queue and with the prompt, the
model version is the one served), so an output left stale after a change fails here.

To regenerate the outputs, run this test: a failure prints the real output of the step."""
from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from load.ports import free_ports

MARK = "@@quickstart-step@@"
KEY_VALUE = re.compile(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:\s*("|\[|\{|true|false|null|-?\d)')
POINT = re.compile(r'\{"values":\{"input_token_length":(\d+),"num_request_waiting":(\d+)\},'
                   r'"ttft_ms":([\d.]+),"tpot_ms":([\d.]+)\}')
VERSION = re.compile(r"v\d{6}-\d{8}T\d{6}Z")


def quickstart_steps(readme: str) -> list[tuple[str, list[str]]]:
    """The quickstart's bash block as (command, output lines shown under it), in order. An
    output is the comment lines right under a command; a comment after a blank line is prose."""
    section = readme[readme.index("## Quickstart with curl"):]
    block = section[section.index("```bash\n") + 8:]
    block = block[:block.index("\n```")]
    steps: list[tuple[str, list[str]]] = []
    command: list[str] = []
    output: list[str] | None = None      # None: not under a command
    for line in block.splitlines() + [""]:
        if line.startswith("#"):
            if command:
                output = [line[2:]]
                steps.append(("\n".join(command), output))
                command = []
            elif output is not None:
                output.append(line[2:])
            continue
        if command and not line.strip():
            steps.append(("\n".join(command), []))
            command = []
        elif line.strip():
            command.append(line)
        output = None
    return steps


def shape(text: str) -> dict[str, str]:
    """Every ``"key": value`` in a (possibly abbreviated) JSON text -> the kind of its value."""
    kind = {'"': "string", "[": "array", "{": "object", "t": "bool", "f": "bool", "n": "null"}
    return {k: kind.get(v[0], "number") for k, v in KEY_VALUE.findall(text)}


def check_story(text: str, where: str) -> None:
    """What the outputs must say, shown or real."""
    points = {(int(a), int(b)): float(t) for a, b, t, _ in POINT.findall(text)}
    if points:
        lengths = sorted({a for a, _ in points})
        assert len(points) == 6, (where, points)
        for a in lengths:  # the queue costs time to first token
            assert points[(a, 8)] > points[(a, 0)], (where, a, points)
        for b in (0, 8):   # so does the prompt
            ttft = [points[(a, b)] for a in lengths]
            assert ttft == sorted(ttft) and ttft[0] < ttft[-1], (where, b, points)
    rows = re.findall(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s*$", text, re.M)
    if rows:            # the whatif table: TTFT grows with the queue
        ttft = [float(t) for _, t, _ in rows]
        assert ttft == sorted(ttft) and ttft[0] < ttft[-1], (where, rows)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """``latency-predictor up`` on free ports; a ``latency-predictor`` on PATH running this checkout."""
    tmp = tmp_path_factory.mktemp("quickstart")
    port = free_ports(2)
    env = dict(os.environ, LATENCY_RETRAINING_INTERVAL_SEC="0.5")   # the first bundle sooner
    proc = subprocess.Popen([sys.executable, "-m", "latency_cli.main", "up", "--port", str(port),
                             "--data-dir", str(tmp / "data")], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = []
        while "[up] ready" not in "".join(lines):
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        bindir = tmp / "bin"
        bindir.mkdir()
        shim = bindir / "latency-predictor"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m latency_cli.main "$@"\n')
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
        yield port, tmp, bindir
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_quickstart(steps, port: int, tmp: Path, bindir: Path) -> list[str]:
    """Run the steps in one shell, as a user pastes them; the output of each."""
    script = []
    for command, _ in steps:
        command = command.replace("http://127.0.0.1:8000", f"http://127.0.0.1:{port}")
        command = command.replace("http://127.0.0.1:8001", f"http://127.0.0.1:{port + 1}")
        command = command.replace("/tmp/", f"{tmp}/")
        script += [command, f"echo; echo {MARK}"]
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["bash", "-e", "-c", "\n".join(script)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    outputs = r.stdout.split(MARK + "\n")
    assert len(outputs) == len(steps) + 1 and outputs[-1] == ""
    return [o.strip() for o in outputs[:-1]]


@pytest.mark.skipif(shutil.which("curl") is None, reason="the quickstart is written for curl")
def test_the_quickstart_outputs_are_what_the_servers_answer(servers):
    port, tmp, bindir = servers
    steps = quickstart_steps((REPO / "README.md").read_text())
    shown = [(command, "\n".join(out)) for command, out in steps]
    assert sum(1 for _, out in shown if out) >= 8, "the quickstart shows fewer outputs than expected"
    real = run_quickstart(steps, port, tmp, bindir)
    served = None
    for (command, expected), got in zip(shown, real):
        if not expected:
            continue
        want, have = shape(expected), shape(got)
        missing = {k: v for k, v in want.items() if have.get(k) != v}
        assert not missing, f"README output of `{command.splitlines()[0]}` is stale: {missing}; real output:\n{got}"
        check_story(expected, "README")
        check_story(got, command.splitlines()[0])
        versions = set(VERSION.findall(got))
        assert len(versions) <= 1, got
        served = served or next(iter(versions), None)
        assert versions <= {served}, (served, got)   # every step answers from the one learned bundle
        if "accepted" in want:
            assert re.search(r'"accepted":(\d+)', expected)[1] == re.search(r'"accepted":(\d+)', got)[1]
    assert served is not None and (tmp / "queue.svg").is_file()
    assert served in (tmp / "queue.svg").read_text()


def test_the_step_parser_reads_commands_and_their_outputs():
    text = ("## Quickstart with curl\n\n```bash\nT=x   # training server\n\n# 1. Prose.\ncurl a \\\n  b\n"
            "# {\"k\":1,\n#  \"s\":\"v\"}\necho hi\n# hi there\n```\n")
    assert quickstart_steps(text) == [("T=x   # training server", []), ("curl a \\\n  b", ['{"k":1,', ' "s":"v"}']),
                                      ("echo hi", ["hi there"])]
    assert shape('{"k":1, "s":"v", "a":[1], "o":{}, "b":true, "n":null}') == {
        "k": "number", "s": "string", "a": "array", "o": "object", "b": "bool", "n": "null"}
    with pytest.raises(AssertionError):   # the README's old what-if: no queue effect
        check_story('{"values":{"input_token_length":256,"num_request_waiting":0},"ttft_ms":135.4,"tpot_ms":1},'
                    '{"values":{"input_token_length":256,"num_request_waiting":8},"ttft_ms":135.4,"tpot_ms":1},'
                    '{"values":{"input_token_length":1024,"num_request_waiting":0},"ttft_ms":220.4,"tpot_ms":1},'
                    '{"values":{"input_token_length":1024,"num_request_waiting":8},"ttft_ms":220.4,"tpot_ms":1},'
                    '{"values":{"input_token_length":4096,"num_request_waiting":0},"ttft_ms":296.8,"tpot_ms":1},'
                    '{"values":{"input_token_length":4096,"num_request_waiting":8},"ttft_ms":296.8,"tpot_ms":1}',
                    "old README")
