"""``python -m load.sim_realism DIR --preset NAME [--json FILE]``: the per-QPS table of
measured against simulated TTFT/TPOT with PASS/FAIL per criterion (docs/evaluation.md)."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from load.sim.presets_70b import DEFAULT_GPU_MEMORY_UTILIZATION, PRESETS_70B, get_70b_preset

from . import compare as C
from .fit import fit_continued, fit_latency, fit_prefill_scale, fit_step_floor, fit_timeout
from .lost import fill_lost
from .replay import policy_for, replay
from .runs import STATS, Run, RunsError, load_folder, measured


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m load.sim_realism", description=__doc__)
    ap.add_argument("dir", type=Path, help="folder with one subfolder per stack of LMBench_<workload>_<QPS>.csv[.gz]")
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS_70B), help="server preset")
    ap.add_argument("--replicas", type=int, default=2, help="model servers per stack (default 2)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION,
                    help=f"vLLM's memory budget, sets the KV capacity (default {DEFAULT_GPU_MEMORY_UTILIZATION})")
    ap.add_argument("--workload", action="append", default=[], help="only this workload (repeatable)")
    ap.add_argument("--qps", default="", help="only these QPS levels, comma-separated (the lowest is the fit run)")
    ap.add_argument("--limit", type=int, default=0, help="first N requests of every run (a quick sample)")
    ap.add_argument("--policy", action="append", default=[], metavar="STACK=POLICY",
                    help="simulator policy for a stack folder (default: random, llmd-default for llm-d*)")
    ap.add_argument("--continued", type=float, default=None,
                    help="share of prompts continuing an earlier one (default: fitted per stack)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write the table and verdicts as JSON")
    a = ap.parse_args(argv)
    if a.replicas < 1:
        ap.error("--replicas must be >= 1")
    if a.limit < 0:
        ap.error("--limit must be >= 0")
    if a.continued is not None and not 0 <= a.continued <= 1:
        ap.error("--continued must be in [0, 1]")
    if not 0 < a.gpu_memory_utilization <= 1:
        ap.error("--gpu-memory-utilization must be in (0, 1]")
    try:
        a.qps_list = tuple(float(q) for q in a.qps.split(",") if q.strip())
    except ValueError:
        ap.error(f"--qps: not a comma-separated list of numbers: {a.qps!r}")
    a.policies = {}
    for item in a.policy:
        stack, sep, pol = item.partition("=")
        if not sep or not stack or not pol:
            ap.error(f"--policy: expected STACK=POLICY, got {item!r}")
        a.policies[stack] = pol
    return a


def _limited(run: Run, limit: int) -> Run:
    """The first ``limit`` recorded rows and the lost requests sent before the last of them."""
    if not limit or len(run.rows) <= limit:
        return run
    rows = run.rows[:limit]
    lost = tuple(r for r in run.lost if r.arrival_s < rows[-1].arrival_s)
    return Run(run.stack, run.workload, run.qps, run.path, rows, run.t0, lost)


def evaluate(a: argparse.Namespace) -> dict:
    spec = get_70b_preset(a.preset, a.gpu_memory_utilization)
    runs = load_folder(a.dir, tuple(a.workload), a.qps_list)
    pool = load_folder(a.dir, tuple(a.workload)) if a.qps_list else ()
    runs = [_limited(r, a.limit) for r in fill_lost(runs, pool)]
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.stack, r.workload), []).append(r)
    series = []
    for (stack, wl), rs in sorted(groups.items()):
        policy = policy_for(stack, a.policies)
        timeout = fit_timeout(rs[0])
        fitted = fit_step_floor(rs[0], spec, a.replicas, policy, a.seed, timeout)
        fit: dict = {"fitted_on_qps": rs[0].qps, "timeout_s": timeout}
        if a.continued is None:
            share, target, got, low = fit_continued(rs[0], fitted, a.replicas, policy, a.seed, timeout)
            fit.update(continued=share, measured_fast_share=target, simulated_fast_share=got)
        else:
            low = replay(rs[0], fitted, a.replicas, policy, a.continued, a.seed, timeout)
            fit.update(continued=a.continued, given=True)
        fitted, fit["prefill_scale"], low = fit_prefill_scale(rs[0], fitted, a.replicas, policy, fit["continued"], low,
                                                              a.seed, timeout)
        fit["c_fix_ms"] = fitted.c_fix
        fit["latency_s"] = fit_latency(rs[0], low)
        pts = []
        for r in rs:
            rp = replay(r, fitted, a.replicas, policy, fit["continued"], a.seed, timeout, fit["latency_s"])
            pts.append(C.Point(r.qps, len(r.rows), measured(r), rp.stats, rp.completed, rp.preemptions,
                               lost=len(r.lost)))
        s = C.Series(stack, wl, policy, pts, fit)
        C.judge(s)
        series.append(s)
    gap_rows = C.gaps(series)
    return {
        "preset": spec.name, "replicas": a.replicas, "gpu_memory_utilization": a.gpu_memory_utilization,
        "kv_capacity_tokens": spec.kv_capacity_tokens, "seed": a.seed, "limit": a.limit,
        "bands": {"median": C.MEDIAN_BAND, "tail": C.TAIL_BAND, "saturation_jump": C.JUMP, "gap_tie": C.TIE},
        "series": [{"stack": s.stack, "workload": s.workload, "policy": s.policy, "fit": s.fit,
                    "saturation": s.saturation,
                    "points": [{"qps": p.qps, "rows": p.rows, "lost": p.lost, "completed": p.completed,
                                "preemptions": p.preemptions,
                                "measured": p.measured, "simulated": p.simulated,
                                "ratio": {k: p.ratio(k) for k in STATS}, "verdict": p.verdict}
                               for p in s.points]} for s in series],
        "gaps": gap_rows,
        "summary": C.summary(series, gap_rows),
    }


def _fmt(v: float) -> str:
    return "nan" if not math.isfinite(v) else f"{v:.3g}"


def _qps(v: float | None) -> str:
    return "none" if v is None else f"{v:g}"


def render(res: dict) -> str:
    lines = [f"preset {res['preset']} x{res['replicas']} (KV {res['kv_capacity_tokens']:,} tokens per server), "
             f"seed {res['seed']}; cells: measured / simulated verdict (TTFT s, TPOT ms)"]
    for s in res["series"]:
        f = s["fit"]
        how = ("given" if f.get("given") else
               f"fitted on {f['fitted_on_qps']:g} QPS: fast-TTFT share {f['measured_fast_share']:.2f} measured, "
               f"{f['simulated_fast_share']:.2f} simulated")
        sat = s["saturation"]
        timeout = "no timeout" if f["timeout_s"] is None else f"timeout {f['timeout_s']:g} s"
        lines += ["", f"## {s['stack']} / {s['workload']} (policy {s['policy']}; continued prompts "
                      f"{f['continued']:.2f}, {how}; {timeout}, latency outside the engine "
                      f"{f['latency_s'] * 1000:.1f} ms, step floor c_fix {f['c_fix_ms']:.2f} ms, prefill cost "
                      f"x{f['prefill_scale']:.3f})",
                  "| QPS | rows (sim) | " + " | ".join(STATS) + " |", "|---" * (len(STATS) + 2) + "|"]
        for p in s["points"]:
            cells = [f"{_fmt(p['measured'][k])} / {_fmt(p['simulated'][k])} {p['verdict'][k]}" for k in STATS]
            lines.append(f"| {p['qps']:g} | {p['rows']} ({p['completed']}) | " + " | ".join(cells) + " |")
        lines.append(f"saturation (TTFT p90 > {res['bands']['saturation_jump']:g}x lowest): measured "
                     f"{_qps(sat['measured_qps'])}, simulated {_qps(sat['simulated_qps'])} {sat['verdict']}")
    if res["gaps"]:
        lines += ["", "## gap between stacks (second - first)", "| workload | QPS | stat | measured | simulated | |",
                  "|---|---|---|---|---|---|"]
        for g in res["gaps"]:
            lines.append(f"| {g['workload']} | {g['qps']:g} | {g['stat']} | {_fmt(g['measured_gap'])} | "
                         f"{_fmt(g['simulated_gap'])} | {g['verdict']} |")
    counts = (f"{k} {v['PASS']} PASS / {v['FAIL']} FAIL" for k, v in res["summary"].items())
    lines += ["", "summary: " + ", ".join(counts)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    try:
        res = evaluate(a)
    except (RunsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(res))
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1, allow_nan=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
