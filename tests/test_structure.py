"""The package structure: the training server and the prediction server never import each other,
and no product package imports the lab (``load``: simulator, benchmarks, shipped data sets).

What both servers need (the manifest, the loaded bundle, scoring, reading data files) lives in
``features``; test helpers live under ``tests/``. The scan reads every module of both packages with ``ast`` (so imports
inside functions count too) and resolves relative imports against the module's package.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SERVERS = ("training_server", "prediction_server")
#: the packages a user deploys or imports; ``load`` may import them, never the reverse
PRODUCT = ("features", "training_server", "prediction_server", "epp_client", "gateway", "latency_cli")


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute names of every module ``source`` imports (at any depth), relative imports
    resolved against ``package`` (the dotted package of the module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod:
                out.add(mod)
            out.update(f"{mod}.{alias.name}" if mod else alias.name for alias in node.names)
    return out


def forbidden_imports(package: str, other: str) -> dict[str, list[str]]:
    """{module file: [imported modules of package ``other``]} for every module of ``package``."""
    found: dict[str, list[str]] = {}
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"no modules found under {REPO / package}"
    for path in files:
        rel = path.relative_to(REPO)
        pkg = ".".join(rel.parent.parts)
        bad = sorted(m for m in imported_modules(path.read_text(encoding="utf-8"), pkg)
                     if m == other or m.startswith(other + "."))
        if bad:
            found[str(rel)] = bad
    return found


def test_the_scan_sees_every_kind_of_import():
    src = ("import prediction_server.app\n"
           "from prediction_server import sync\n"
           "def f():\n    from prediction_server.service import PredictionService\n"
           "from .. import prediction_server as p\n"
           "from .registry import Registry\n")
    mods = imported_modules(src, "training_server")
    assert {"prediction_server.app", "prediction_server", "prediction_server.service",
            "training_server.registry"} <= mods
    assert "prediction_server" in imported_modules("from ..prediction_server import x\n", "training_server")


def test_the_scan_reads_real_imports():
    """Positive witness: the modules scanned do import the shared model layer."""
    mods = imported_modules((REPO / "training_server" / "registry.py").read_text(), "training_server")
    assert "features.loaded" in mods and "training_server.store" not in mods
    mods = imported_modules((REPO / "prediction_server" / "sync.py").read_text(), "prediction_server")
    assert "features.loaded" in mods and "prediction_server.service" in mods


@pytest.mark.parametrize("package", SERVERS)
def test_servers_do_not_import_each_other(package):
    other = next(p for p in SERVERS if p != package)
    assert forbidden_imports(package, other) == {}, "move what both servers need to features/"


@pytest.mark.parametrize("package", PRODUCT)
def test_product_packages_do_not_import_the_lab(package):
    assert forbidden_imports(package, "load") == {}, "product code reads data through features/, never load/"


def test_the_lab_scan_sees_an_import_of_load():
    """Positive witness: the same scan finds ``load`` where the lab imports itself."""
    assert "load/demo_bundle.py" in forbidden_imports("load", "load")


def test_both_servers_render_the_same_prediction_object():
    """One renderer (features.render): the training server's /predict object equals the
    prediction server's for the same bundle, prediction and time."""
    import numpy as np

    from features.loaded import LoadedBundle
    from features.render import rfc3339
    from prediction_server.service import Served
    from training_server.service import prediction_object

    bundle = LoadedBundle.builtin_prior(0.9)
    now = 1_790_000_000.25
    ours = prediction_object(bundle, 123.5, 7.25, now=now)
    theirs = Served.of(bundle).render(np.array([123.5]), np.array([7.25]), rfc3339(now))[0]
    assert ours == theirs
    assert ours["predicted_at"] == "2026-09-21T14:13:20.250Z" and ours["model_type"] == "prior"
    assert ours["ttft_prediction_bounds"][0] <= 123.5 <= ours["ttft_prediction_bounds"][1]
