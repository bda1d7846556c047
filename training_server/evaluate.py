"""``latency-predictor evaluate``: the offline accuracy protocol of docs/evaluation.md §1.

For each trace (JSONL of training entries in the wire format; a zero target means absent)
and each seed, the rows are split at random 90/10; the 90 goes through the production
training path (the stratified sampling of :mod:`training_server.sampling` with the
server's default cap per bucket, :func:`training_server.trainer.train_models` with the
server's default :class:`TrainConfig` incl. conformal calibration, served through the
same :class:`prediction_server.model.LoadedBundle`), and the 10 is predicted. On the
same splits (the same sampled training rows) the reference recipe of §1 (``recipe=
"upstream"``) is trained and scored. Reported per target, over seeds: pinball loss mean
and std, coverage (share of actuals <= prediction, %), coverage per load regime (pooled
over seeds), MAPE, and the reference's pinball and coverage.

``--json`` prints exactly::

    {"traces": {NAME: {"ttft": {"n", "pinball", "pinball_std", "coverage",
     "coverage_by_regime": {REGIME: %}, "mape", "reference": {"pinball", "coverage"}},
     "tpot": {...}}}}

with NAME the file name without ``.jsonl``; a target absent from a trace is omitted.
``--plots DIR`` writes ``NAME-TARGET-calibration.png`` (predicted vs actual) and
``NAME-TARGET-reliability.png`` (coverage per predicted-value decile) per trace/target.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from features.matrix import REGIME_NAMES, TARGETS, regimes
from features.schema import FieldError, parse_training_entry

from . import sampling, trainer
from .settings import Settings


class TraceError(ValueError):
    """A trace file cannot be read; the message names the file and line."""


@dataclass
class Trace:
    name: str
    raw: np.ndarray    # (n, RAW_COLUMNS)
    ttft: np.ndarray   # 0 = absent
    tpot: np.ndarray
    ts: np.ndarray     # epoch s (0 when the entry has no timestamp)
    predicted_ttft: np.ndarray
    predicted_tpot: np.ndarray

    def target(self, t: str) -> np.ndarray:
        return self.ttft if t == "ttft" else self.tpot

    def __len__(self) -> int:
        return int(self.raw.shape[0])


def read_trace(path: str | Path) -> Trace:
    """Parse a JSONL trace of training entries; TraceError on the first malformed line."""
    from load.data import open_data

    path = Path(path)
    rows, ttft, tpot, ts, pt, pp = [], [], [], [], [], []
    try:
        fh = open_data(path, binary=True)
    except OSError as e:
        raise TraceError(f"{path}: cannot open: {e.strerror or e}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, UnicodeDecodeError) as e:
                raise TraceError(f"{path}:{lineno}: not valid JSON: {e}") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{path}:{lineno}: a training entry must be a JSON object")
            try:
                e = parse_training_entry(obj)
            except FieldError as err:
                raise TraceError(f"{path}:{lineno}: field {'.'.join(map(str, err.loc))}: {err.msg}") from None
            rows.append(e.raw)
            ttft.append(e.actual_ttft_ms)
            tpot.append(e.actual_tpot_ms)
            ts.append(e.timestamp or 0.0)
            pt.append(e.predicted_ttft_ms)
            pp.append(e.predicted_tpot_ms)
    if not rows:
        raise TraceError(f"{path}: no training entries")
    base = path.name[:-3] if path.name.endswith(".gz") else path.name
    name = base[:-6] if base.endswith(".jsonl") else Path(base).stem
    f = lambda v: np.asarray(v, dtype=np.float64)  # noqa: E731
    return Trace(name, np.asarray(rows, dtype=np.float64), f(ttft), f(tpot), f(ts), f(pt), f(pp))


def production_config(quantile: float = 0.9, **overrides: Any) -> trainer.TrainConfig:
    """The TrainConfig the training server builds from its default settings."""
    s = Settings()
    cfg = trainer.TrainConfig(model_type=s.model_type, objective=s.objective_type, quantile=quantile)
    return trainer.with_config(cfg, **overrides) if overrides else cfg


def sample_training_rows(raw: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, ts: np.ndarray,
                         max_per_bucket: int) -> sampling.Split:
    """The server's stratified selection (newest rows per stratum, capped) on a training split.
    Row ids follow the trace order, as the store assigns them on ingestion; nothing is held
    out here (the protocol's 10% is the test set)."""
    ids = np.arange(1, len(raw) + 1, dtype=np.int64)
    sel = sampling.select(ids, raw, ttft, tpot, ts, sampling.strata(raw), max_per_bucket=max_per_bucket,
                          test_ratio=0.0)
    return sel.train


def split(n: int, seed: int, test_share: float = 0.1) -> np.ndarray:
    """Boolean test mask of a random 90/10 split (the same for every recipe)."""
    mask = np.zeros(n, dtype=bool)
    mask[np.random.default_rng(seed).permutation(n)[: int(round(n * test_share))]] = True
    return mask


def evaluate_trace(trace: Trace, *, seeds: int = 10, quantile: float = 0.9,
                   config: trainer.TrainConfig | None = None, reference: bool = True,
                   max_per_bucket: int | None = None, keep_predictions: bool = False) -> dict:
    """Run the §1 protocol on one trace; returns the per-target result (the --json shape).

    With ``keep_predictions`` each target also carries ``"_pred"``/``"_actual"`` arrays pooled
    over seeds (for plots); they are removed before JSON output.
    """
    cfg = config or production_config(quantile)
    ref_cfg = trainer.TrainConfig(model_type="xgboost", objective="quantile", quantile=quantile, recipe="upstream",
                                  calibrate=False)
    cap = max_per_bucket or Settings().max_training_data_size_per_bucket
    acc: dict[str, dict[str, list]] = {t: {"pinball": [], "coverage": [], "mape": [], "ref_pinball": [],
                                           "ref_coverage": [], "hit": [], "regime": [], "pred": [], "actual": []}
                                       for t in TARGETS}
    for seed in range(seeds):
        test = split(len(trace), seed)
        tr = sample_training_rows(trace.raw[~test], trace.ttft[~test], trace.tpot[~test], trace.ts[~test], cap)
        raw_te = trace.raw[test]
        res = trainer.train_models(tr.raw, tr.ttft, tr.tpot, config=trainer.with_config(cfg, seed=seed), ts=tr.ts)
        ours = dict(zip(TARGETS, trainer.loaded_bundle(res).predict(raw_te)))
        ref = None
        if reference:
            rres = trainer.train_models(tr.raw, tr.ttft, tr.tpot, config=trainer.with_config(ref_cfg, seed=seed))
            ref = dict(zip(TARGETS, trainer.loaded_bundle(rres).predict(raw_te)))
        reg = regimes(raw_te)
        for t in TARGETS:
            y = trace.target(t)[test]
            m = y > 0
            if not m.any() or t not in res.models:
                continue
            a = acc[t]
            e = trainer.evaluate_predictions(y[m], ours[t][m], quantile)
            a["pinball"].append(e["pinball"])
            a["coverage"].append(e["coverage"])
            a["mape"].append(e["mape"])
            a["hit"].append(y[m] <= ours[t][m])
            a["regime"].append(reg[m])
            a["pred"].append(ours[t][m])
            a["actual"].append(y[m])
            if ref is not None:
                r = trainer.evaluate_predictions(y[m], ref[t][m], quantile)
                a["ref_pinball"].append(r["pinball"])
                a["ref_coverage"].append(r["coverage"])
    out: dict[str, dict] = {}
    for t in TARGETS:
        a = acc[t]
        if not a["pinball"]:
            continue
        hit, reg = np.concatenate(a["hit"]), np.concatenate(a["regime"])
        res_t: dict[str, Any] = {
            "n": int((trace.target(t) > 0).sum()),
            "pinball": float(np.mean(a["pinball"])),
            "pinball_std": float(np.std(a["pinball"])),
            "coverage": float(np.mean(a["coverage"])),
            "coverage_by_regime": {name: float(hit[reg == i].mean() * 100.0)
                                   for i, name in enumerate(REGIME_NAMES) if (reg == i).any()},
            "mape": float(np.nanmean(a["mape"])),
        }
        if a["ref_pinball"]:
            res_t["reference"] = {"pinball": float(np.mean(a["ref_pinball"])),
                                  "coverage": float(np.mean(a["ref_coverage"]))}
        if keep_predictions:
            res_t["_pred"] = np.concatenate(a["pred"])
            res_t["_actual"] = np.concatenate(a["actual"])
            res_t["_regime_n"] = {name: int((reg == i).sum()) for i, name in enumerate(REGIME_NAMES)}
        out[t] = res_t
    return out


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


def format_table(results: dict[str, dict], quantile: float) -> str:
    lines = [f"{'trace':<24} {'target':<6} {'n':>6} {'pinball':>16} {'ref pinball':>11} {'ratio':>6} "
             f"{'coverage':>9} {'ref cov':>8} {'MAPE':>7}  coverage by regime"]
    for name, per in results.items():
        for t, r in per.items():
            ref = r.get("reference") or {}
            rp = ref.get("pinball", float("nan"))
            ratio = r["pinball"] / rp if rp else float("nan")
            regs = " ".join(f"{k}={v:.1f}" for k, v in r["coverage_by_regime"].items())
            lines.append(f"{name:<24} {t:<6} {r['n']:>6} {r['pinball']:>9.4g} ± {r['pinball_std']:<5.3g}"
                         f"{rp:>11.4g} {ratio:>6.3f} {r['coverage']:>8.1f}% {ref.get('coverage', float('nan')):>7.1f}%"
                         f" {r['mape']:>6.1f}%  {regs}")
    lines.append(f"(quantile {quantile}; targets: coverage {quantile * 100:g} ± 2%, pinball <= 0.9 x reference)")
    return "\n".join(lines)


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """``NAME=VALUE`` strings -> {name: int | float | str}; ValueError names a bad item."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise ValueError(f"--param {item!r}: expected NAME=VALUE")
        for conv in (int, float):
            try:
                out[name] = conv(value)
                break
            except ValueError:
                continue
        else:
            out[name] = value
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="latency-predictor evaluate",
                                description="Accuracy of the production training path vs the reference recipe "
                                            "(docs/evaluation.md §1) on recorded traces of training entries.")
    p.add_argument("traces", nargs="+", metavar="TRACE.jsonl")
    p.add_argument("--seeds", type=int, default=10, help="random 90/10 splits (default 10)")
    p.add_argument("--quantile", type=float, default=0.9)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--plots", metavar="DIR", help="write calibration and reliability PNGs into DIR")
    p.add_argument("--model-type", choices=("xgboost", "lightgbm"), default=None,
                   help="our model type (default: the training server's default)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="override one hyper-parameter of our recipe, in the model library's names "
                        "(e.g. max_depth=6, n_estimators=200); repeatable")
    p.add_argument("--no-monotone", action="store_true",
                   help="train ours without the monotone constraints (an ablation: the price of the "
                        "shape constraints; never what the server serves)")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    if not 0 < args.quantile < 1:
        p.error("--quantile must be in (0, 1)")
    try:
        params = parse_params(args.param)
    except ValueError as e:
        p.error(str(e))
    try:
        traces = [read_trace(t) for t in args.traces]
    except TraceError as e:
        print(f"latency-predictor evaluate: {e}", file=sys.stderr)
        return 2
    overrides: dict[str, Any] = {"model_type": args.model_type} if args.model_type else {}
    if params:
        overrides["params"] = params
    if args.no_monotone:
        overrides["monotone"] = False
    cfg = production_config(args.quantile, **overrides)
    results: dict[str, dict] = {}
    for tr in traces:
        res = evaluate_trace(tr, seeds=args.seeds, quantile=args.quantile, config=cfg,
                             keep_predictions=bool(args.plots))
        if args.plots:
            for t, r in res.items():
                write_plots(tr.name, t, r, args.quantile, Path(args.plots))
        results[tr.name] = {t: {k: v for k, v in r.items() if not k.startswith("_")} for t, r in res.items()}
    if args.json:
        print(json.dumps({"traces": results}))
    else:
        print(format_table(results, args.quantile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
