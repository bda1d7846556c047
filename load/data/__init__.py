"""The data sets shipped inside the package (see ``README.md`` in this directory).

``data_root()`` is the one place that knows where they live; ``open_data`` reads a plain or
gzip-compressed file the same way, so a loader never cares which one it was given.
"""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO, cast

import orjson


def data_root() -> Path:
    """Directory holding the shipped data sets (inside the installed ``load`` package)."""
    return Path(__file__).resolve().parent


def open_data(path: str | Path, binary: bool = False) -> IO:
    """Open a file for reading (text, or bytes with ``binary``), decompressing it on the fly
    when its name ends in ``.gz``."""
    path = Path(path)
    if path.suffix == ".gz":
        if binary:
            # a GzipFile has the whole binary-file interface, but typeshed does not declare it an IO[bytes]
            return cast(IO[bytes], gzip.open(path, "rb"))
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return path.open("rb") if binary else path.open(encoding="utf-8", newline="")


#: 3,400 training entries recorded from a live llm-d deployment (``llmd-h200-traces/``).
SHAREGPT = data_root() / "llmd-h200-traces" / "sharegpt-h200.jsonl.gz"


def load_entries(path: Path = SHAREGPT) -> list[dict]:
    """Recorded training entries (one JSON object a line)."""
    with open_data(path, binary=True) as f:
        return [orjson.loads(line) for line in f if line.strip()]
