"""``simulate --seeds N``: the same scenario, loads and policies with seeds S..S+N-1 (each
seed draws its own trace dequantisation, SLO classes, adapters and router randomness);
every metric as mean ± sample standard deviation over the seeds."""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

from . import bench
from .report import _clean

#: (column title, metric key, unit) of the seeds table
SEED_COLUMNS = (("SLO att.", "slo_attainment", "pct"), ("TTFT p50", "ttft_p50_ms", "ms"),
                ("TTFT p90", "ttft_p90_ms", "ms"), ("TPOT p90", "tpot_p90_ms", "ms"),
                ("goodput rps", "goodput_rps", "rps"), ("adapter loads", "adapter_loads", "n"))


def run_seeds(scenario, loads, policies, opts: bench.RunOptions, n_seeds: int, bar, workers: int = 1) -> dict:
    """{load label: {policy: [metrics per seed]}}; each seed's runs in ``workers`` processes."""
    from .parallel import run_sweep

    out: dict = {label: {p: [] for p in policies} for label, _ in loads}
    for k in range(n_seeds):
        o = dataclasses.replace(opts, seed=opts.seed + k)
        arrivals, capacity = bench.prepare(scenario, o)
        for (label, pol), run in run_sweep(scenario, arrivals, capacity, loads, policies, o, workers, bar).items():
            out[label][pol].append(run[0])
    return out


def aggregate(per_seed: dict) -> dict:
    """{load: {policy: {key: {"mean", "std", "n"}}}} over the numeric metrics."""
    agg: dict = {}
    for label, per in per_seed.items():
        agg[label] = {}
        for pol, runs in per.items():
            keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            stats = {}
            for k in keys:
                xs = [r[k] for r in runs if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])]
                if xs:
                    stats[k] = {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                                "n": len(xs)}
            agg[label][pol] = stats
    return agg


def _fmt(s: dict | None, unit: str) -> str:
    if not s:
        return "–"
    m, sd = s["mean"], s["std"]
    if unit == "pct":
        return f"{100 * m:.1f} ± {100 * sd:.1f}%"
    if unit == "ms":
        return f"{m / 1000:.2f} ± {sd / 1000:.2f} s" if m >= 10_000 else f"{m:.0f} ± {sd:.0f}"
    if unit == "rps":
        return f"{m:.2f} ± {sd:.2f}"
    if unit == "s":
        return f"{m:.1f} ± {sd:.1f} s"
    if unit == "x":
        return f"{m:.3f} ± {sd:.3f}"
    return f"{m:.0f} ± {sd:.0f}"


def table(per_policy: dict, columns: tuple = SEED_COLUMNS) -> str:
    rows = ["| policy | " + " | ".join(c[0] for c in columns) + " |", "|---|" + "---|" * len(columns)]
    for pol, stats in per_policy.items():
        rows.append(f"| {pol} | " + " | ".join(_fmt(stats.get(k), u) for _, k, u in columns) + " |")
    return "\n".join(rows)


def report(scenario_name: str, first_seed: int, n_seeds: int, agg: dict, note: str | None = None,
           per_seed: dict | None = None) -> str:
    """The seeds table per load; for a program scenario also the program table and, from
    ``per_seed``, the agentic acceptance checks per seed."""
    from .agentic import SEED_PROGRAM_COLUMNS, acceptance

    seeds = f"seeds {first_seed}..{first_seed + n_seeds - 1}"
    parts = [f"# `{scenario_name}`: mean ± std over {seeds}"] + ([f"\n{note}"] if note else [])
    for label, per in agg.items():
        parts.append(f"\nload {label}\n" + table(per))
        if any("program_completion_mean_s" in st for st in per.values()):
            parts.append("\nprograms\n" + table(per, SEED_PROGRAM_COLUMNS))
            checks = acceptance((per_seed or {}).get(label, {}), first_seed)
            if checks:
                parts.append("\n" + "\n".join(f"- {c}" for c in checks))
    return "\n".join(parts) + "\n"


def write(out: Path, scenario_name: str, first_seed: int, n_seeds: int, per_seed: dict, agg: dict,
          note: str | None = None, flow_params: dict | None = None) -> None:
    """results.json and report.md; ``note``: the native-load line; ``flow_params``: the
    program-aware-fairness parameters given for the run (recorded in both files)."""
    from .flowsim import params_note

    out.mkdir(parents=True, exist_ok=True)
    doc = {"scenario": scenario_name, "seeds": list(range(first_seed, first_seed + n_seeds)),
           "aggregate": agg, "per_seed": per_seed, **({"native_load": note} if note else {}),
           **({"flow_params": flow_params} if flow_params else {})}
    (out / "results.json").write_text(json.dumps(_clean(doc), indent=1))
    text = "\n".join(x for x in (note, params_note(flow_params)) if x) or None
    (out / "report.md").write_text(report(scenario_name, first_seed, n_seeds, agg, text, per_seed))
