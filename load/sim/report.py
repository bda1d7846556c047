"""Per-run metrics, ``results.json``, ``report.md`` and plots."""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .engine import SimResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KEYS = ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "e2e_p50_ms",
        "e2e_p90_ms", "e2e_p99_ms", "slo_attainment", "ttft_miss_share", "tpot_miss_share", "goodput_rps",
        "throughput_rps", "prefix_hit_rate", "imbalance", "shed", "abandoned", "unfinished", "held_p99_ms",
        "preemptions")


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if x.size else float("nan")


def summarize(res: SimResult, n_servers: int) -> tuple[dict, dict]:
    """(metrics dict with KEYS and a few extras, raw latency arrays for plots).

    Attainment is over all arrivals: a shed (429), abandoned (client deadline) or unfinished
    request is a miss. TTFT percentiles cover every request that was not shed: a request
    abandoned before its first token counts with the time its client waited (its deadline
    minus its arrival, a lower bound); TPOT and E2E cover completed requests. Held time =
    arrival to dispatch (flow-control queue, a filter's hold), or to abandonment for a
    request never dispatched."""
    reqs = res.requests
    done = [r for r in reqs if r.done and not r.shed]
    abandoned = [r for r in reqs if r.abandoned]
    ttft = np.array([r.ttft_ms for r in done]
                    + [(r.first_token_t if r.first_token_t >= 0 else r.deadline) * 1000.0 - r.arrival * 1000.0
                       for r in abandoned])
    held = np.array([(r.dispatch_t if r.dispatch_t >= 0 else r.deadline) * 1000.0 - r.arrival * 1000.0
                     for r in reqs if r.dispatch_t >= 0 or r.abandoned])
    tpot = np.array([r.tpot_ms for r in done if r.output_len > 1])
    e2e = np.array([r.e2e_ms for r in done])
    met = sum(1 for r in done if r.meets_slo())
    # which SLO the completed requests missed (a request can miss both)
    ttft_miss = sum(1 for r in done if 0 < r.ttft_slo_ms < r.ttft_ms)
    tpot_miss = sum(1 for r in done if r.output_len > 1 and 0 < r.tpot_slo_ms < r.tpot_ms)
    shed = sum(1 for r in reqs if r.shed)
    t0 = min((r.arrival for r in reqs), default=0.0)
    t_end = max((r.finish_t for r in done), default=t0)
    span = max(1e-9, t_end - t0)
    # token work each server did (uncached prompt + output tokens): max / mean
    work = [0.0] * n_servers
    for r in done:
        work[r.server] += r.input_len - max(0, r.hit_tokens) + r.output_len
    mean_work = sum(work) / n_servers
    m = {
        "ttft_p50_ms": _pct(ttft, 50), "ttft_p90_ms": _pct(ttft, 90), "ttft_p99_ms": _pct(ttft, 99),
        "tpot_p50_ms": _pct(tpot, 50), "tpot_p90_ms": _pct(tpot, 90), "tpot_p99_ms": _pct(tpot, 99),
        "e2e_p50_ms": _pct(e2e, 50), "e2e_p90_ms": _pct(e2e, 90), "e2e_p99_ms": _pct(e2e, 99),
        "slo_attainment": met / len(reqs) if reqs else float("nan"),
        "goodput_rps": met / span, "throughput_rps": len(done) / span,
        "prefix_hit_rate": res.hit_tokens / res.prompt_tokens if res.prompt_tokens else 0.0,
        "imbalance": max(work) / mean_work if mean_work > 0 else 1.0,
        "shed": shed, "abandoned": len(abandoned),
        "unfinished": sum(1 for r in reqs if not r.done and not r.shed and not r.abandoned),
        "held_p99_ms": _pct(held, 99),
        "ttft_miss_share": ttft_miss / len(reqs) if reqs else float("nan"),
        "tpot_miss_share": tpot_miss / len(reqs) if reqs else float("nan"),
        "requests": len(reqs), "completed": len(done), "preemptions": res.preemptions, "steps": res.steps,
        "sim_duration_s": res.duration_s,
    }
    m.update(res.extra)
    return m, {"ttft": ttft, "tpot": tpot, "e2e": e2e}


def _clean(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def write_results(out: Path, scenario: str, seed: int, results: Mapping, meta: Mapping) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    p = out / "results.json"
    p.write_text(json.dumps(_clean({"scenario": scenario, "seed": seed, "results": results, "meta": meta}),
                            indent=1, sort_keys=False))
    return p


def _fmt(x, kind: str) -> str:
    """One format per column kind; latencies are stored in ms and shown in the header's unit."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if kind == "s":  # ms -> seconds, to the millisecond
        return f"{x / 1000:.3f}"
    if kind == "ms":
        return f"{x:.1f}"
    if kind == "pct":
        return f"{100 * x:.1f}%"
    if kind in ("rps", "x"):
        return f"{x:.2f}"
    return str(x)


# (header, metric key, format): every latency column has one unit, named in its header
COLUMNS = (("TTFT p50 (s)", "ttft_p50_ms", "s"), ("TTFT p90 (s)", "ttft_p90_ms", "s"),
           ("TTFT p99 (s)", "ttft_p99_ms", "s"),
           ("TPOT p50 (ms)", "tpot_p50_ms", "ms"), ("TPOT p90 (ms)", "tpot_p90_ms", "ms"),
           ("TPOT p99 (ms)", "tpot_p99_ms", "ms"),
           ("E2E p50 (s)", "e2e_p50_ms", "s"), ("E2E p90 (s)", "e2e_p90_ms", "s"), ("E2E p99 (s)", "e2e_p99_ms", "s"),
           ("SLO att.", "slo_attainment", "pct"), ("missed TTFT", "ttft_miss_share", "pct"),
           ("missed TPOT", "tpot_miss_share", "pct"),
           ("goodput rps", "goodput_rps", "rps"), ("thrpt rps", "throughput_rps", "rps"),
           ("prefix hit", "prefix_hit_rate", "pct"), ("imbalance", "imbalance", "x"), ("shed", "shed", "n"),
           ("abandoned", "abandoned", "n"), ("unfinished", "unfinished", "n"), ("held p99 (s)", "held_p99_ms", "s"),
           ("preempt.", "preemptions", "n"))


def table(per_policy: Mapping[str, Mapping]) -> str:
    head = "| policy | " + " | ".join(c[0] for c in COLUMNS) + " |"
    sep = "|---|" + "---|" * len(COLUMNS)
    rows = [head, sep]
    for pol, m in per_policy.items():
        rows.append(f"| {pol} | " + " | ".join(_fmt(m.get(k), kind) for _, k, kind in COLUMNS) + " |")
    return "\n".join(rows)


def write_report(out: Path, scenario, seed: int, results: Mapping, meta: Mapping, plots: Sequence[str]) -> Path:
    lines = [f"# Simulated routing benchmark: `{scenario.name}` (seed {seed})", "",
             f"- Workload: {scenario.description}.",
             f"- Cluster: {scenario.cluster_desc()}; "
             + (meta["realism"] if meta.get("realism") else
                f"idealised world (--ideal): metrics of all servers scraped every "
                f"{scenario.scrape_interval_s * 1000:g} ms (+{scenario.scrape_delay_s * 1000:g} ms delay), exact "
                "step times and prompt lengths, no client deadline, free drain") + ".",
             f"- Requests per run: {meta.get('requests')}; capacity (load 1.0) = {meta.get('capacity_rps', 0):.3f} "
             "requests/s: GPU-time saturation without prefix reuse (analytic, `workloads.capacity_rps`).",
             "- SLOs: " + "; ".join(meta.get("slo", [])) + ". SLO attainment = share of all arrivals meeting both "
             "(shed (429), abandoned (client deadline) and unfinished requests count as misses); TTFT percentiles "
             "include abandoned requests (one abandoned before its first token at its deadline), TPOT and E2E cover "
             "completed ones; held = arrival to dispatch; missed TTFT/TPOT = share of all arrivals that completed "
             "over that SLO (a request can miss both); goodput/throughput = requests per second from the first arrival "
             "to the last completion; prefix hit = cached share of prompt tokens at admission; imbalance = max/mean "
             "over servers of tokens computed (uncached prompt + output); each latency column states its unit "
             "(TTFT and E2E in seconds, TPOT in milliseconds).",
             *([f"- {meta['native_load']}."] if meta.get("native_load") else []),
             ""]
    for load, per_policy in results.items():
        share = meta.get("load_share", {}).get(load, None)
        share = float(load) if share is None else share
        lines += [f"## Load {load} ({share * 100:.3g}% of capacity)", "", table(per_policy), ""]
    if meta.get("policy_notes"):
        lines += ["## Policies", ""] + [f"- `{k}`: {v}" for k, v in meta["policy_notes"].items()] + [""]
    if meta.get("wall_s"):
        lines += ["## Run time (this machine; CPU = this process's CPU time)", "",
                  "| load | policy | wall s | CPU s |", "|---|---|---|---|"]
        for (load, pol), (w, c) in meta["wall_s"].items():
            lines.append(f"| {load} | {pol} | {w:.1f} | {c:.1f} |")
        lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    p = out / "report.md"
    p.write_text("\n".join(lines))
    return p


def write_plots(out: Path, results: Mapping, raw: Mapping, shares: Mapping | None = None) -> list[str]:
    """Latency vs load, SLO attainment/goodput vs load, TTFT/TPOT CDFs per load (PNG files)."""
    files = []
    for name, fig in figures(results, raw, shares):
        fig.savefig(out / name, dpi=90)
        files.append(name)
    return files


def _log_axis(ax, which: str) -> None:
    """Log scale labelled with plain numbers at 1-2-5 steps (decades only over a wide range,
    every integer step over a narrow one); minor ticks unlabelled, so labels never crowd."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    decades = math.log10(hi / lo) if lo > 0 else math.inf
    subs = (1.0,) if decades > 2.5 else (1.0, 2.0, 5.0) if decades > 0.6 else (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(LogLocator(base=10.0, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_locator(LogLocator(base=10.0, subs="auto"))
    axis.set_minor_formatter(NullFormatter())


def legend_outside(fig, *axes) -> None:
    """One legend for the figure (the labels of ``axes``), right of the panels, so it never
    hides a point. The figure needs ``layout="constrained"``."""
    entries: dict = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    fig.legend(list(entries.values()), list(entries), loc="outside right upper", fontsize=7)


def figures(results: Mapping, raw: Mapping, shares: Mapping | None = None) -> list[tuple[str, Figure]]:
    """The report's figures (file name, matplotlib Figure), built without pyplot's global
    state; TTFT and E2E in seconds, TPOT in milliseconds, like the tables. ``shares`` maps
    a load label that is not a number (``native``) to its fraction of capacity."""
    from matplotlib.figure import Figure

    out = []
    loads = list(results)
    policies = list(dict.fromkeys(p for per in results.values() for p in per))
    x = [(shares or {}).get(lab) or float(lab) for lab in loads]
    scale = {"ttft": 1000.0, "tpot": 1.0, "e2e": 1000.0}
    unit = {"ttft": "s", "tpot": "ms", "e2e": "s"}

    def series(pol, key, div=1.0):
        return [results[lab].get(pol, {}).get(key, float("nan")) / div for lab in loads]

    fig = Figure(figsize=(16, 4.2), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, metric in zip(axes, ("ttft", "tpot", "e2e")):
        for pol in policies:
            ax.plot(x, series(pol, f"{metric}_p90_ms", scale[metric]), marker="o", label=pol)
        _log_axis(ax, "y")
        ax.set_xlabel("load (fraction of capacity)")
        ax.set_title(f"{metric.upper()} p90 ({unit[metric]})")
    legend_outside(fig, axes[0])
    out.append(("latency_vs_load.png", fig))

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    for pol in policies:
        axes[0].plot(x, [100 * v for v in series(pol, "slo_attainment")], marker="o", label=pol)
        axes[1].plot(x, series(pol, "goodput_rps"), marker="o", label=pol)
    axes[0].set_title("SLO attainment (%)")
    axes[1].set_title("goodput (requests/s meeting SLOs)")
    for ax in axes:
        ax.set_xlabel("load (fraction of capacity)")
    legend_outside(fig, axes[0])
    out.append(("slo_vs_load.png", fig))

    for metric in ("ttft", "tpot"):
        fig = Figure(figsize=(4.2 * len(loads) + 1.5, 3.8), layout="constrained")
        axes = fig.subplots(1, len(loads), squeeze=False)
        for ax, load in zip(axes[0], loads):
            for pol in policies:
                a = raw.get((load, pol), {}).get(metric)
                if a is None or not len(a):
                    continue
                s = np.sort(np.asarray(a, dtype=float)) / scale[metric]
                ax.plot(s, np.arange(1, len(s) + 1) / len(s), label=pol)
            _log_axis(ax, "x")
            ax.set_title(f"{metric.upper()} CDF, load {load}")
            ax.set_xlabel(f"{metric.upper()} ({unit[metric]})")
        legend_outside(fig, axes[0][0])
        out.append((f"{metric}_cdf.png", fig))
    return out
