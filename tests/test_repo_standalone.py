"""The repository stands alone: the data the product and its tests use ship inside the
``load`` package (gzip, with provenance and licence beside each set), a built wheel carries
them, the loaders read them transparently, and no file reads or links the design notes or
data kept outside the repository."""
from __future__ import annotations

import fnmatch
import gzip
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from load.data import SHAREGPT, data_root, open_data
from load.sim import workloads as W

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "load" / "data"


def _tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=REPO, check=True, capture_output=True, text=True).stdout.split()


def test_nothing_reads_or_links_outside_the_repository():
    outside = re.compile(r"\.\./shared|[\"']\.\.[\"']\s*/\s*[\"']shared[\"']")
    offenders = []
    for name in _tracked():
        path = REPO / name
        if path.suffix in (".gz", ".png", ".svg") or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if outside.search(text):
            offenders.append(name)
    assert offenders == []


def test_data_root_is_inside_the_package_and_every_set_has_provenance():
    assert data_root() == DATA and SHAREGPT.is_file()
    for folder in (p for p in DATA.iterdir() if p.is_dir() and p.name != "__pycache__"):
        readme = (folder / "README.md").read_text()
        assert re.search(r"commit `[0-9a-f]{40}`", readme), folder.name
        assert re.search(r"[Ll]icen[cs]e", readme), folder.name
        if "Apache" in readme.split("## Source")[1].split("##")[0]:
            assert "Apache License" in (folder / "LICENSE").read_text(), folder.name
        for data in folder.glob("*.gz"):
            with gzip.open(data) as f:
                assert f.read(1)  # a valid, non-empty gzip stream


def test_loaders_read_compressed_and_plain_files_alike(tmp_path):
    plain = tmp_path / "t.jsonl"
    plain.write_bytes(gzip.decompress(SHAREGPT.read_bytes()))
    with open_data(SHAREGPT) as a, open_data(plain) as b:
        assert a.read() == b.read()
    with open_data(SHAREGPT, binary=True) as a:
        assert a.readline().startswith(b"{")
    assert len(W.load_mooncake("conversation", limit=50)) == 50
    assert len(W.load_azure("code", limit=50)) == 50


def test_every_shipped_file_is_declared_package_data_and_lands_in_the_wheel(tmp_path):
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["load.data"]
    shipped = [n[len("load/data/"):] for n in _tracked() if n.startswith("load/data/") and not n.endswith(".py")]
    assert shipped
    undeclared = [n for n in shipped if not any(fnmatch.fnmatch(n, p) and n.count("/") == p.count("/")
                                                for p in patterns)]
    assert undeclared == []
    # what a (non-editable) wheel would hold: setuptools' build_py of a copy of the tracked tree
    src = tmp_path / "src"
    for name in _tracked():
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    build = tmp_path / "build"
    subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py",
                    "--build-lib", str(build)], cwd=src, check=True, capture_output=True)
    built = {str(p.relative_to(build)) for p in build.rglob("*") if p.is_file()}
    assert {f"load/data/{n}" for n in shipped} <= built
    assert "load/data/__init__.py" in built and "features/apidocs.py" in built


def test_readme_starts_with_the_two_commands_and_links_existing_docs():
    readme = (REPO / "README.md").read_text()
    # each command sets up a virtual environment first: a system Python that refuses global
    # installs (PEP 668) runs them as they are
    venv = "python3 -m venv --system-site-packages .venv && . .venv/bin/activate && "
    assert readme.startswith(f"```bash\n{venv}pip install -e . && latency-predictor up\n"
                             f"{venv}pip install -e '.[test]' && python3 -m pytest\n```\n")
    assert "sed -n 3p README.md" in (REPO / ".ci" / "run").read_text()   # CI runs the second one
    assert ".venv/" in (REPO / ".gitignore").read_text().split()
    links = re.findall(r"\]\(((?:docs|charts)/[^)#]+)\)", readme)
    assert {"docs/architecture.md", "docs/wire-api.md", "docs/plugins.md", "docs/evaluation.md"} <= set(links)
    assert all((REPO / link).is_file() for link in links)
    assert "latency-data/" in (REPO / ".gitignore").read_text().split()
