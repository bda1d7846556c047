"""The data sets shipped inside the package (see ``README.md`` in this directory).

``data_root()`` is the one place that knows where they live; ``open_text`` reads a plain or
gzip-compressed text file the same way, so a loader never cares which one it was given.
"""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO


def data_root() -> Path:
    """Directory holding the shipped data sets (inside the installed ``load`` package)."""
    return Path(__file__).resolve().parent


def open_text(path: str | Path) -> IO[str]:
    """Open a text file for reading, decompressing it on the fly when its name ends in ``.gz``."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


#: 3,400 training entries recorded from a live llm-d deployment (``llmd-h200-traces/``).
SHAREGPT = data_root() / "llmd-h200-traces" / "sharegpt-h200.jsonl.gz"
