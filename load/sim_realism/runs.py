"""Measured runs in LMBench's CSV layout: one folder per stack, one CSV per (workload, QPS).

A folder such as ``load/data/llm-d-benchmark-exp2`` holds ``<stack>/LMBench_<workload>_<QPS>``
files (``LMBench_sharegpt_output_2.csv``, ``LMBench_short_input_qps2.csv``, plain or
``.gz``) with one row per completed request: ``prompt_tokens``, ``generation_tokens``,
``ttft`` (s), ``generation_time`` (s), ``launch_time`` (Unix s). Requests that timed out are
not recorded (rows with an empty value or no tokens are skipped as such), so a run is exactly
the completed requests it lists, replayed at their launch times.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from load.data import open_data

_NAME = re.compile(r"^LMBench_(?P<workload>.+?)_(?:output_|qps)(?P<qps>\d+(?:\.\d+)?)\.csv(?:\.gz)?$")
_COLUMNS = ("prompt_tokens", "generation_tokens", "ttft", "generation_time", "launch_time")
#: the per-QPS statistics compared (TTFT in s, TPOT in ms)
STATS = ("ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90", "tpot_p99")


class RunsError(ValueError):
    """A folder or file that is not in the LMBench layout (the message names it)."""


@dataclass(frozen=True)
class Row:
    arrival_s: float          # launch time, relative to the run's first launch
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_ms: float            # generation_time / (output_tokens - 1); 0 for one-token outputs

    @property
    def e2e_s(self) -> float:
        """Launch to last token (s)."""
        return self.ttft_s + self.tpot_ms * max(self.output_tokens - 1, 0) / 1000.0


@dataclass(frozen=True)
class Run:
    stack: str
    workload: str
    qps: float
    path: Path
    rows: tuple[Row, ...]
    t0: float = 0.0           # the first launch (Unix s): orders the runs of a stack in time
    #: requests the run sent but did not record (timed out), put back by ``lost.fill_lost``:
    #: launch time and lengths only (``ttft_s``, ``tpot_ms`` NaN); replayed, never measured
    lost: tuple[Row, ...] = ()

    def sent(self) -> list[Row]:
        """Every request the run sent that is known, recorded or lost, in launch order."""
        return sorted(self.rows + self.lost, key=lambda r: r.arrival_s)


def _num(row: dict, key: str, where: str) -> float:
    try:
        v = float(row[key])
    except (KeyError, TypeError, ValueError):
        raise RunsError(f"{where}: column {key!r} missing or not a number") from None
    if not np.isfinite(v) or v < 0:
        raise RunsError(f"{where}: column {key!r} must be a finite number >= 0, got {row[key]!r}")
    return v


def read_run(path: Path, stack: str) -> Run:
    m = _NAME.match(path.name)
    if m is None:
        raise RunsError(f"{path}: not an LMBench_<workload>_<QPS>.csv file")
    rows = []
    with open_data(path) as f:
        reader = csv.DictReader(f)
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise RunsError(f"{path}: missing column(s) {', '.join(missing)}")
        raw = list(reader)
    if not raw:
        raise RunsError(f"{path}: no rows")
    parsed = []
    for i, r in enumerate(raw, 1):
        where = f"{path} row {i}"
        if any((r.get(c) or "").strip() in ("", "nan", "NaN", "None") for c in _COLUMNS):
            continue            # a request the client did not complete: not a recorded row
        n_in, n_out = int(_num(r, "prompt_tokens", where)), int(_num(r, "generation_tokens", where))
        if n_in < 1 or n_out < 1:
            continue
        parsed.append((r, where, n_in, n_out))
    if not parsed:
        raise RunsError(f"{path}: no completed request (every row lacks a value or has no tokens)")
    t0 = min(_num(r, "launch_time", where) for r, where, _, _ in parsed)
    for r, where, n_in, n_out in parsed:
        gen = _num(r, "generation_time", where)
        rows.append(Row(_num(r, "launch_time", where) - t0, n_in, n_out, _num(r, "ttft", where),
                        gen * 1000.0 / (n_out - 1) if n_out > 1 else 0.0))
    rows.sort(key=lambda r: r.arrival_s)
    return Run(stack, m["workload"], float(m["qps"]), path, tuple(rows), t0)


def load_folder(folder: Path, workloads: tuple[str, ...] = (), qps: tuple[float, ...] = ()) -> list[Run]:
    """Every run of every stack (subfolder) in ``folder``, by stack, workload and QPS;
    ``workloads`` / ``qps`` keep only those (empty: all)."""
    if not folder.is_dir():
        raise RunsError(f"{folder}: not a directory")
    runs = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        for p in sorted(sub.iterdir()):
            if _NAME.match(p.name) is None:
                continue
            m = _NAME.match(p.name)
            assert m is not None
            if workloads and m["workload"] not in workloads:
                continue
            if qps and not any(abs(float(m["qps"]) - q) < 1e-9 for q in qps):
                continue
            runs.append(read_run(p, sub.name))
    if not runs:
        raise RunsError(f"{folder}: no LMBench_<workload>_<QPS>.csv files in any stack subfolder"
                        + (" (after the --workload/--qps filters)" if workloads or qps else ""))
    runs.sort(key=lambda r: (r.stack, r.workload, r.qps))
    return runs


def stats(ttft_s: list[float], tpot_ms: list[float]) -> dict[str, float]:
    """TTFT (s) and TPOT (ms) median, p90 and p99 (linear interpolation, as numpy)."""
    t, p = np.asarray(ttft_s, float), np.asarray([x for x in tpot_ms if x > 0], float)
    out = {}
    for name, arr in (("ttft", t), ("tpot", p)):
        for q in (50, 90, 99):
            out[f"{name}_p{q}"] = float(np.percentile(arr, q)) if arr.size else float("nan")
    return out


def measured(run: Run) -> dict[str, float]:
    return stats([r.ttft_s for r in run.rows], [r.tpot_ms for r in run.rows])
