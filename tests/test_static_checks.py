"""ruff and mypy on the product packages, with the configuration in pyproject.toml.

They run through the README's test command (CI's ``.ci/run``): the ``test`` extra installs
both. A finding fails the test with the tool's own report."""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import MYPY_RUN, start_mypy

from product_packages import REPO, package_dirs_on_disk, product_packages, pyproject


def _run(tool: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", tool, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    if "No module named" in proc.stderr and tool in proc.stderr:
        pytest.fail(f"{tool} is not installed: python3 -m pip install -e '.[test]'")
    return proc


def test_every_package_on_disk_is_shipped_and_type_checked():
    """A new top-level package (e.g. ``gateway/``) must be in the build's include list, which
    the lint and the module size limit read, and in mypy's packages."""
    on_disk = package_dirs_on_disk()
    assert set(on_disk) <= set(product_packages()), \
        f"pyproject [tool.setuptools.packages.find] include misses {sorted(set(on_disk) - set(product_packages()))}"
    assert sorted(pyproject()["tool"]["mypy"]["packages"]) == sorted(product_packages()), \
        "pyproject [tool.mypy] packages must list the product packages"


def test_ruff_finds_nothing():
    proc = _run("ruff", "check", "--no-fix", "--output-format", "concise", *product_packages(), timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"ruff check (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}", pytrace=False)


def test_mypy_finds_nothing(request):
    # the packages and options come from [tool.mypy]; the cache (.mypy_cache) makes a re-run fast.
    # In a run of more tests than this one, mypy started when the tests were collected (conftest)
    proc = request.config.stash.get(MYPY_RUN, None) or start_mypy()
    out, err = proc.communicate(timeout=900)
    if "No module named" in err and "mypy" in err:
        pytest.fail("mypy is not installed: python3 -m pip install -e '.[test]'")
    if proc.returncode != 0:
        pytest.fail(f"mypy (exit {proc.returncode}):\n{out}{err}", pytrace=False)
