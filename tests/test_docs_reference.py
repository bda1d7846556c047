"""Docs and code read as reference: no page, comment or docstring narrates work sessions or
"before/now" history (a figure is the current one, with the command that reproduces it; a
dated run lives in docs/results/).

Scanned: README.md, every Markdown page under docs/, and every Python and Markdown file of the
product packages (comments, docstrings and strings alike). "Session" as a product word (a chat
or agentic session, the ``sessions`` scenario, ``session_id``) is not narration and passes."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from product_packages import REPO, product_packages

_ORD = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth)"
#: (name, pattern): each names one way a text narrates its own history
NARRATION = [
    ("numbered session", re.compile(
        rf"\b{_ORD}(?:(?:,\s*|\s+(?:and|or|to)\s+){_ORD})*\s+sessions?\b(?![ _-]?ids?\b)", re.I)),
    ("relative session", re.compile(
        r"\b(?:this|that|last|next|previous|earlier|later|every\s+earlier)\s+sessions?\b(?!'?s?[ _-]?ids?\b)",
        re.I)),
    ("lettered session", re.compile(r"\b[Ss]ession [A-Z]\b")),
    ("re-measured", re.compile(r"\bre-?measured\b", re.I)),
    ("before/now", re.compile(r"\bbefore\s*(?:/\s*now|(?:→|->)\s*(?:now|after))\b", re.I)),
    ("what it did before", re.compile(r"\bdid before\b", re.I)),
    ("dated change", re.compile(r"\b(?:since|as of|until)\s+20\d\d-\d\d-\d\d\b", re.I)),
]


def _texts() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for pkg in product_packages():
        files += sorted(p for p in (REPO / pkg).rglob("*") if p.suffix in (".py", ".md") and p.is_file())
    return files


def narration(text: str) -> list[tuple[int, str, str]]:
    """(line number, pattern name, line) per line of ``text`` that narrates history."""
    return [(n, name, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            for name, pat in NARRATION if pat.search(line)]


@pytest.mark.parametrize("line, hit", [
    ("measured 2026-12-04 (ninth session) with the recommended profile", "numbered session"),
    ("before the decode-harm-filter (fourth and fifth sessions):", "numbered session"),
    ("the analytic estimate it replaces (sixth and seventh sessions) split", "numbered session"),
    ("(7 min 4 s on 2 cores, this session)", "relative session"),
    ("in every earlier session (`autoTune: false`)", "relative session"),
    ("Session A is the tables' (load average 1.8-2.6)", "lettered session"),
    ("Re-measured with the engine twin in the filter", "re-measured"),
    ("Before → after, same session, steady state:", "before/now"),
    ("Refitting it on all rows (what this module did before) mixes two models", "what it did before"),
    ("Its weight is 0.75 since 2026-12-04.", "dated change"),
])
def test_the_scan_flags_narration(line, hit):
    assert [name for _, name, _ in narration(line)] == [hit]


@pytest.mark.parametrize("line", [
    "a chat session keeps its turns on one endpoint",
    "each agentic session is a program of turns",
    "the `sessions` scenario: synthetic multi-turn sessions",
    "one session id per child agent; the session_id header",
    "records `sim-sessions`, `sim-high-kv` and `sim-ramp`",
    "the machine's 1-minute load average before/after the phase",
    "endpoints no longer in the pool are forgotten",
    "measured 2026-12-05 at commit 5149912 (docs/results/2026-12-05-standard.md)",
])
def test_product_words_pass(line):
    assert narration(line) == []


def test_no_page_comment_or_docstring_narrates_history():
    hits = [f"{path.relative_to(REPO)}:{n}: [{name}] {line[:120]}"
            for path in _texts() for n, name, line in narration(path.read_text(encoding="utf-8"))]
    assert not hits, "narration (state the current figure and its command instead):\n" + "\n".join(hits)


def test_every_result_file_names_its_commit_and_command_and_a_page_quotes_it():
    results = REPO / "docs" / "results"
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "docs").glob("*.md"))
    runs = sorted(p for p in results.glob("*.md") if p.name != "README.md")
    assert runs, "docs/results/ holds no run"
    for run in runs:
        text = run.read_text(encoding="utf-8")
        assert re.match(r"20\d\d-\d\d-\d\d-", run.name), f"{run.name}: the name starts with its date"
        assert re.search(r"\b[Cc]ommits? [0-9a-f]{7,40}\b", text), f"{run.name} names no commit"
        assert re.search(r"^\s*(latency-predictor|python3? -m) ", text, re.M), f"{run.name} gives no command"
        assert f"results/{run.name}" in pages, f"no page in docs/ quotes {run.name}"
