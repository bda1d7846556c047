"""Requests a run sent but did not record, put back from the workload's fixed request sequence.

A request that timed out is not recorded, yet the servers carried it until the timeout: a run
that lost requests is replayed with them. They can be put back where the workload is a fixed
sequence sent at a fixed spacing, as LMBench's sharegpt workload is (the same requests in the
same order, one every 1/QPS, in every run): a run whose successive launches are all a whole
number of 1/QPS apart, with fewer rows than a complete run of the same workload (the reference: all its launches on
its grid, no position missing, the most rows), and whose recorded prompt lengths equal the
reference's at their positions (for one offset: the first requests may be the lost ones), gets
one request per missing position ``i`` with the reference's lengths of row ``i``, launched
``k / QPS`` after the recorded launch ``k`` positions before it (the client's timer drifts
over a run). Any other run is replayed as recorded.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from .runs import Run

#: how far from a whole number of spacings (a fraction of one) two successive launches may be
GRID_TOL = 0.25


def grid_positions(run: Run) -> list[int] | None:
    """Each row's position in the run's sequence of launches every 1/QPS (first row: 0), or
    None if two successive launches are not a whole number (>= 1) of spacings apart."""
    pos = [0]
    for a, b in zip(run.rows, run.rows[1:]):
        k = (b.arrival_s - a.arrival_s) * run.qps
        if round(k) < 1 or abs(k - round(k)) > GRID_TOL:
            return None
        pos.append(pos[-1] + round(k))
    return pos


def _complete(run: Run) -> bool:
    pos = grid_positions(run)
    return pos is not None and pos == list(range(len(run.rows)))


def with_lost(run: Run, reference: Run) -> Run:
    """``run`` with the requests it lost put back from ``reference`` (``run`` itself if it
    cannot be reconstructed: off its grid, or no offset where the prompt lengths agree)."""
    pos = grid_positions(run)
    ref = reference.rows
    if pos is None or len(run.rows) >= len(ref) or not _complete(reference):
        return run
    for offset in range(len(ref) - pos[-1]):
        if all(ref[p + offset].prompt_tokens == r.prompt_tokens for p, r in zip(pos, run.rows)):
            break
    else:
        return run
    at = {p + offset: r.arrival_s + offset / run.qps for p, r in zip(pos, run.rows)}   # first sent at 0
    lost, last = [], (0, 0.0)
    for i in range(len(ref)):
        if i in at:
            last = (i, at[i])
        else:
            lost.append(replace(ref[i], arrival_s=last[1] + (i - last[0]) / run.qps, ttft_s=math.nan,
                                tpot_ms=math.nan))
    rows = tuple(replace(r, arrival_s=at[p + offset]) for p, r in zip(pos, run.rows))
    return replace(run, rows=rows, lost=tuple(lost))


def fill_lost(runs: Sequence[Run], pool: Sequence[Run] = ()) -> list[Run]:
    """Every run of ``runs`` with its lost requests put back, the reference of a workload being
    its complete run with the most rows among ``runs`` and ``pool``."""
    refs: dict[str, Run] = {}
    for r in [*runs, *pool]:
        best = refs.get(r.workload)
        if _complete(r) and (best is None or len(r.rows) > len(best.rows)):
            refs[r.workload] = r
    return [with_lost(r, refs[r.workload]) if r.workload in refs else r for r in runs]
