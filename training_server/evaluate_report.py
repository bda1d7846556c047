"""Output of ``latency-predictor evaluate``: the table (with the §1 verdict per row) and plots."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def write_plots(name: str, target: str, res: dict, quantile: float, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    pred, actual = res["_pred"], res["_actual"]
    paths = []
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(pred, actual, s=4, alpha=0.4)
    hi = float(max(pred.max(), actual.max()))
    lo = float(max(min(pred.min(), actual.min()), 1e-3))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="actual = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"predicted p{quantile * 100:g} {target} (ms)")
    ax.set_ylabel(f"actual {target} (ms)")
    ax.set_title(f"{name} {target}: coverage {res['coverage']:.1f}%")
    ax.legend(loc="upper left")
    paths.append(_save(fig, out_dir / f"{name}-{target}-calibration.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    edges = np.unique(np.quantile(pred, np.linspace(0, 1, 11)))
    idx = np.clip(np.searchsorted(edges, pred, side="right") - 1, 0, max(len(edges) - 2, 0))
    xs, cov = [], []
    for b in range(max(len(edges) - 1, 1)):
        m = idx == b
        if m.any():
            xs.append(float(np.median(pred[m])))
            cov.append(float(np.mean(actual[m] <= pred[m]) * 100.0))
    ax.plot(range(len(xs)), cov, "o-", label="observed coverage")
    ax.axhline(quantile * 100.0, color="k", ls="--", lw=1, label=f"target {quantile * 100:g}%")
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels([f"{x:.3g}" for x in xs], rotation=45, fontsize=7)
    ax.set_xlabel(f"predicted {target} decile (median, ms)")
    ax.set_ylabel("coverage (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"{name} {target}: reliability by predicted decile")
    ax.legend(loc="lower right")
    paths.append(_save(fig, out_dir / f"{name}-{target}-reliability.png"))
    return paths


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


#: docs/evaluation.md §1 targets: coverage within this many points of the quantile, and pinball at
#: most this share of the better baseline's
COVERAGE_BAND = 3.0
PINBALL_RATIO = 0.8


def target_met(r: dict, quantile: float) -> tuple[float, bool]:
    """(our pinball / the better baseline's, whether the §1 target is met) for one result row."""
    best = min((b["pinball"] for b in (r.get("baselines") or {}).values()
                if b.get("pinball") is not None and np.isfinite(b["pinball"])), default=float("nan"))
    ratio = r["pinball"] / best if best and np.isfinite(best) else float("nan")
    ok = abs(r["coverage"] - quantile * 100.0) <= COVERAGE_BAND and bool(ratio <= PINBALL_RATIO)
    return ratio, ok


def format_table(results: dict[str, dict], quantile: float, protocol: str = "forward") -> str:
    lines = [f"{'trace':<20} {'target':<6} {'n':>6} {'pinball':>16} {'cov':>6} {'upstream':>16} "
             f"{'linear':>16} {'ratio':>6} {'§1':>4} {'MAPE':>7}  coverage by regime"]
    for name, per in results.items():
        for t, r in per.items():
            b = r.get("baselines") or {}
            cells = []
            for k in ("upstream", "linear"):
                x = b.get(k) or {}
                cells.append(f"{x.get('pinball', float('nan')):>9.4g} {x.get('coverage', float('nan')):>5.1f}%")
            ratio, ok = target_met(r, quantile)
            n_reg = r.get("n_by_regime", {})
            regs = " ".join(f"{k}={v:.1f}" + (f" ({n_reg[k]})" if k in n_reg else "")
                            for k, v in r["coverage_by_regime"].items())
            lines.append(f"{name:<20} {t:<6} {r['n']:>6} {r['pinball']:>9.4g} ± {r['pinball_std']:<5.3g}"
                         f"{r['coverage']:>5.1f}% {cells[0]} {cells[1]} {ratio:>6.3f} {'met' if ok else 'MISS':>4}"
                         f" {r['mape']:>6.1f}%  {regs}")
    lines.append(f"(protocol {protocol}, quantile {quantile}; pinball in ms, ratio = ours / the better baseline; "
                 f"§1 target: coverage {quantile * 100:g} ± {COVERAGE_BAND:g}%, ratio <= {PINBALL_RATIO:g})")
    return "\n".join(lines)
