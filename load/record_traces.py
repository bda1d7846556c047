"""Record the simulator traces used by ``latency-predictor evaluate`` (docs/evaluation.md §1).

``python -m load.record_traces OUT_DIR`` runs the simulator (llm-d default scorers, seed 0)
on the ``sessions`` scenario (prefix-heavy multi-turn chat, load 1.0), the ``high-kv``
scenario (long prompts: KV use above 80% and long queues, load 1.0) and the ``ramp`` scenario
(load rising from 0.5 to 1.4 of capacity: queues, KV pressure and preemptions build past
anything seen earlier in the trace) and writes ``OUT_DIR/sim-sessions.jsonl``,
``OUT_DIR/sim-high-kv.jsonl`` and ``OUT_DIR/sim-ramp.jsonl`` (training entries in the wire
format of ``/add_training_data_bulk``, in arrival order). Deterministic; a few seconds.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: trace name -> (scenario, load; None = ``--load``)
SCENARIOS = {"sim-sessions": ("sessions", None), "sim-high-kv": ("high-kv", None), "sim-ramp": ("ramp", "0.95")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.record_traces", description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--load", default="1.0", help="load of the sessions and high-kv traces (the ramp's is fixed)")
    p.add_argument("--only", choices=sorted(SCENARIOS), action="append", help="record only this trace (repeatable)")
    args = p.parse_args(argv)
    from load import simulate_cli

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, (scenario, load) in SCENARIOS.items():
        if args.only and name not in args.only:
            continue
        rc = simulate_cli.main(["--scenario", scenario, "--policies", "llmd-default", "--load", load or args.load,
                                "--seed", str(args.seed), "--record-trace", str(out / f"{name}.jsonl"),
                                "--out", str(out / f"{name}-run"), "--no-plots", "--quiet"])
        if rc:
            return rc
        print(out / f"{name}.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
