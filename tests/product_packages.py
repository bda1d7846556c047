"""The product's top-level packages, as the package build ships them (pyproject's
``[tool.setuptools.packages.find] include``): the set the static checks and the module size
limit apply to."""
from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def product_packages() -> list[str]:
    """Top-level package names (``features``, ``load``, ...), in pyproject's order."""
    include = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    return [p.removesuffix("*") for p in include if p.endswith("*") and "." not in p]


def package_dirs_on_disk() -> list[str]:
    """Top-level directories of the repository that are Python packages, tests excluded."""
    return sorted(d.name for d in REPO.iterdir()
                  if d.is_dir() and (d / "__init__.py").is_file() and d.name != "tests")
