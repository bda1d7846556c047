"""One training server per data directory: an exclusive lock with the holder's pid inside,
released when its descriptor closes."""
from __future__ import annotations

import os

import pytest

from training_server.datadir import LOCK_NAME, DataDirError, check_free, claim


def test_a_claimed_directory_is_refused_naming_the_holder_until_released(tmp_path):
    d = tmp_path / "new" / "data"
    fd = claim(d)                         # created on first use
    try:
        assert (d / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        with pytest.raises(DataDirError, match=rf"in use by another training server \(pid {os.getpid()}\)"):
            claim(d)
        with pytest.raises(DataDirError):
            check_free(d)
    finally:
        os.close(fd)
    check_free(d)                         # released: free again, and check_free leaves it free
    os.close(claim(d))


def test_an_unusable_directory_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(DataDirError, match="cannot use it"):
        claim(blocker / "data")
