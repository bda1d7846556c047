"""The simulator's engine (the world, ``load/sim``) and the router's engine twin (a belief,
``epp_client``) share no code and no fitted constants (docs/evaluation.md §4.1)."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from epp_client.engine.twin import StepModel
from load.sim import engines
from load.sim.stepmodel import PRESETS

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names; relative ones resolved inside its package)."""
    pkg = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def _numbers(path: Path) -> set[float]:
    return {float(n.value) for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)}


def test_the_simulator_never_imports_the_twin_and_the_router_never_imports_the_simulator():
    sim_files = sorted((ROOT / "load" / "sim").glob("*.py"))
    router_files = sorted((ROOT / "epp_client").rglob("*.py"))
    assert len(sim_files) > 20 and len(router_files) > 20       # the scan sees the packages
    twin_users = {p.name for p in sim_files
                  if any(m == "epp_client.engine.twin" or m.startswith("epp_client.engine.twin.") for m in _imports(p))}
    assert twin_users == set()
    load_users = {str(p.relative_to(ROOT)) for p in router_files
                  if any(m == "load" or m.startswith("load.") for m in _imports(p))}
    assert load_users == set()
    # the scan does find imports: the oracle adapter reaches the plugins through their engine interface
    assert "epp_client.engine.model.Outcome" in _imports(ROOT / "load" / "sim" / "harm_oracle.py")


def test_no_default_of_the_twin_is_a_constant_of_the_simulators_engine():
    """The twin's step-model defaults (its prior) appear nowhere in the simulator's presets, step
    model or engines, neither as literals in their source nor as values of a preset or engine."""
    prior = {float(f.default) for f in dataclasses.fields(StepModel)
             if isinstance(f.default, (int, float)) and f.default not in (0, 1)}
    assert len(prior) >= 5
    world: set[float] = set()
    for name in ("stepmodel.py", "steptable.py", "engines.py", "server.py", "engine.py"):
        world |= _numbers(ROOT / "load" / "sim" / name)
    for spec in PRESETS.values():
        for f in dataclasses.fields(spec):
            v = getattr(spec, f.name)
            world.update(float(x) for x in (v if isinstance(v, tuple) else (v,))
                         if isinstance(x, (int, float)) and not isinstance(x, bool))
        for e in engines.ENGINES.values():
            world.update(float(v) for v in e.params.values() if isinstance(v, (int, float)))
    assert len(world) > 30
    # equal up to float rounding (the same fit written in another form) counts as shared
    shared = sorted((p, w) for p in prior for w in world if abs(p - w) <= 1e-9 * abs(w))
    assert shared == []
    # the witness that the comparison bites: a twin whose prior is a preset's coefficient is caught
    a_att = PRESETS["llama3-8b-a100"].a_att
    assert any(abs(a_att - w) <= 1e-9 * abs(w) for w in world)
