"""The Dockerfile basics, checked without building (no container engine here):
multi-stage, pinned versions (no `latest`), a non-root runtime user, the build context
(.dockerignore) carries every package the image installs and nothing else, and both
server entry points are the packaged console commands, runnable."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SERVERS = ("latency-training-server", "latency-prediction-server")


def parse_dockerfile(text: str) -> list[tuple[str, str, list[str]]]:
    """(INSTRUCTION, arguments, heredoc lines) in order; continuations joined."""
    out: list[tuple[str, str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):
            nxt = lines[i].strip()
            i += 1
            if nxt.startswith("#"):
                continue
            line = line[:-1].rstrip() + " " + nxt
        heredoc: list[str] = []
        m = re.search(r"<<-?'?\"?([A-Z]+)'?\"?", line)
        if m:
            while i < len(lines) and lines[i].strip() != m.group(1):
                heredoc.append(lines[i])
                i += 1
            i += 1
        instr, _, args = line.partition(" ")
        out.append((instr.upper(), args.strip(), heredoc))
    return out


INSTRUCTIONS = parse_dockerfile(DOCKERFILE.read_text())


def _args() -> dict[str, str]:
    return {m.group(1): m.group(2) for ins, a, _ in INSTRUCTIONS if ins == "ARG"
            for m in [re.match(r"(\w+)=(\S+)", a)] if m}


def _stages() -> list[tuple[str, list[tuple[str, str, list[str]]]]]:
    stages: list = []
    for ins in INSTRUCTIONS:
        if ins[0] == "FROM":
            stages.append((ins[1], []))
        elif stages:
            stages[-1][1].append(ins)
    return stages


def _resolve(s: str) -> str:
    args = _args()
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), s)


def test_parser_reads_continuations_and_heredocs():
    parsed = parse_dockerfile("FROM a:1 AS x\n# c\nRUN one \\\n  # note\n  && two\nCOPY <<EOF /f\nl1\nl2\nEOF\nUSER 5\n")
    assert parsed == [("FROM", "a:1 AS x", []), ("RUN", "one && two", []), ("COPY", "<<EOF /f", ["l1", "l2"]),
                      ("USER", "5", [])]


def test_multi_stage_with_pinned_base_images():
    stages = _stages()
    assert len(stages) >= 2
    names = [s.split()[-1] for s, _ in stages]
    for source, _ in stages:
        image = _resolve(source.split()[0])
        if image in names:  # FROM an earlier stage
            continue
        repo, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.match(r"\d+\.\d+\.\d+", tag), image
    # the runtime stage copies the built environment, not the build tools
    final = stages[-1][1]
    assert any(i == "COPY" and a.startswith("--from=") for i, a, _ in final)
    assert not any(i == "RUN" and "pip install" in a for i, a, _ in final)


def test_no_latest_anywhere_and_every_install_is_pinned():
    text = DOCKERFILE.read_text()
    assert not re.search(r":latest\b", text)
    for ins, a, _ in INSTRUCTIONS:
        if ins != "RUN":
            continue
        for cmd in re.split(r"&&|;", a):
            words = shlex.split(_resolve(cmd))
            if words[:2] == ["pip", "install"]:
                pkgs = [w for w in words[2:] if not w.startswith("-") and w != "."]
                pkgs = [w for w in pkgs if w != "/build/constraints.txt"]
                assert all("==" in p for p in pkgs), cmd
                if "." in words[2:]:
                    assert "--constraint" in words or "-c" in words, cmd
            if words[:2] == ["apt-get", "install"]:
                pkgs = [w for w in words[2:] if not w.startswith("-")]
                assert pkgs and all("=" in p for p in pkgs), cmd


def test_constraints_pin_every_dependency_within_the_project_ranges():
    heredocs = [h for i, a, h in INSTRUCTIONS if i == "COPY" and a.endswith("/build/constraints.txt")]
    assert len(heredocs) == 1
    pins = {}
    for line in heredocs[0]:
        name, _, version = line.strip().partition("==")
        assert version, f"unpinned constraint {line!r}"
        pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    for dep in PYPROJECT["project"]["dependencies"]:
        req = Requirement(dep)
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        assert key in pins, f"{req.name} is not pinned in the Dockerfile constraints"
        assert req.specifier.contains(pins[key]), f"{req.name}=={pins[key]} outside {req.specifier}"
    # uvicorn[standard]: the fast event loop and HTTP parser are pinned too
    assert {"uvloop", "httptools"} <= set(pins)


def test_runtime_runs_as_a_non_root_user():
    final = _stages()[-1][1]
    users = [a for i, a, _ in final if i == "USER"]
    assert users, "the runtime stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric: runAsNonRoot can verify it
    created = " ".join(a for i, a, _ in final if i == "RUN")
    assert re.search(rf"useradd\b.*--uid {uid}\b", created)
    # the chart runs the same uid
    values = (REPO / "charts" / "latency-predictor" / "values.yaml").read_text()
    assert f"runAsUser: {uid}" in values


def test_both_servers_run_by_command():
    final = _stages()[-1][1]
    assert not [a for i, a, _ in final if i == "ENTRYPOINT"], "an ENTRYPOINT would hide the server command"
    cmd = [a for i, a, _ in final if i == "CMD"]
    assert cmd and shlex.split(cmd[-1].strip("[]").replace(",", " "))[0] in SERVERS
    scripts = PYPROJECT["project"]["scripts"]
    build = " ".join(a for i, a, _ in _stages()[-2][1] if i == "RUN")
    for server in SERVERS:
        assert server in scripts
        assert f"{server} --help" in build  # the image build fails if a server cannot start
    env = " ".join(a for i, a, _ in final if i == "ENV")
    assert "PATH=/opt/venv/bin:$PATH" in env


@pytest.mark.parametrize("server", SERVERS)
def test_entry_point_is_runnable(server):
    script = Path(sys.executable).parent / server
    assert script.exists(), f"{server} is not installed next to {sys.executable}: run pip install -e ."
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--host", "--port"):
        assert flag in out.stdout


# --------------------------------------------------------------------- build context


def _ignore_patterns() -> list[tuple[bool, re.Pattern]]:
    pats = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        p = line.lstrip("!").strip("/")
        rx = ""
        i = 0
        while i < len(p):
            if p.startswith("**/", i):
                rx += "(?:.*/)?"
                i += 3
            elif p.startswith("**", i):
                rx += ".*"
                i += 2
            elif p[i] == "*":
                rx += "[^/]*"
                i += 1
            elif p[i] == "?":
                rx += "[^/]"
                i += 1
            else:
                rx += re.escape(p[i])
                i += 1
        pats.append((negate, re.compile(rx)))
    return pats


def ignored(path: str) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; a pattern matching a
    directory matches everything under it."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    result = False
    for negate, rx in _ignore_patterns():
        if any(rx.fullmatch(p) for p in prefixes):
            result = not negate
    return result


def test_dockerignore_matcher():
    assert ignored("tests/test_chart.py") and ignored(".git/HEAD") and ignored("charts/x/values.yaml")
    assert not ignored("features/schema.py") and not ignored("pyproject.toml")
    assert ignored("features/__pycache__/schema.cpython-311.pyc")


def test_build_context_has_every_installed_package_and_nothing_else():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    packages = [p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]]
    # sources of the COPY instructions that read the build context (not heredocs, not stages)
    copied = {w for i, a, h in INSTRUCTIONS if i == "COPY" and not h and not a.startswith("--from")
              for w in a.split()[:-1]}
    for pkg in packages:
        assert pkg in copied, f"Dockerfile does not COPY {pkg}"
        files = [f for f in tracked if f.startswith(pkg + "/") and f.endswith(".py")]
        assert files and not [f for f in files if ignored(f)], pkg
    for needed in ("pyproject.toml", PYPROJECT["project"]["readme"]):
        assert needed in copied and not ignored(needed)
    for f in tracked:
        if f.startswith(("tests/", "charts/", ".ci/", ".git")) or f in ("Dockerfile", ".dockerignore"):
            assert ignored(f), f
