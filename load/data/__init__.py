"""The data sets shipped inside the package (see ``README.md`` in this directory).

``data_root()`` is the one place that knows where they live; ``open_data``
(``features.files``) reads a plain or gzip-compressed file the same way.
"""
from __future__ import annotations

from pathlib import Path

import orjson

from features.files import open_data

__all__ = ["SHAREGPT", "data_root", "load_entries", "open_data"]


def data_root() -> Path:
    """Directory holding the shipped data sets (inside the installed ``load`` package)."""
    return Path(__file__).resolve().parent


#: 3,400 training entries recorded from a live llm-d deployment (``llmd-h200-traces/``).
SHAREGPT = data_root() / "llmd-h200-traces" / "sharegpt-h200.jsonl.gz"


def load_entries(path: Path = SHAREGPT) -> list[dict]:
    """Recorded training entries (one JSON object a line)."""
    with open_data(path, binary=True) as f:
        return [orjson.loads(line) for line in f if line.strip()]
