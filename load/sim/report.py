"""Per-run metrics, ``results.json``, ``report.md`` and plots."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .engine import SimResult

KEYS = ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "e2e_p50_ms",
        "e2e_p90_ms", "slo_attainment", "goodput_rps", "throughput_rps", "prefix_hit_rate", "imbalance", "shed")


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if x.size else float("nan")


def summarize(res: SimResult, n_servers: int) -> tuple[dict, dict]:
    """(metrics dict with KEYS and a few extras, raw latency arrays for plots)."""
    reqs = res.requests
    done = [r for r in reqs if r.done and not r.shed]
    ttft = np.array([r.ttft_ms for r in done])
    tpot = np.array([r.tpot_ms for r in done if r.output_len > 1])
    e2e = np.array([r.e2e_ms for r in done])
    met = sum(1 for r in done if r.meets_slo())
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
        "e2e_p50_ms": _pct(e2e, 50), "e2e_p90_ms": _pct(e2e, 90),
        "slo_attainment": met / len(reqs) if reqs else float("nan"),
        "goodput_rps": met / span, "throughput_rps": len(done) / span,
        "prefix_hit_rate": res.hit_tokens / res.prompt_tokens if res.prompt_tokens else 0.0,
        "imbalance": max(work) / mean_work if mean_work > 0 else 1.0,
        "shed": shed,
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
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if kind == "ms":
        return f"{x / 1000:.2f} s" if x >= 10_000 else f"{x:.0f}"
    if kind == "pct":
        return f"{100 * x:.1f}%"
    if kind == "rps":
        return f"{x:.2f}"
    if kind == "x":
        return f"{x:.2f}"
    return str(x)


COLUMNS = (("TTFT p50", "ttft_p50_ms", "ms"), ("TTFT p90", "ttft_p90_ms", "ms"), ("TTFT p99", "ttft_p99_ms", "ms"),
           ("TPOT p50", "tpot_p50_ms", "ms"), ("TPOT p90", "tpot_p90_ms", "ms"), ("TPOT p99", "tpot_p99_ms", "ms"),
           ("E2E p50", "e2e_p50_ms", "ms"), ("E2E p90", "e2e_p90_ms", "ms"), ("SLO att.", "slo_attainment", "pct"),
           ("goodput rps", "goodput_rps", "rps"), ("thrpt rps", "throughput_rps", "rps"),
           ("prefix hit", "prefix_hit_rate", "pct"), ("imbalance", "imbalance", "x"), ("shed", "shed", "n"))


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
             f"- Cluster: {scenario.cluster_desc()}; metrics scraped every {scenario.scrape_interval_s * 1000:g} ms"
             f" (+{scenario.scrape_delay_s * 1000:g} ms delay).",
             f"- Requests per run: {meta.get('requests')}; capacity (load 1.0) = {meta.get('capacity_rps', 0):.3f} "
             "requests/s: GPU-time saturation without prefix reuse (analytic, `workloads.capacity_rps`).",
             "- SLOs: " + "; ".join(meta.get("slo", [])) + ". SLO attainment = share of all arrivals meeting both "
             "(shed requests count as misses); goodput/throughput = requests per second from the first arrival "
             "to the last completion; prefix hit = cached share of prompt tokens at admission; imbalance = max/mean "
             "over servers of tokens computed (uncached prompt + output); latencies in ms unless marked s.",
             ""]
    for load, per_policy in results.items():
        lines += [f"## Load {load} ({float(load) * 100:g}% of capacity)", "", table(per_policy), ""]
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


def write_plots(out: Path, results: Mapping, raw: Mapping) -> list[str]:
    """Latency vs load, SLO attainment/goodput vs load, TTFT/TPOT CDFs per load."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    loads = list(results)
    policies = list(dict.fromkeys(p for per in results.values() for p in per))
    x = [float(l) for l in loads]

    def series(pol, key):
        return [results[l].get(pol, {}).get(key, float("nan")) for l in loads]

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (key, title) in zip(axes, (("ttft_p90_ms", "TTFT p90 (ms)"), ("tpot_p90_ms", "TPOT p90 (ms)"),
                                       ("e2e_p90_ms", "E2E p90 (ms)"))):
        for pol in policies:
            ax.plot(x, series(pol, key), marker="o", label=pol)
        ax.set_yscale("log")
        ax.set_xlabel("load (fraction of capacity)")
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "latency_vs_load.png", dpi=90)
    plt.close(fig)
    files.append("latency_vs_load.png")

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for pol in policies:
        axes[0].plot(x, [100 * v for v in series(pol, "slo_attainment")], marker="o", label=pol)
        axes[1].plot(x, series(pol, "goodput_rps"), marker="o", label=pol)
    axes[0].set_title("SLO attainment (%)")
    axes[1].set_title("goodput (requests/s meeting SLOs)")
    for ax in axes:
        ax.set_xlabel("load (fraction of capacity)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "slo_vs_load.png", dpi=90)
    plt.close(fig)
    files.append("slo_vs_load.png")

    for metric in ("ttft", "tpot"):
        fig, axes = plt.subplots(1, len(loads), figsize=(4.2 * len(loads), 3.8), squeeze=False)
        for ax, load in zip(axes[0], loads):
            for pol in policies:
                a = raw.get((load, pol), {}).get(metric)
                if a is None or not len(a):
                    continue
                s = np.sort(a)
                ax.plot(s, np.arange(1, len(s) + 1) / len(s), label=pol)
            ax.set_xscale("log")
            ax.set_title(f"{metric.upper()} CDF, load {load}")
            ax.set_xlabel("ms")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{metric}_cdf.png", dpi=90)
        plt.close(fig)
        files.append(f"{metric}_cdf.png")
    return files
