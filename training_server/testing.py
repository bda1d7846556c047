"""Helpers for tests and benchmarks: the recorded data, and the loopback app runner.

The in-thread uvicorn runner is shared with the prediction server
(``prediction_server.testing.run_app``) and re-exported here as ``serve_in_thread``.
"""
from __future__ import annotations

from pathlib import Path

import orjson

from load.data import SHAREGPT, open_data
from prediction_server.testing import run_app as serve_in_thread  # noqa: F401  (re-export)


def load_entries(path: Path = SHAREGPT) -> list[dict]:
    """Recorded training entries (one JSON object a line)."""
    with open_data(path, binary=True) as f:
        return [orjson.loads(line) for line in f if line.strip()]
