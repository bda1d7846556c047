"""Record the simulator traces used by ``latency-predictor evaluate`` (docs/evaluation.md §1).

``python -m load.record_traces OUT_DIR`` runs the simulator (llm-d default scorers, load
1.0, seed 0) on the ``sessions`` scenario (prefix-heavy multi-turn chat) and the
``high-kv`` scenario (long prompts: KV use above 80% and long queues) and writes
``OUT_DIR/sim-sessions.jsonl`` and ``OUT_DIR/sim-high-kv.jsonl`` (training entries in the
wire format of ``/add_training_data_bulk``). Traces live outside the repository.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

SCENARIOS = {"sim-sessions": "sessions", "sim-high-kv": "high-kv"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.record_traces", description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--load", default="1.0")
    args = p.parse_args(argv)
    from load import simulate_cli

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, scenario in SCENARIOS.items():
        rc = simulate_cli.main(["--scenario", scenario, "--policies", "llmd-default", "--load", args.load,
                                "--seed", str(args.seed), "--record-trace", str(out / f"{name}.jsonl"),
                                "--out", str(out / f"{name}-run"), "--no-plots", "--quiet"])
        if rc:
            return rc
        print(out / f"{name}.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
