"""Helpers for tests and benchmarks: the recorded data, and the loopback app runner.

The in-thread uvicorn runner is shared with the prediction server
(``prediction_server.testing.run_app``) and re-exported here as ``serve_in_thread``.
"""
from __future__ import annotations

from pathlib import Path

import orjson

from prediction_server.testing import run_app as serve_in_thread  # noqa: F401  (re-export)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / ".." / "shared" / "data"
SHAREGPT = DATA / "llmd-h200-traces" / "sharegpt-h200.jsonl"


def load_entries(path: Path = SHAREGPT) -> list[dict]:
    """Recorded training entries (one JSON object a line)."""
    with open(path, "rb") as f:
        return [orjson.loads(line) for line in f if line.strip()]
