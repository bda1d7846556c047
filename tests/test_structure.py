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


def imported_modules(source: str, package: str, *, runtime: bool = False) -> set[str]:
    """Absolute names of every module ``source`` imports (at any depth), relative imports
    resolved against ``package`` (the dotted package of the module). ``runtime``: leave out
    the imports under ``if TYPE_CHECKING:`` (read by type checkers only, never run)."""
    out: set[str] = set()
    tree = ast.parse(source)
    if runtime:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                node.body = []
    for node in ast.walk(tree):
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


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def import_graph(packages: tuple[str, ...] = PRODUCT) -> dict[str, set[str]]:
    """{module: modules it imports} over ``packages``, as Python runs them: an import inside a
    function counts, one under ``if TYPE_CHECKING:`` does not; importing ``a.b.c`` also runs
    ``a`` and ``a.b`` (their ``__init__``), except the importer's own parent packages, which
    are loaded already."""
    sources = {module_name(p): p for pkg in packages for p in sorted((REPO / pkg).rglob("*.py"))
               if "__pycache__" not in p.parts}
    graph: dict[str, set[str]] = {}
    for mod, path in sources.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        ancestors = {".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 1)}
        deps: set[str] = set()
        for name in imported_modules(path.read_text(encoding="utf-8"), package, runtime=True):
            parts = name.split(".")
            deps.update(m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                        if m in sources and m not in ancestors and m != mod)
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_scan_finds_a_late_import_cycle():
    """Positive witness: a cycle closed only by an import inside a function is found, and an
    import of a sibling's parent package counts (it runs that package's ``__init__``)."""
    graph = {"a.x": {"a.y"}, "a.y": set(), "b": {"c"}, "c": set()}
    assert cycles(graph) == []
    graph["a.y"].add("a.x")
    graph["c"].add("b")
    assert cycles(graph) == [["a.x", "a.y"], ["b", "c"]]
    mods = imported_modules("def f():\n    from ..config import build\n", "epp_client.flowcontrol")
    assert "epp_client.config" in mods
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .core import Gateway\n"
    assert "gateway.core" in imported_modules(typing_only, "gateway")
    assert "gateway.core" not in imported_modules(typing_only, "gateway", runtime=True)
    graph = import_graph()
    assert "epp_client.types" in graph["epp_client"] and len(graph) > 80


def test_no_import_cycle_among_product_modules():
    assert cycles(import_graph()) == [], "break the cycle: move the shared part down, pass objects in"


def plugin_modules() -> dict[Path, list[str]]:
    """{plugin module: the type names it registers} (``@plugin("type", Role)``), read with ast."""
    out: dict[Path, list[str]] = {}
    for path in sorted((REPO / "epp_client" / "plugins").rglob("*.py")):
        types = [d.args[0].value if isinstance(d.args[0], ast.Constant) else ast.unparse(d.args[0])
                 for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.ClassDef)
                 for d in node.decorator_list
                 if isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "plugin" and d.args]
        if types:
            out[path] = types
    return out


def test_one_plugin_type_a_module_in_its_role_folder_each_with_its_test_file():
    """``epp_client/plugins/<role>/<type>.py`` registers one type; ``tests/test_<role>_<type>.py`` tests it."""
    mods = plugin_modules()
    assert len(mods) >= 25, sorted(str(p) for p in mods)      # the scan sees the plugins
    rel = {str(p.relative_to(REPO / "epp_client" / "plugins")): types for p, types in mods.items()}
    assert rel["scorer/latency.py"] == ["latency-scorer"]
    assert {f: t for f, t in rel.items() if len(t) != 1} == {}, "one plugin type a module"
    assert [f for f in rel if f.count("/") != 1] == [], "plugins live in plugins/<role>/<type>.py"
    missing = sorted(f"tests/test_{f.removesuffix('.py').replace('/', '_')}.py" for f in rel
                     if not (REPO / "tests" / f"test_{f.removesuffix('.py').replace('/', '_')}.py").is_file())
    assert missing == [], "each plugin module has its test file"


def test_the_framework_imports_no_plugin():
    """Not even through another module: the plugins are found by type name (the registry)."""
    graph = import_graph()
    reach: set[str] = set()
    todo = [m for m in graph if m.startswith("epp_client.framework")]
    assert "epp_client.framework.scheduler" in todo
    while todo:
        m = todo.pop()
        for d in graph.get(m, ()):
            if d not in reach:
                reach.add(d)
                todo.append(d)
    assert "epp_client.types" in reach      # the scan follows the framework's imports
    assert sorted(m for m in reach if m.startswith("epp_client.plugins")) == []


#: the packages whose modules each have a test file named after them (:func:`mirror_test_file`)
MIRRORED = ("epp_client", "training_server", "prediction_server")

#: modules with no behaviour of their own, exempt from having a test file: {module: why}
#: (a package ``__init__`` that defines no function or class, only a docstring and
#: re-exports, is exempt without being listed: :func:`declares_nothing`)
DECLARATIONS_ONLY = {
    "epp_client.framework.protocols": "one Protocol per extension point and RequestHooksBase's no-op hooks",
    "epp_client.engine.model": "the EngineModel Protocol and the Outcome NamedTuple",
}

#: modules tested in a file named for a wider subject: {module: the test file that covers it}
COVERED_BY = {
    "epp_client.engine.twin": "test_twin.py",
    "epp_client.engine.stretch": "test_twin_exact.py",   # held to the plain replay
    "epp_client.engine.twin_engine": "test_producer_running_columns.py",   # placements held to placement
    "training_server.__main__": "test_training_durability.py",
    "prediction_server.__main__": "test_prediction_process.py",
    "training_server.evaluate": "test_quality_evaluate.py",
    "training_server.evaluate_report": "test_quality_evaluate.py",
    "training_server.registry": "test_training_lineage.py",
    "training_server.worker": "test_training_publish.py",
    "training_server.gate": "test_training_publish.py",
    "training_server.correction": "test_quality_drift.py",
}

def mirror_test_file(module: str) -> str:
    """The test file named after a product module, one scheme per package:
    ``epp_client.<m>`` (a module or a subpackage's ``__init__``) -> ``test_epp_<m>.py``;
    ``epp_client.plugins.<role>.<m>`` -> ``test_<role>_<m>.py``;
    ``epp_client.<subpackage>.<m>`` (framework, flowcontrol, engine) -> ``test_<subpackage>_<m>.py``;
    ``training_server.<m>`` -> ``test_training_<m>.py``; ``prediction_server.<m>`` ->
    ``test_prediction_<m>.py`` (``__main__`` -> ``main``)."""
    top, *rest = [p.strip("_") for p in module.split(".")]
    if top in ("training_server", "prediction_server"):
        return f"test_{top.removesuffix('_server')}_{'_'.join(rest)}.py"
    if len(rest) == 1:
        return f"test_epp_{rest[0]}.py"
    if rest[0] == "plugins":
        return f"test_{rest[1]}_{rest[2]}.py"
    return f"test_{rest[0]}_{rest[1]}.py"


def declares_nothing(path: Path) -> bool:
    """A package ``__init__`` with no function or class of its own (docstring and re-exports)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return path.name == "__init__.py" and not any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body)


def modules_without_test_file(tests: Path = REPO / "tests") -> list[str]:
    """``module -> tests/<file>`` for every module of :data:`MIRRORED` whose test file is
    not in ``tests``."""
    missing = []
    for pkg in MIRRORED:
        for path in sorted((REPO / pkg).rglob("*.py")):
            mod = module_name(path)
            if "__pycache__" in path.parts or mod in DECLARATIONS_ONLY or declares_nothing(path):
                continue
            name = COVERED_BY.get(mod, mirror_test_file(mod))
            if not (tests / name).is_file():
                missing.append(f"{mod} -> tests/{name}")
    return missing


def test_the_test_file_names_follow_one_scheme_per_package():
    assert mirror_test_file("epp_client.predictor") == "test_epp_predictor.py"
    assert mirror_test_file("epp_client.profiles") == "test_epp_profiles.py"
    assert mirror_test_file("epp_client.framework.params") == "test_framework_params.py"
    assert mirror_test_file("epp_client.plugins.scorer.latency") == "test_scorer_latency.py"
    assert mirror_test_file("training_server.store") == "test_training_store.py"
    assert mirror_test_file("prediction_server.__main__") == "test_prediction_main.py"
    assert declares_nothing(REPO / "epp_client" / "framework" / "__init__.py")
    assert not declares_nothing(REPO / "epp_client" / "profiles" / "__init__.py")
    assert not declares_nothing(REPO / "epp_client" / "predictor.py")


def test_the_exempt_and_covered_modules_exist_and_their_files_too():
    """The lists name real modules (a renamed module cannot stay listed), and each covering file exists."""
    mods = {module_name(p) for pkg in MIRRORED for p in (REPO / pkg).rglob("*.py")}
    assert sorted((set(DECLARATIONS_ONLY) | set(COVERED_BY)) - mods) == []
    assert sorted(f for f in COVERED_BY.values() if not (REPO / "tests" / f).is_file()) == []


def test_every_module_with_behaviour_has_its_test_file():
    """Tests mirror the layout: the tests of ``<package>/<module>.py`` are in the file
    :func:`mirror_test_file` names (or the one :data:`COVERED_BY` gives)."""
    missing = modules_without_test_file()
    assert missing == [], "no test file (named by mirror_test_file) for: " + "; ".join(missing)


def test_the_scan_names_each_module_whose_test_file_is_missing(tmp_path):
    """Positive witness: against a tests folder holding one test file, the scan names every
    other module with behaviour, and leaves out the exempt and the covered ones."""
    (tmp_path / "test_prediction_batcher.py").touch()
    missing = modules_without_test_file(tmp_path)
    assert "prediction_server.service -> tests/test_prediction_service.py" in missing
    assert "epp_client.framework.lifecycle -> tests/test_framework_lifecycle.py" in missing
    assert "training_server.registry -> tests/test_training_lineage.py" in missing
    named = {m.split(" -> ")[0] for m in missing}
    assert "prediction_server.batcher" not in named and not named & set(DECLARATIONS_ONLY)
    assert len(missing) > 80
