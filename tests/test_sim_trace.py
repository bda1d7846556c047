"""``simulate --trace FILE``: a user's Mooncake JSONL or Azure CSV trace replayed through the
real simulator, scaled to a load or at its own pace (``--load native``), with P/D pools."""
from __future__ import annotations

import gzip
import json
import math

import pytest

from load import simulate_cli
from load.sim import bench
from load.sim import workloads as W
from load.sim.trace import load_trace, native_load, trace_format, trace_scenario


def mooncake_file(path, n=40, gap_ms=500, bad_line=None):
    lines = []
    for i in range(n):
        n_in = 1000 + 97 * i
        ids = [7, 8] + [1000 + 10 * i + j for j in range(math.ceil(n_in / 512) - 2)]   # 2 shared blocks
        lines.append(json.dumps({"timestamp": 1000 + i * gap_ms, "input_length": n_in, "output_length": 40,
                                 "hash_ids": ids}))
    if bad_line is not None:
        lines[bad_line - 1] = '{"timestamp": 5, "input_length": "many", "output_length": 3}'
    path.write_text("\n".join(lines) + "\n")
    return path


def azure_file(path, n=40, rows=None):
    out = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(n):
        out.append(f"2023-11-16 18:{15 + i // 60:02d}:{i % 60:02d}.2500000,{800 + 50 * i},{20 + i}")
    out += rows or []
    path.write_text("\n".join(out) + "\n")
    return path


def test_both_formats_are_detected_and_read(tmp_path):
    mc = mooncake_file(tmp_path / "conv.jsonl")
    az = azure_file(tmp_path / "code.csv")
    assert trace_format(mc) == "mooncake" and trace_format(az) == "azure"
    a = load_trace(mc)
    assert len(a) == 40 and a[0].input_len == 1000 and a[0].output_len == 40
    assert a[1].time_s - a[0].time_s == pytest.approx(0.5)
    # the shared hash ids are the same prefix keys in every request
    assert all([k for k, _ in x.segments[:2]] == [7, 8] for x in a) and a[5].segments[1] == (8, 512)
    assert sum(n for _, n in a[5].segments) == a[5].input_len
    b = load_trace(az)
    assert len(b) == 40 and b[0].time_s == 0.0 and b[3].time_s == pytest.approx(3.0)
    assert (b[2].input_len, b[2].output_len) == (900, 22)
    # gzip is read the same way
    gz = tmp_path / "conv.jsonl.gz"
    gz.write_bytes(gzip.compress(mc.read_bytes()))
    assert load_trace(gz) == a


@pytest.mark.parametrize("kind,content,line,needle", [
    ("jsonl", None, 3, "input_length must be an integer"),
    ("jsonl", '{"timestamp": 1, "input_length": 10, "output_length": 2}\n{not json\n', 2, "not a JSON object"),
    ("csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,2\n2023-11-16 18:15:47.1,-4,2\n", 3,
     "ContextTokens must be an integer >= 0"),
    ("csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,2\nyesterday,10,2\n", 3, "TIMESTAMP"),
    ("csv", "TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:15:46.1,10,2\n", 1, "missing column(s) ContextTokens"),
    ("txt", "hello\n", 1, "neither Mooncake JSONL"),
])
def test_a_malformed_trace_is_exit_2_naming_the_file_and_line(tmp_path, capsys, kind, content, line, needle):
    path = tmp_path / f"bad.{kind}"
    if content is None:
        mooncake_file(path, bad_line=line)
    else:
        path.write_text(content)
    assert simulate_cli.main(["--trace", str(path), "--policies", "round-robin", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: line {line}: " in err and needle in err and "Traceback" not in err


def test_missing_file_and_native_without_trace_are_clear_errors(tmp_path, capsys):
    assert simulate_cli.main(["--trace", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl: cannot read" in capsys.readouterr().err
    assert simulate_cli.main(["--scenario", "standard-small", "--load", "native"]) == 2
    assert "'native' needs --trace" in capsys.readouterr().err
    assert simulate_cli.main(["--scenario", "standard-small", "--servers", "3"]) == 2
    assert "go with --trace" in capsys.readouterr().err
    assert simulate_cli.main(["--scenario", "pd", "--trace", str(mooncake_file(tmp_path / "t.jsonl"))]) == 2
    assert "--trace replaces --scenario" in capsys.readouterr().err


def test_native_load_replays_the_traces_own_timestamps_and_scaled_loads_compress_them(tmp_path):
    sc = trace_scenario(mooncake_file(tmp_path / "t.jsonl"), servers=2, preset="llama2-7b-h100")
    arrivals, capacity = bench.prepare(sc, bench.RunOptions())
    share = native_load(arrivals, capacity)
    assert share == pytest.approx((40 - 1) / 19.5 / capacity)
    native = W.scale_to_rate(arrivals, share * capacity)
    assert [x.time_s for x in native] == pytest.approx([i * 0.5 for i in range(40)], abs=1e-9)
    doubled = W.scale_to_rate(arrivals, 2 * share * capacity)
    assert doubled[-1].time_s == pytest.approx(19.5 / 2)


def simulate(trace, out, *args, plots=False) -> dict:
    flags = ["--quiet", "--out", str(out)] + ([] if plots else ["--no-plots"])
    assert simulate_cli.main(["--trace", str(trace), *args, *flags]) == 0
    return json.loads((out / "results.json").read_text())


def test_trace_run_names_the_scenario_after_the_file_and_states_the_share(tmp_path):
    res = simulate(mooncake_file(tmp_path / "my-trace.jsonl"), tmp_path / "out", "--servers", "2", "--preset",
                   "llama2-7b-h100", "--policies", "round-robin", "--load", "native,0.5", plots=True)
    assert res["scenario"] == "my-trace"
    share = res["meta"]["load_share"]["native"]
    assert res["meta"]["load_share"]["0.5"] == 0.5 and 0 < share < 0.5
    # at the trace's own pace, 40 requests 0.5 s apart: throughput ~ 39 / 19.5 s
    assert res["results"]["native"]["round-robin"]["throughput_rps"] == pytest.approx(2.0, rel=0.15)
    assert res["results"]["native"]["round-robin"]["completed"] == 40
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"{100 * share:.1f}% of capacity" in report and "2 x llama2-7b-h100" in report
    assert "slo_vs_load.png" in report and (tmp_path / "out" / "slo_vs_load.png").stat().st_size > 0


def test_pd_policies_replay_a_trace_on_prefill_and_decode_pools_over_seeds(tmp_path):
    res = simulate(azure_file(tmp_path / "az.csv"), tmp_path / "pd", "--prefill-servers", "1", "--decode-servers",
                   "1", "--policies", "pd-aggregated,pd-always", "--load", "native", "--seeds", "2")
    assert res["scenario"] == "az" and "% of capacity" in res["native_load"]
    always, agg = res["aggregate"]["native"]["pd-always"], res["aggregate"]["native"]["pd-aggregated"]
    assert always["completed"]["mean"] == agg["completed"]["mean"] == 40 and always["completed"]["n"] == 2
    assert always["disaggregated_share"]["mean"] == 1.0 and agg["disaggregated_share"]["mean"] == 0.0
    assert "az" in (tmp_path / "pd" / "report.md").read_text()
