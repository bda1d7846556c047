"""Reading data files: a plain or gzip-compressed file opens the same way, so a reader never
cares which one it was given (training traces, recorded entries, shipped data sets)."""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO, cast


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
