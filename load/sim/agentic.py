"""Scenario ``agentic``: multi-turn agent programs arriving over time (closed loop).

A program arrives (Poisson), then runs turns one after another: each turn's prompt is
the whole previous context (previous prompt + answer) plus a tool result, so the
context grows every turn and the previous turn's context is the shared prefix (prefix
caching matters); the next turn arrives a think/tool time after the previous one
finished. A turn that is rejected or shed ends its program (counted as failed), and the
program's turns it never issued are misses: SLO attainment is over every turn of every program
(:func:`summarize_programs`), so a router does not raise it by failing programs early, which
takes their later turns out of the load.

Load: 1.0 = programs arrive as fast as the pool could serve them with a perfect prefix
cache (``workloads.capacity_rps(..., prefix_reuse=True)`` over all turns, divided by
the mean turns per program); real caches miss, so load >= 1.0 is contention.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from . import workloads as W
from .request import SimRequest

if TYPE_CHECKING:
    from .engine import Simulation

_PROGRAM_KEY = 4 << 40
_SYS_BASE = (1 << 40) + 777_000
DEPTHS = ((1, 1), (2, 4), (5, 9), (10, 19), (20, 10**9))
DEPTH_LABELS = tuple(f"{lo}" if lo == hi else (f"{lo}+" if hi > 1000 else f"{lo}-{hi}") for lo, hi in DEPTHS)


@dataclass
class Program:
    pid: int
    arrival: float
    turns: list                      # W.Arrival templates (their time_s is unused)
    thinks: list                     # seconds between a turn's end and the next turn's arrival
    # filled in by the run
    start: float = -1.0
    end: float = -1.0
    failed: bool = False
    done_turns: int = 0
    waits: list = field(default_factory=list)


def programs(n: int, seed: int = 0, turns_median: float = 8.0, turns_sigma: float = 0.8, max_turns: int = 48,
             system_blocks: int = 4, task_median: int = 1500, tool_median: int = 700, output_median: int = 150,
             think_median_s: float = 2.0, max_context: int = 60_000) -> list[Program]:
    """``n`` programs at unit arrival rate (times are scaled to the load later)."""
    rng = random.Random(seed ^ 0xA6E7)
    out = []
    t = 0.0
    uniq = 0
    for pid in range(n):
        t += rng.expovariate(1.0)
        nturns = max(2, min(max_turns, round(rng.lognormvariate(math.log(turns_median), turns_sigma))))
        ctx = system_blocks * W.SEG + W._lognormal_int(rng, task_median, 0.6, 64, 12_000)
        turns, thinks = [], []
        for _ in range(nturns):
            if ctx > max_context:
                break
            n_out = W._lognormal_int(rng, output_median, 0.7, 8, 1500)
            full = ctx // W.SEG
            blocks = [_SYS_BASE + j for j in range(min(system_blocks, full))]
            blocks += [_PROGRAM_KEY + pid * 1000 + j for j in range(len(blocks), full)]
            if ctx % W.SEG:
                uniq += 1
                blocks.append(_PROGRAM_KEY + 999 + uniq * 1000 * 1000)   # partial block: its content changes next turn
            turns.append(W.Arrival(0.0, ctx, n_out, W._chunk(blocks, ctx)))
            ctx += n_out + W._lognormal_int(rng, tool_median, 1.0, 16, 8000)
            thinks.append(rng.lognormvariate(math.log(think_median_s), 1.0))
        out.append(Program(pid, t, turns, thinks[:len(turns) - 1]))
    return out


def capacity_programs(progs: list[Program], servers) -> float:
    """Programs/s the pool serves at load 1.0 (perfect prefix reuse)."""
    flat = [a for p in progs for a in p.turns]
    return W.capacity_rps(flat, servers, prefix_reuse=True) * len(progs) / len(flat)


def scaled(progs: Sequence[Program], rate: float) -> list[Program]:
    """Fresh program objects arriving at ``rate`` programs/s (order and shapes kept)."""
    return [Program(p.pid, p.arrival / rate, p.turns, p.thinks) for p in progs]


class AgenticDriver:
    """Creates each program's turns as SimRequests: the first at the program's arrival,
    the next one a think time after the previous one ended (``sim.inject``)."""

    def __init__(self, progs: list[Program], slo, spec) -> None:
        self.progs = {p.pid: p for p in progs}
        self.slo = slo
        self.spec = spec
        self.sim: Simulation | None = None
        self.turn_of: dict[int, tuple[int, int]] = {}
        self.requests: list[SimRequest] = []
        self._rid = 0

    def _request(self, p: Program, k: int, at: float) -> SimRequest:
        a = p.turns[k]
        r = SimRequest(self._rid, at, a.input_len, a.output_len, a.segments,
                       ttft_slo_ms=self.slo.ttft_for(a.input_len, self.spec), tpot_slo_ms=self.slo.tpot_ms,
                       priority=self.slo.priority, session=p.pid, block_size=self.spec.block_size)
        self.turn_of[self._rid] = (p.pid, k)
        self._rid += 1
        self.requests.append(r)
        return r

    def initial_requests(self) -> list[SimRequest]:
        return [self._request(p, 0, p.arrival) for p in sorted(self.progs.values(), key=lambda p: p.arrival)]

    def bind(self, sim) -> None:
        self.sim = sim

    def on_finish(self, req: SimRequest, now: float) -> None:
        pid, k = self.turn_of[req.rid]
        p = self.progs[pid]
        if req.dispatch_t >= 0:
            p.waits.append(req.dispatch_t - req.arrival)
        elif req.shed or req.abandoned:   # rejected or given up before reaching a server: it waited until now
            p.waits.append(now - req.arrival)
        if req.shed or req.abandoned:     # rejected, or its client gave up at the deadline
            p.failed, p.end = True, now
            return
        p.done_turns = k + 1
        if k + 1 < len(p.turns):
            if self.sim is None:
                raise RuntimeError("agentic driver: not bound to a simulation (bind() first)")
            self.sim.inject(self._request(p, k + 1, now + p.thinks[k]))
        else:
            p.end = now


def summarize_programs(driver: AgenticDriver) -> dict:
    """Program completion time (last turn's end minus the program's arrival; completed programs only),
    TTFT by turn depth, flow-control queue waits (arrival to dispatch, or to rejection for a
    request turned away while queued), Jain's index over the per-program mean waits, and SLO
    attainment over every turn of every program (``turns_not_issued``: the turns of failed or
    unfinished programs that never arrived, each a miss)."""
    progs = list(driver.progs.values())
    planned = sum(len(p.turns) for p in progs)
    met = sum(1 for r in driver.requests if r.meets_slo())
    done = [p for p in progs if not p.failed and p.end >= 0]
    ct = np.array([p.end - p.arrival for p in done])
    waits = np.array([w for p in progs for w in p.waits])
    means = [float(np.mean(p.waits)) for p in progs if p.waits]
    sq = sum(x * x for x in means)
    jain = (sum(means) ** 2 / (len(means) * sq)) if len(means) > 1 and sq > 0 else 1.0
    m = {"programs": len(progs), "programs_completed": len(done), "programs_failed": sum(p.failed for p in progs),
         "program_completion_mean_s": float(ct.mean()) if ct.size else float("nan"),
         "program_completion_p90_s": float(np.percentile(ct, 90)) if ct.size else float("nan"),
         "queue_wait_mean_s": float(waits.mean()) if waits.size else float("nan"),
         "queue_wait_p99_s": float(np.percentile(waits, 99)) if waits.size else float("nan"),
         "queue_wait_max_s": float(waits.max()) if waits.size else float("nan"),
         "program_mean_wait_max_s": max(means) if means else float("nan"),
         "jain_index": jain,
         "slo_attainment": met / planned if planned else float("nan"),
         "turns_not_issued": planned - len(driver.requests)}
    by_depth: dict[str, list] = {}
    for r in driver.requests:
        if r.done and not r.shed:
            k = driver.turn_of[r.rid][1] + 1
            label = next(lab for (lo, hi), lab in zip(DEPTHS, DEPTH_LABELS) if lo <= k <= hi)
            by_depth.setdefault(label, []).append(r.ttft_ms)
    for label in DEPTH_LABELS:
        v = by_depth.get(label)
        m[f"ttft_turn_{label}_mean_ms"] = float(np.mean(v)) if v else float("nan")
    return m


AGENTIC_COLUMNS = (("programs done", "programs_completed", "n"), ("failed", "programs_failed", "n"),
                   ("turns not issued", "turns_not_issued", "n"),
                   ("completion mean", "program_completion_mean_s", "s"),
                   ("completion p90", "program_completion_p90_s", "s"),
                   *((f"TTFT turn {lab}", f"ttft_turn_{lab}_mean_ms", "ms") for lab in DEPTH_LABELS),
                   ("prefix hit", "prefix_hit_rate", "pct"), ("wait mean", "queue_wait_mean_s", "s"),
                   ("wait p99", "queue_wait_p99_s", "s"), ("wait max", "queue_wait_max_s", "s"),
                   ("Jain (waits)", "jain_index", "x"))


def table(per_policy) -> str:
    def fmt(x, kind):
        if x is None or (isinstance(x, float) and not math.isfinite(x)):
            return "–"
        return {"s": f"{x:.1f} s", "ms": f"{x:.0f}", "pct": f"{100 * x:.1f}%", "x": f"{x:.3f}"}.get(kind, str(x))

    rows = ["| policy | " + " | ".join(c[0] for c in AGENTIC_COLUMNS) + " |", "|---|" + "---|" * len(AGENTIC_COLUMNS)]
    for pol, m in per_policy.items():
        rows.append(f"| {pol} | " + " | ".join(fmt(m.get(k), kind) for _, k, kind in AGENTIC_COLUMNS) + " |")
    return "\n".join(rows)


#: the seeds report's program columns: (title, metric key, unit)
SEED_PROGRAM_COLUMNS = (("completion mean", "program_completion_mean_s", "s"),
                        ("completion p90", "program_completion_p90_s", "s"), ("failed", "programs_failed", "n"),
                        ("wait p99", "queue_wait_p99_s", "s"), ("wait max", "queue_wait_max_s", "s"),
                        ("Jain (waits)", "jain_index", "x"), ("prefix hit", "prefix_hit_rate", "pct"))


def acceptance(per_policy: dict, first_seed: int = 0, base: str = "fcfs") -> list[str]:
    """The agentic targets' checks per seed for one load: ``{policy: [metrics per seed]}`` with
    ``<router>+fcfs``, ``+turn-priority`` and ``+las`` of the same router. Turn-priority's
    reduction of mean program completion time against FCFS (``1 - TP/FCFS``), its longest
    queue wait against FCFS's p99 wait, and LAS's Jain's index minus FCFS's."""
    out = []
    for pol, runs in per_policy.items():
        router, _, ordering = pol.partition("+")
        if ordering != base:
            continue
        tp, las = per_policy.get(f"{router}+turn-priority"), per_policy.get(f"{router}+las")
        for k, f in enumerate(runs):
            parts = [f"{router} seed {first_seed + k}: FCFS completion {f['program_completion_mean_s']:.1f} s"]
            if tp:
                t = tp[k]
                ct, ct0 = t["program_completion_mean_s"], f["program_completion_mean_s"]
                mx, p99 = t["queue_wait_max_s"], f["queue_wait_p99_s"]
                parts.append(f"turn-priority {ct:.1f} s (reduction {100 * (1 - ct / ct0):+.1f}%), "
                             f"max wait {mx:.1f} s = {mx / p99:.2f}x FCFS p99 {p99:.1f} s")
            if las:
                parts.append(f"Jain FCFS {f['jain_index']:.3f} LAS {las[k]['jain_index']:.3f} "
                             f"({las[k]['jain_index'] - f['jain_index']:+.3f})")
            out.append("; ".join(parts))
    return out


def append_section(report, results: dict) -> None:
    """Append the programs' section (:func:`table` per load) to the report file ``report``."""
    with open(report, "a") as f:
        f.write("\n## Programs\n\nProgram completion = last turn's end - program arrival (completed "
                "programs); TTFT by turn depth includes the queue wait; wait = arrival -> dispatch; "
                "Jain's index over per-program mean waits. SLO attainment is over every turn of "
                "every program: a failed program's turns that never arrived (turns not issued) are "
                "misses.\n")
        for label, per in results.items():
            f.write(f"\n### Load {label}\n\n{table(per)}\n")
