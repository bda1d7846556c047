"""``latency-predictor``: one command, several sub-commands, each owned by its package.

Each sub-command lives in the module that implements it and exposes ``main(argv) -> int``;
this file only dispatches (imports are lazy so ``--help`` stays fast).
"""
from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("latency_cli.up", "start one training server and N prediction servers on loopback"),
    "simulate": ("load.simulate_cli", "run a simulated-cluster routing benchmark and write a report"),
    "evaluate": ("training_server.evaluate", "offline accuracy evaluation of the trainer on recorded traces"),
    "whatif": ("latency_cli.whatif", "predict TTFT/TPOT over a grid of row values on a running prediction server"),
    "gateway": ("gateway", "OpenAI-compatible routing gateway in front of model servers"),
}


def _usage() -> str:
    lines = ["usage: latency-predictor COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'latency-predictor COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"latency-predictor: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name = COMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            print(f"latency-predictor: command {name!r} is not available in this build", file=sys.stderr)
            return 2
        raise
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
