"""Prequential replay through a real training server and prediction server on loopback: the
first predictions come from the prior, a learned bundle takes over, every prediction is
scored against the entry's actual, and the report and plot are written."""
from __future__ import annotations

import json

import numpy as np
import pytest

from load import prequential, simulate_cli


def test_short_replay_through_real_servers(tmp_path):
    trace = tmp_path / "sessions.jsonl"  # recorded by the real simulator (prefix-heavy chat sessions)
    assert simulate_cli.main(["--scenario", "sessions", "--policies", "llmd-default", "--limit", "300",
                              "--record-trace", str(trace), "--out", str(tmp_path / "sim"), "--no-plots",
                              "--quiet"]) == 0
    entries = prequential.load_entries(trace)
    out = tmp_path / "out"
    s = prequential.replay(entries, rate=50.0, before=10.0, after=4.0, factor=1.5, out=out, log=lambda *a: None)
    assert s["entries"] == 700
    # cold start: prior first (scored), then a learned model
    assert s["prior"]["ttft"]["n"] > 0 and s["prior"]["ttft"]["coverage"] is not None
    assert s["first_learned_prediction_s"] is not None and s["first_learned_prediction_s"] > 99 / 50.0
    for t in ("ttft", "tpot"):
        assert 0 <= s[t]["overall_coverage"] <= 100
    assert (out / "prequential-coverage.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "prequential.json").read_text())["entries"] == 700


def test_summary_finds_the_recovery_time():
    """Synthetic records: coverage 90% before a step at 20 s, 50% for 15 s after it, then 90%."""
    rows = []
    for i in range(60 * 50):
        t = i / 50.0
        k = i // 2  # per-target sample number
        miss = (k % 2 == 0) if 20.0 <= t < 35.0 else (k % 10 == 0)
        rows.append((t, i, i % 2, 3.0 if miss else 1.0, 2.0, 1 if t > 5 else 0))
    s = prequential.summarize(np.array(rows), rate=50.0, step_s=20.0, quantile=0.9)
    for t in ("ttft", "tpot"):
        # the last window touching the bad period ends just before 45 s: back 24-25 s after the step
        assert 24.0 <= s[t]["back_within_3_points_after_s"] <= 25.0
        assert s[t]["first_within_3_points_after_s"] == s[t]["back_within_3_points_after_s"]
        assert s[t]["share_of_windows_within_3_points_after_recovery"] == 100.0
        assert s[t]["min_coverage_after_step"] < 60
        assert abs(s[t]["coverage_last_10s"] - 90.0) < 1.0
    assert s["learned_after_100th_sample_s"] > 0


def test_summary_counts_the_learned_windows_inside_the_band():
    """Synthetic records without a step: the prior until 5 s, then coverage 90% except a dip
    to 50% between 30 and 40 s; the windows after the first learned prediction are scored."""
    rows = []
    for i in range(60 * 50):
        t = i / 50.0
        k = i // 2
        miss = (k % 2 == 0) if 30.0 <= t < 40.0 else (k % 10 == 0)
        rows.append((t, i, i % 2, 3.0 if miss else 1.0, 2.0, 1 if t >= 5 else 0))
    s = prequential.summarize(np.array(rows), rate=50.0, step_s=60.0, quantile=0.9)
    for t in ("ttft", "tpot"):
        w = s[t]["after_first_learned"]
        # windows end every second from 15 s (the first wholly after 5 s) to 60 s
        assert w["windows"] == 46
        assert w["min_coverage"] < 60 and w["max_coverage"] >= 90
        # 19 windows touch the dip (ends 31..49 s); those overlapping it by 1 s only (ends 31 and
        # 49: coverage 86%) are still inside the band with the 27 that do not touch it
        assert w["share_within_5_points"] == pytest.approx(29 / 46 * 100, abs=0.1)
