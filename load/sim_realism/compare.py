"""Measured against simulated, per stack, workload and QPS, with the acceptance bands.

- medians (TTFT p50, TPOT p50) within ``MEDIAN_BAND`` (+-15%) and tails (p90, p99) within
  ``TAIL_BAND`` (+-25%), judged on the runs below the measured saturation point;
- the saturation point: the first QPS whose TTFT p90 exceeds ``JUMP`` x the lowest-QPS run's;
  the simulated one must be within one step of the measured one on the runs' QPS grid;
- the sign of the gap between two stacks, per QPS both ran, on TTFT p90 and TPOT p50: the
  simulated gap must have the measured one's sign where the measured gap exceeds ``TIE``,
  judged where both runs recorded nearly the same requests (``SAME_ROWS``: a run that lost
  rows to timeouts is replayed without them, so its simulated load is lower than offered).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .runs import STATS

MEDIAN_BAND = 0.15
TAIL_BAND = 0.25
JUMP = 3.0
TIE = 0.05
SAME_ROWS = 0.95
GAP_STATS = ("ttft_p90", "tpot_p50")


def band(stat: str) -> float:
    return MEDIAN_BAND if stat.endswith("p50") else TAIL_BAND


@dataclass
class Point:
    qps: float
    rows: int
    measured: dict[str, float]
    simulated: dict[str, float]
    completed: int = 0
    preemptions: int = 0
    lost: int = 0             # requests the run sent but did not record, replayed (``lost``)
    verdict: dict[str, str] = field(default_factory=dict)   # stat -> PASS / FAIL / "-" (not judged)

    def ratio(self, stat: str) -> float:
        m, s = self.measured[stat], self.simulated[stat]
        return s / m if m > 0 and math.isfinite(s) else float("nan")


@dataclass
class Series:
    stack: str
    workload: str
    policy: str
    points: list[Point]
    fit: dict = field(default_factory=dict)
    saturation: dict = field(default_factory=dict)


def saturation_qps(points: Sequence[Point], which: str) -> float | None:
    """The first QPS whose TTFT p90 exceeds JUMP x the lowest-QPS run's (None: never)."""
    if not points:
        return None
    base = getattr(points[0], which)["ttft_p90"]
    for p in points[1:]:
        if getattr(p, which)["ttft_p90"] > JUMP * base:
            return p.qps
    return None


def judge(series: Series) -> None:
    """Fill every point's verdicts and the series' saturation verdict."""
    pts = series.points
    grid = [p.qps for p in pts]
    sat_m, sat_s = saturation_qps(pts, "measured"), saturation_qps(pts, "simulated")
    for p in pts:
        # judged below the measured saturation point only: past it they measure queueing
        below = sat_m is None or p.qps < sat_m
        for stat in STATS:
            r = p.ratio(stat)
            p.verdict[stat] = ("-" if not below else
                               "PASS" if math.isfinite(r) and abs(r - 1.0) <= band(stat) + 1e-12 else "FAIL")

    def step(q: float | None) -> int:
        return grid.index(q) if q is not None else len(grid)

    ok = abs(step(sat_m) - step(sat_s)) <= 1
    series.saturation = {"measured_qps": sat_m, "simulated_qps": sat_s, "verdict": "PASS" if ok else "FAIL"}


def gaps(series: Sequence[Series]) -> list[dict]:
    """Sign of the gap (second stack minus first) per workload, QPS and GAP_STATS."""
    out = []
    by_wl: dict[str, list[Series]] = {}
    for s in series:
        by_wl.setdefault(s.workload, []).append(s)
    for wl, group in sorted(by_wl.items()):
        if len(group) != 2:
            continue
        a, b = sorted(group, key=lambda s: s.stack)
        pb = {p.qps: p for p in b.points}
        for pa in a.points:
            if pa.qps not in pb:
                continue
            q = pb[pa.qps]
            for stat in GAP_STATS:
                m = q.measured[stat] - pa.measured[stat]
                s = q.simulated[stat] - pa.simulated[stat]
                rel = abs(m) / max(abs(pa.measured[stat]), 1e-12)
                same = min(pa.rows, q.rows) >= SAME_ROWS * max(pa.rows, q.rows)
                verdict = "-" if rel <= TIE or not same else ("PASS" if m * s > 0 else "FAIL")
                out.append({"workload": wl, "qps": pa.qps, "stat": stat, "first": a.stack, "second": b.stack,
                            "measured_gap": m, "simulated_gap": s, "verdict": verdict})
    return out


def summary(series: Sequence[Series], gap_rows: Sequence[dict]) -> dict[str, dict[str, int]]:
    """PASS / FAIL counts per criterion."""
    out: dict[str, dict[str, int]] = {}

    def add(key: str, v: str) -> None:
        if v in ("PASS", "FAIL"):
            out.setdefault(key, {"PASS": 0, "FAIL": 0})[v] += 1

    for s in series:
        for p in s.points:
            for stat, v in p.verdict.items():
                add("medians" if stat.endswith("p50") else "tails", v)
        add("saturation", s.saturation.get("verdict", "-"))
    for g in gap_rows:
        add("gap sign", g["verdict"])
    return out
