"""``latency-predictor whatif`` against a real prediction server on loopback: the table, the
picture (lines for one field, a heatmap for two, the model version in the title) and errors
that name the flag and field."""
from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import httpx
import pytest

from conftest import REPO
from latency_cli.main import main as cli_main
from latency_cli.svgplot import nice_ticks
from prediction_server.app import create_app
from prediction_server.settings import Settings
from support.servers import run_app

SVG = "{http://www.w3.org/2000/svg}"
ROW = ["--row", '{"kv_cache_percentage": 0.3, "num_request_running": 8}', "--row", "num_tokens_generated=0",
       "--row", "prefix_cache_score=0"]


@pytest.fixture(scope="module")
def server():
    with run_app(create_app(Settings.from_env({}, training_server_url=""))) as url:
        yield url, httpx.get(url + "/status").json()["model_version"]


def table(out: str) -> list[list[str]]:
    return [line.split() for line in out.strip().splitlines()[2:] if not line.startswith("[whatif]")]


def test_one_field_prints_a_table_and_draws_lines(server, tmp_path, capsys):
    url, version = server
    plot = tmp_path / "queue.svg"
    assert cli_main(["whatif", url, *ROW, "--row", "input_token_length=1024",
                     "--grid", "num_request_waiting=0,8,16", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"model {version} (prior, ")
    assert out.splitlines()[1].split() == ["num_request_waiting", "ttft_ms", "tpot_ms"]
    rows = table(out)
    assert [r[0] for r in rows] == ["0", "8", "16"]
    ttft = [float(r[1]) for r in rows]
    assert ttft[0] < ttft[1] < ttft[2]          # the queue costs time to first token
    root = ET.parse(plot).getroot()
    texts = ["".join(t.itertext()) for t in root.iter(SVG + "text")]
    assert any(version in t for t in texts) and "What-if: TTFT and TPOT against num_request_waiting" in texts
    lines = list(root.iter(SVG + "polyline"))
    assert len(lines) == 2                      # TTFT and TPOT
    ys = [float(p.split(",")[1]) for p in lines[0].get("points").split()]
    assert len(ys) == 3 and ys[0] > ys[1] > ys[2]  # drawn rising (SVG y grows downwards)


def test_two_fields_draw_a_heatmap(server, tmp_path, capsys):
    url, version = server
    plot = tmp_path / "grid.svg"
    assert cli_main(["whatif", url, *ROW, "--grid", "input_token_length=256,1024,4096",
                     "--grid", "num_request_waiting=0,8", "--plot", str(plot)]) == 0
    rows = table(capsys.readouterr().out)
    assert [(r[0], r[1]) for r in rows] == [(a, b) for a in ("256", "1024", "4096") for b in ("0", "8")]
    root = ET.parse(plot).getroot()
    cells = [r for r in root.iter(SVG + "rect") if r.find(SVG + "title") is not None]
    assert len(cells) == 2 * 3 * 2             # a cell per point, per target
    first = cells[0].find(SVG + "title").text
    assert first == f"input_token_length=256, num_request_waiting=0: {float(rows[0][2]):.2f}"
    assert len({c.get("fill") for c in cells[:6]}) > 1   # the colour follows the value
    assert any(version in "".join(t.itertext()) for t in root.iter(SVG + "text"))


@pytest.mark.parametrize("argv, message", [
    (["--grid", "num_request_wating=0,8"], "--grid num_request_wating: unknown field; row fields are "),
    (["--row", "input_tokens=5", "--grid", "num_request_waiting=0,8"], "--row input_tokens: unknown field; "),
    (["--row", "input_token_length=-5", "--grid", "num_request_waiting=0,8"], "--row input_token_length: "),
    (["--grid", "num_request_waiting"], "--grid 'num_request_waiting': expected FIELD=v1,v2,..."),
    (["--grid", "a=1", "--grid", "b=2", "--grid", "c=3"], "--grid: give one or two fields, got 3"),
    (["--row", "{oops", "--grid", "num_request_waiting=0"], "--row '{oops': not a JSON object"),
    (["--grid", "num_request_waiting=0", "--plot", "x.png"], "--plot x.png: the picture is SVG; name the file *.svg"),
])
def test_mistakes_are_one_line_naming_the_flag_and_field(server, capsys, argv, message):
    url, _ = server
    rc = cli_main(["whatif", url, *ROW, "--row", "input_token_length=100", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"latency-predictor whatif: {message}") and err.count("\n") == 1, err


def test_an_unreachable_server_is_one_line_exit_1():
    from load.ports import free_port

    r = subprocess.run([sys.executable, "-m", "latency_cli.main", "whatif", f"http://127.0.0.1:{free_port()}",
                        "--grid", "num_request_waiting=0,8"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("latency-predictor whatif: http://127.0.0.1:")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_axis_ticks_are_round_and_cover_the_range():
    assert nice_ticks(0, 818) == [0, 200, 400, 600, 800, 1000]
    assert nice_ticks(0, 29.5) == [0, 10, 20, 30]
    assert nice_ticks(0, 0.7)[-1] >= 0.7
