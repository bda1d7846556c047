"""No test asserts a wall-clock bound: on a busy CI machine any bound is crossed now and then
(two such assertions failed a clean run). A test shows "did not wait" with an ordering witness
(the server had not answered yet) or an injected clock instead; a timeout that only stops a
hang is fine."""
from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCK = r"time\.(?:monotonic|perf_counter|time)\(\)"
TIMED = r"(?:elapsed\w*|took\w*|t_first|dt|latencies|waited\w*(?:\[\d+\])?|duration\w*)"
BOUND = re.compile(
    rf"^\s*assert\b.*(?:{CLOCK}\s*-\s*\w+\s*[<>]"          # assert time.monotonic() - t0 < 5
    rf"|\b{TIMED}\)?\s*[<>]=?\s*(?!{TIMED})[\w.(]"         # assert elapsed < 0.5, max(latencies) < x
    rf"|(?<![\d.])(?!0(?:\.0*)?\s)\d[\d.]*\s*[<>]=?\s*{TIMED})")  # assert 20.0 <= waited[1] (0 < x is no bound)


def offenders(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if BOUND.search(line)]


def test_the_pattern_finds_the_bounds_it_is_for():
    found = offenders("\n".join([
        "        assert time.monotonic() - t0 < 1.0  # did not wait",
        "        assert res.ok and elapsed < 0.5",
        "        assert t_first < 0.6",
        "            assert max(latencies) < SYNC_TIMEOUT / 10",
        "        assert 20.0 <= waited[1]",
        "    assert time.perf_counter() - start > 2",
    ]))
    assert len(found) == 6, found
    assert offenders("\n".join([
        "    deadline = time.monotonic() + 30",
        "    while time.monotonic() < deadline:",
        "        assert time.monotonic() < end, 'server never became ready'",
        "    assert waited[0] == 0.0 < waited[1] < waited[2]  # an ordering witness",
        "    assert rec.tpot_ms >= 290",
    ])) == []


def test_no_test_asserts_a_wall_clock_bound():
    found = {p.name: offenders(p.read_text()) for p in sorted(TESTS.rglob("*.py")) if p.name != Path(__file__).name}
    assert {name: lines for name, lines in found.items() if lines} == {}
