"""Markdown report and plots of a real-engine harness run."""
from __future__ import annotations

from pathlib import Path

from load.sim.report import legend_outside


def _f(x, fmt="{:.0f}") -> str:
    return "–" if x is None else fmt.format(x)


def table(summaries: dict) -> str:
    rows = ["| policy | requests (ok) | TTFT p50 / p90 ms | TPOT p50 / p90 ms | SLO attainment | "
            "prefix reuse (engine) | prefix hit (gateway index) | TTFT coverage / pinball ms | "
            "TPOT coverage / pinball ms | requests per endpoint |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for p, s in summaries.items():
        rows.append(
            f"| {p} | {s['requests']} ({s['ok']}) | {_f(s['ttft_p50_ms'])} / {_f(s['ttft_p90_ms'])} | "
            f"{_f(s['tpot_p50_ms'], '{:.1f}')} / {_f(s['tpot_p90_ms'], '{:.1f}')} | "
            f"{_f(s['slo_attainment'], '{:.0%}')} | {_f(s['engine_prefix_hit_rate'], '{:.0%}')} | "
            f"{_f(s['gateway_prefix_hit_rate'], '{:.0%}')} | "
            f"{_f(s['ttft_all_coverage'], '{:.0%}')} / {_f(s['ttft_all_pinball_ms'], '{:.0f}')} | "
            f"{_f(s['tpot_all_coverage'], '{:.0%}')} / {_f(s['tpot_all_pinball_ms'], '{:.1f}')} | "
            f"{' '.join(str(v) for v in sorted(s['per_endpoint'].values(), reverse=True))} |")
    return "\n".join(rows)


def accuracy_table(summaries: dict) -> str:
    rows = ["| policy (phase) | model | TTFT n | TTFT coverage | TTFT pinball ms | TPOT n | TPOT coverage | "
            "TPOT pinball ms |", "|---|---|---|---|---|---|---|---|"]
    for p, s in summaries.items():
        for src in ("prior", "learned"):
            if not (s[f"ttft_{src}_n"] or s[f"tpot_{src}_n"]):
                continue
            rows.append(f"| {p} | {src} | {s[f'ttft_{src}_n']} | {_f(s[f'ttft_{src}_coverage'], '{:.0%}')} | "
                        f"{_f(s[f'ttft_{src}_pinball_ms'])} | {s[f'tpot_{src}_n']} | "
                        f"{_f(s[f'tpot_{src}_coverage'], '{:.0%}')} | {_f(s[f'tpot_{src}_pinball_ms'], '{:.1f}')} |")
    return "\n".join(rows)


def plots(out: Path, summaries: dict, records: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    pols = list(summaries)
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, (key, title) in zip(axes, [("ttft", "TTFT ms"), ("tpot", "TPOT ms")]):
        x = range(len(pols))
        ax.bar([i - 0.2 for i in x], [summaries[p][f"{key}_p50_ms"] or 0 for p in pols], 0.4, label="p50")
        ax.bar([i + 0.2 for i in x], [summaries[p][f"{key}_p90_ms"] or 0 for p in pols], 0.4, label="p90")
        ax.set_xticks(list(x), pols, rotation=15)
        ax.set_title(title)
        ax.legend()
    axes[2].bar(pols, [summaries[p]["slo_attainment"] or 0 for p in pols], color="tab:green")
    axes[2].set_ylim(0, 1)
    axes[2].set_title("SLO attainment")
    axes[2].tick_params(axis="x", rotation=15)
    axes[3].bar(pols, [summaries[p]["engine_prefix_hit_rate"] or 0 for p in pols], color="tab:purple")
    axes[3].set_ylim(0, 1)
    axes[3].set_title("prompt tokens reused (engine)")
    axes[3].tick_params(axis="x", rotation=15)
    fig.tight_layout()
    fig.savefig(out / "policies.png", dpi=90)
    plt.close(fig)
    names.append("policies.png")

    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.4), layout="constrained")
    for ax, tgt in zip(axes, ("ttft", "tpot")):
        hi = 1.0
        for p in pols:
            pts = [(r[f"predicted_{tgt}_ms"], r[f"{tgt}_ms"], r["model_version"].startswith("prior"))
                   for r in records[p] if r["ok"] and r.get(f"{tgt}_ms") is not None
                   and r.get(f"predicted_{tgt}_ms") is not None]
            for prior, marker in ((True, "x"), (False, "o")):
                sel = [(a, b) for a, b, pr in pts if pr == prior]
                if sel:
                    ax.scatter([a for a, _ in sel], [b for _, b in sel], s=12, marker=marker, alpha=0.6,
                               label=f"{p} ({'prior' if prior else 'learned'})")
                    hi = max(hi, max(max(a, b) for a, b in sel))
        ax.plot([0, hi], [0, hi], "k--", lw=0.8)
        ax.set_xlabel(f"predicted p90 {tgt.upper()} ms")
        ax.set_ylabel(f"measured {tgt.upper()} ms")
        ax.set_title(f"{tgt.upper()}: below the diagonal = covered")
    if any(ax.get_legend_handles_labels()[0] for ax in axes):
        legend_outside(fig, *axes)  # beside the panels: it never hides a point
    fig.savefig(out / "predictions.png", dpi=90)
    plt.close(fig)
    names.append("predictions.png")
    return names


def write_report(out: Path, info: dict, records: dict, results: dict) -> Path:
    s = info["summaries"]
    ph = info.get("phases") or s  # in time order
    rounds = info.get("rounds", 1)
    wl, eng = info["workload"], info["engine"]
    imgs = plots(out, s, records)
    lines = [
        "# Real-engine run: llama-server x2 behind the gateway",
        "",
        f"Engine: `llama-server` built from the llama-cpp-python sdist ({Path(eng['binary']).parent.parent.name}), "
        f"model `{eng['model']}`, two servers with {eng['slots']} slots and {eng['threads']} thread each, "
        f"context {eng['ctx']} tokens, restarted (cold caches) before each policy. Workload: "
        f"{wl['conversations']} conversations x {wl['turns']} turns ({wl['requests']} requests) on 3 shared "
        f"system prompts, {wl['concurrency']} concurrent conversations with think times, seed {wl['seed']}; "
        f"SLOs TTFT {wl['ttft_slo_ms']:.0f} ms, TPOT {wl['tpot_slo_ms']:.0f} ms (sent as llm-d SLO headers).",
        "",
        "TTFT/TPOT are measured by the client through the gateway; SLO attainment is the share of all "
        "requests meeting both SLOs. Prefix reuse (engine) is llama-server's own `timings.cache_n` over "
        "all prompt tokens; prefix hit (gateway index) is the approximate index's block match for the "
        "chosen endpoint. Coverage is the share of requests whose measured value (at the gateway, "
        "from dispatch) is at most the p90 prediction made for the chosen endpoint; pinball is the "
        "quantile-0.9 loss. Endpoint metrics come from llama-server's Prometheus text: "
        "`llamacpp:requests_deferred` (waiting) and `llamacpp:requests_processing` (running); this build "
        "exposes no KV-cache usage gauge, so `kv_cache_percentage` is 0 in every row and the KV scorer "
        "ties.",
        "",
        (f"Each policy ran {rounds} times, in alternating order (ABC, CBA, ...); the table pools its rounds, "
         "the next one lists every phase in time order." if rounds > 1 else ""),
        "",
        table(s),
        "",
        *(["## Every phase, in time order", "", table(ph), ""] if rounds > 1 else []),
        "## Prediction accuracy by phase and model (prior = built-in prior before any learned bundle)",
        "",
        accuracy_table(ph),
        "",
        "Model versions that predicted, per phase: " + "; ".join(
            f"{p}: {', '.join(v['model_versions']) or '–'}" for p, v in ph.items()),
        "",
        "Training server at the end of each phase (stored rows; rows per target; served model): " + "; ".join(
            f"{p}: {v['data_status'].get('stored_rows')}; {v['data_status'].get('rows_with_target')}; "
            f"{v['data_status'].get('served_version')} ({v['data_status'].get('model_source')})"
            for p, v in ph.items() if isinstance(v.get('data_status'), dict)),
        "",
        "Engine speed over each phase (llama-server counters; prefill tokens/s, decode ms/token, per "
        "engine) and the machine's 1-minute load average before/after the phase (2 cores, shared with "
        "the gateway, the prediction and training servers, and anything else running): " + "; ".join(
            f"{p}: " + ", ".join(f"{_f(e.get('prefill_tok_per_s'))} tok/s, {_f(e.get('decode_ms_per_token'))} ms/tok"
                                 for e in v.get("engine_speed", [])) + f", load {v.get('loadavg_1m')}"
            for p, v in ph.items()),
        "",
        *[f"![{i}]({i})" for i in imgs],
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
