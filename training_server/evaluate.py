"""``latency-predictor evaluate``: the offline accuracy protocols of docs/evaluation.md §1.

Each trace is JSONL of training entries in the wire format (a zero target means absent), in
arrival order. ``--protocol forward`` (default, what a router lives with): the rows in file
order form 10 contiguous blocks; for k = 2..9 the model is trained on blocks 0..k-1 and
predicts block k. ``--protocol random``: ``--seeds`` random 90/10 splits. Training always goes
through the production path (the stratified sampling of :mod:`training_server.sampling` with
the server's default cap per bucket, :func:`training_server.trainer.train_models` with the
server's default :class:`TrainConfig` incl. its base and conformal calibration, served through
the same :class:`features.loaded.LoadedBundle`). On the same sampled training rows
both baselines of §1 (:mod:`training_server.baselines`: the upstream recipe and a linear
quantile regression) are trained and scored. Reported per target, over folds (only rows whose
target is > 0 count): pinball loss mean and std, coverage (share of actuals <= prediction, %),
coverage per load regime and its rows (pooled over folds), MAPE, and each baseline's pinball and coverage.

``--json`` prints exactly::

    {"protocol": "forward" | "random",
     "traces": {NAME: {"ttft": {"n", "pinball", "pinball_std", "coverage",
     "coverage_by_regime": {REGIME: %}, "n_by_regime": {REGIME: rows}, "mape",
     "reference": {"pinball", "coverage"},
     "baselines": {"upstream": {"pinball", "coverage"}, "linear": {"pinball", "coverage"}}},
     "tpot": {...}}}}

with NAME the file name without ``.jsonl`` and ``reference`` equal to ``baselines.upstream``; a
target absent from a trace is omitted. The table says per row whether the §1 target is met.
``--plots DIR`` writes ``NAME-TARGET-calibration.png`` (predicted vs actual) and
``NAME-TARGET-reliability.png`` (coverage per predicted-value decile) per trace/target.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from features.files import open_data
from features.matrix import REGIME_NAMES, TARGETS, regimes
from features.schema import FieldError, parse_training_entry
from features.scoring import evaluate_predictions

from . import sampling, trainer
from .baselines import BASELINES, linear_predictions, upstream_predictions
from .evaluate_report import format_table, write_plots
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


PROTOCOLS = ("forward", "random")
BLOCKS = 10


def folds(n: int, protocol: str = "forward", seeds: int = 10) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(seed, train mask, test mask) per fold. ``forward``: 10 contiguous blocks in file order,
    block k = rows [k n/10, (k+1) n/10); for k = 2..9, train on blocks 0..k-1, test on block k.
    ``random``: ``seeds`` random 90/10 splits."""
    if protocol == "random":
        return [(seed, ~m, m) for seed in range(seeds) for m in (split(n, seed),)]
    if protocol != "forward":
        raise ValueError(f"protocol must be one of {PROTOCOLS}")
    edges = [k * n // BLOCKS for k in range(BLOCKS + 1)]
    rows = np.arange(n)
    return [(k, rows < edges[k], (rows >= edges[k]) & (rows < edges[k + 1])) for k in range(2, BLOCKS)]


def evaluate_trace(trace: Trace, *, seeds: int = 10, quantile: float = 0.9,
                   config: trainer.TrainConfig | None = None, reference: bool = True,
                   max_per_bucket: int | None = None, keep_predictions: bool = False,
                   protocol: str = "forward") -> dict:
    """Run a §1 protocol on one trace; returns the per-target result (the --json shape).

    Per fold, ours and (with ``reference``) both baselines are trained on the same sampled
    rows and scored on the fold's test rows whose target is > 0. With ``keep_predictions`` each
    target also carries ``"_pred"``/``"_actual"`` arrays pooled over folds (for plots); they are
    removed before JSON output.
    """
    cfg = config or production_config(quantile)
    cap = max_per_bucket or Settings().max_training_data_size_per_bucket
    keys = ("pinball", "coverage", "mape", "hit", "regime", "pred", "actual")
    acc: dict[str, dict[str, list]] = {t: {k: [] for k in keys} for t in TARGETS}
    base_acc: dict[str, dict[str, dict[str, list]]] = {t: {b: {"pinball": [], "coverage": []} for b in BASELINES}
                                                       for t in TARGETS}
    for seed, train, test in folds(len(trace), protocol, seeds):
        tr = sample_training_rows(trace.raw[train], trace.ttft[train], trace.tpot[train], trace.ts[train], cap)
        raw_te = trace.raw[test]
        res = trainer.train_models(tr.raw, tr.ttft, tr.tpot, config=trainer.with_config(cfg, seed=seed), ts=tr.ts)
        ours = dict(zip(TARGETS, trainer.loaded_bundle(res).predict(raw_te))) if res.targets else {}
        base: dict[str, dict[str, np.ndarray]] = {}
        if reference:
            base["upstream"] = upstream_predictions(tr.raw, tr.ttft, tr.tpot, raw_te, quantile, seed)
            base["linear"] = linear_predictions(tr.raw, tr.ttft, tr.tpot, raw_te, quantile)
        reg = regimes(raw_te)
        for t in TARGETS:
            y = trace.target(t)[test]
            m = y > 0
            if not m.any() or t not in res.targets:
                continue
            a = acc[t]
            e = evaluate_predictions(y[m], ours[t][m], quantile)
            for k in ("pinball", "coverage", "mape"):
                a[k].append(e[k])
            a["hit"].append(y[m] <= ours[t][m])
            a["regime"].append(reg[m])
            a["pred"].append(ours[t][m])
            a["actual"].append(y[m])
            for b, pred in base.items():
                if t in pred:
                    r = evaluate_predictions(y[m], pred[t][m], quantile)
                    base_acc[t][b]["pinball"].append(r["pinball"])
                    base_acc[t][b]["coverage"].append(r["coverage"])
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
            "n_by_regime": {name: int((reg == i).sum()) for i, name in enumerate(REGIME_NAMES) if (reg == i).any()},
            "mape": float(np.nanmean(a["mape"])),
        }
        baselines = {b: {"pinball": float(np.mean(v["pinball"])), "coverage": float(np.mean(v["coverage"]))}
                     for b, v in base_acc[t].items() if v["pinball"]}
        if baselines:
            res_t["baselines"] = baselines
            if "upstream" in baselines:
                res_t["reference"] = dict(baselines["upstream"])
        if keep_predictions:
            res_t["_pred"] = np.concatenate(a["pred"])
            res_t["_actual"] = np.concatenate(a["actual"])
        out[t] = res_t
    return out


def recipe_params(model_type: str) -> dict[str, Any]:
    """The hyper-parameters of our recipe for ``model_type``, with their values (what ``--param``
    may override)."""
    return dict(trainer.DEFAULT_XGB if model_type == "xgboost" else trainer.DEFAULT_LGB)


def parse_params(items: Sequence[str], recipe: dict[str, Any]) -> dict[str, Any]:
    """``NAME=VALUE`` strings -> {name: value of the type the recipe's own value has}; ValueError
    names a malformed item, an unknown name (with the known ones) or a value of the wrong type."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise ValueError(f"--param {item!r}: expected NAME=VALUE")
        if name not in recipe:
            raise ValueError(f"--param {name}: unknown hyper-parameter; known: {', '.join(sorted(recipe))}")
        current = recipe[name]
        conv, kind = ((int, "an integer") if isinstance(current, int)
                      else (float, "a number") if isinstance(current, float) else (str, "a string"))
        try:
            out[name] = conv(value)
        except ValueError:
            raise ValueError(f"--param {name}={value}: must be {kind} (the recipe uses {current})") from None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="latency-predictor evaluate",
                                description="Accuracy of the production training path vs the reference recipe "
                                            "(docs/evaluation.md §1) on recorded traces of training entries.")
    p.add_argument("traces", nargs="+", metavar="TRACE.jsonl")
    p.add_argument("--protocol", choices=PROTOCOLS, default="forward",
                   help="forward (default): train on the past blocks of the trace, predict the next one; "
                        "random: random 90/10 splits (comparable with published llm-d figures)")
    p.add_argument("--seeds", type=int, default=10, help="random 90/10 splits with --protocol random (default 10)")
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
    model_type = args.model_type or production_config().model_type
    try:
        params = parse_params(args.param, recipe_params(model_type))
    except ValueError as e:  # one line (a typo is not a usage problem worth the whole usage text)
        print(f"latency-predictor evaluate: {e}", file=sys.stderr)
        return 2
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
        try:
            res = evaluate_trace(tr, seeds=args.seeds, quantile=args.quantile, config=cfg,
                                 keep_predictions=bool(args.plots), protocol=args.protocol)
        except Exception as e:  # noqa: BLE001 (the model library's own checks, e.g. max_depth=-1)
            if not params:
                raise
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            print(f"latency-predictor evaluate: {model_type} refused --param {' '.join(args.param)}: {reason}",
                  file=sys.stderr)
            return 2
        if args.plots:
            for t, r in res.items():
                write_plots(tr.name, t, r, args.quantile, Path(args.plots))
        results[tr.name] = {t: {k: v for k, v in r.items() if not k.startswith("_")} for t, r in res.items()}
    if args.json:
        print(json.dumps({"protocol": args.protocol, "traces": results}))
    else:
        print(format_table(results, args.quantile, args.protocol))
    return 0


if __name__ == "__main__":
    sys.exit(main())
