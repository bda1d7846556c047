"""The data directory's owner: one training server per data directory.

A running training server holds an exclusive ``flock`` on ``<data dir>/server.lock`` (released
by the kernel when the process ends, however it ends) with its pid written inside, so a second
server, or ``latency-predictor up``, refuses the directory before it opens the sample store.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "server.lock"


class DataDirError(Exception):
    """The data directory cannot be used; the message says why (one line)."""


def claim(data_dir: Path) -> int:
    """Create ``data_dir`` if needed and lock it; returns the lock's file descriptor (keep it
    open for as long as the directory is used; closing it releases the lock)."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(data_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise DataDirError(f"{data_dir}: cannot use it: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode("ascii", "replace").strip()
        os.close(fd)
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise DataDirError(f"{data_dir}: in use by another training server{who}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def check_free(data_dir: Path) -> None:
    """Raise :class:`DataDirError` if ``data_dir`` cannot be claimed now (it stays unclaimed)."""
    os.close(claim(data_dir))
