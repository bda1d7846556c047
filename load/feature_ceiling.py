"""How far any model of a training row's features can get: the features' ceiling.

``python -m load.feature_ceiling TRACE.jsonl [...]`` fits flexible learners (XGBoost at depth 6
and 8, LightGBM with 63 leaves, alone and over the line: no shape constraints, no calibration,
every model feature of ``features.matrix``) and the linear quantile baseline of docs/evaluation.md §1
(``training_server.baselines``) on the same random 90/10 splits of each trace, and prints each
one's pinball loss at the quantile and its ratio to the baseline.

Random splits favour the learners: they train on 90% of the rows and predict rows from the same
stretch of time, with nothing to extrapolate. The forward protocol trains on less and predicts
what comes next. So when no learner gets below a ratio here, the forward protocol will not
either: what the rows carry, not the model, sets the limit (docs/forward-accuracy.md, "What the
features carry"). Where a learner does get well below the line here and the served model does
not forward, the gap is extrapolation, which the model can still close.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from features.matrix import TARGETS, model_matrix
from features.scoring import pinball_loss

#: name -> factory(quantile) of a scikit-learn style regressor (fit / predict)
Learner = Callable[[float], Any]


def _xgb(depth: int, rounds: int) -> Learner:
    def make(q: float) -> Any:
        import xgboost as xgb

        return xgb.XGBRegressor(objective="reg:quantileerror", quantile_alpha=q, n_estimators=rounds,
                                max_depth=depth, learning_rate=0.03, subsample=0.8, colsample_bytree=0.8,
                                tree_method="hist", n_jobs=1, random_state=0)
    return make


def _lgb(leaves: int, rounds: int) -> Learner:
    def make(q: float) -> Any:
        import lightgbm as lgb

        return lgb.LGBMRegressor(objective="quantile", alpha=q, n_estimators=rounds, num_leaves=leaves,
                                 learning_rate=0.03, min_child_samples=10, n_jobs=1, random_state=0, verbose=-1)
    return make


#: a learner whose name starts with this fits the residual over the linear baseline's answer
#: (as the served model's ``add`` link does over its base) and answers line + trees
OVER_LINE = "line+"
LEARNERS: dict[str, Learner] = {"xgboost-d6": _xgb(6, 400), "xgboost-d8": _xgb(8, 800),
                                "lightgbm-63": _lgb(63, 800), "line+xgboost-d6": _xgb(6, 400),
                                "line+lightgbm-63": _lgb(63, 800)}


def ceiling(trace, *, splits: int = 3, quantile: float = 0.9,
            learners: Mapping[str, Learner] = LEARNERS) -> dict[str, dict]:
    """Per target with rows: {"n", "pinball": {"linear": ms, LEARNER: ms, ...}, "ratio": {LEARNER:
    pinball / linear}, "best", "best_ratio"}, pinball means over ``splits`` random 90/10 splits."""
    from training_server.baselines import linear_predictions
    from training_server.evaluate import split

    out: dict[str, dict] = {}
    for t in TARGETS:
        y_all = trace.target(t)
        m = y_all > 0
        if m.sum() < 50:
            continue
        raw, y = trace.raw[m], y_all[m]
        x = model_matrix(raw, t)
        loss: dict[str, list[float]] = {"linear": [], **{name: [] for name in learners}}
        for seed in range(splits):
            test = split(len(y), seed)
            train = ~test
            zeros = np.zeros(int(train.sum()))
            ttft, tpot = (y[train], zeros) if t == "ttft" else (zeros, y[train])
            both = linear_predictions(raw[train], ttft, tpot, np.concatenate([raw[train], raw[test]]), quantile)[t]
            line_train, line = both[:int(train.sum())], both[int(train.sum()):]
            loss["linear"].append(pinball_loss(y[test], line, quantile))
            for name, make in learners.items():
                model = make(quantile)
                over_line = name.startswith(OVER_LINE)   # the trees learn the residual over the line
                model.fit(x[train], y[train] - line_train if over_line else y[train])
                pred = np.asarray(model.predict(x[test])) + (line if over_line else 0.0)
                loss[name].append(pinball_loss(y[test], pred, quantile))
        pin = {k: float(np.mean(v)) for k, v in loss.items()}
        ratio = {k: pin[k] / pin["linear"] for k in learners}
        best = min(ratio, key=lambda k: ratio[k])
        out[t] = {"n": int(m.sum()), "pinball": pin, "ratio": ratio, "best": best, "best_ratio": ratio[best]}
    return out


def format_table(results: Mapping[str, Mapping[str, dict]]) -> str:
    lines = ["| trace | target | rows | linear | " + " | ".join(LEARNERS) + " | best ratio |",
             "|---|---|---|---|" + "---|" * len(LEARNERS) + "---|"]
    for name, per_target in results.items():
        for t, r in per_target.items():
            cells = [f"{r['pinball'][k]:.4g} ({r['ratio'][k]:.2f})" if k in r["ratio"] else "-" for k in LEARNERS]
            lines.append(f"| {name} | {t} | {r['n']} | {r['pinball']['linear']:.4g} | " + " | ".join(cells)
                         + f" | {r['best_ratio']:.2f} ({r['best']}) |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.feature_ceiling", description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+", metavar="TRACE.jsonl")
    p.add_argument("--splits", type=int, default=3, help="random 90/10 splits per trace (default 3)")
    p.add_argument("--quantile", type=float, default=0.9)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = p.parse_args(argv)
    if args.splits < 1:
        p.error("--splits must be >= 1")
    if not 0.0 < args.quantile < 1.0:
        p.error("--quantile must be in (0, 1)")
    from training_server.evaluate import TraceError, read_trace

    results: dict[str, dict] = {}
    for path in args.traces:
        try:
            trace = read_trace(path)
        except TraceError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{trace.name}: {len(trace)} rows ...", file=sys.stderr, flush=True)
        results[trace.name] = ceiling(trace, splits=args.splits, quantile=args.quantile)
    print(json.dumps({"splits": args.splits, "quantile": args.quantile, "traces": results}, indent=2)
          if args.json else format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
