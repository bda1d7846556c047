"""The verdict at the top of ``report.md`` (docs/evaluation.md §4, "Capacity at SLO and the verdict").

The recommended profile (``predicted``) is compared with the best heuristic: llm-d's default
scorers or its token-load routing, each with or without llm-d's flow control in front
(``<router>+<ordering>``, e.g. ``llmd-token-load+fcfs``), whichever has the highest SLO
attainment at that load (ties: the lower TTFT p99). The recommended profile wins a load only
with a higher attainment **and** a TTFT p99 at most 1.5x the best heuristic's **and** no more
abandoned requests; a gain in attainment bought with a longer tail or more abandoned clients is
a loss. Shed (429) and abandoned requests are misses in the attainment (over all arrivals).
With capacities (``simulate --capacity``), the ratio of the capacities at SLO is the headline.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

RECOMMENDED = "predicted"
HEURISTICS = ("llmd-default", "llmd-token-load")
_ALIASES = {"default": "llmd-default", "token-load": "llmd-token-load"}
TAIL_FACTOR = 1.5


def is_heuristic(policy: str) -> bool:
    """A heuristic the verdict compares with: one of HEURISTICS, with or without flow control."""
    base = policy.split("+", 1)[0]
    return _ALIASES.get(base, base) in HEURISTICS


def _num(m: Mapping, key: str) -> float:
    v = m.get(key, 0)
    return float("nan") if v is None else float(v)


def best_heuristic(per_policy: Mapping[str, Mapping]) -> str | None:
    """The heuristic with the highest attainment (then the lowest TTFT p99), None when none ran."""
    cands = [p for p in per_policy if is_heuristic(p)]
    if not cands:
        return None

    def key(p: str) -> tuple[float, float]:
        tail = _num(per_policy[p], "ttft_p99_ms")
        return (-_num(per_policy[p], "slo_attainment"), tail if math.isfinite(tail) else math.inf)
    return min(cands, key=key)


def judge_load(rec: Mapping, best: Mapping) -> tuple[bool, list[str]]:
    """(wins, the conditions it fails) of the recommended profile's metrics against the best heuristic's."""
    fails = []
    if not _num(rec, "slo_attainment") > _num(best, "slo_attainment"):
        fails.append("attainment not higher")
    tail, best_tail = _num(rec, "ttft_p99_ms"), _num(best, "ttft_p99_ms")
    if not tail <= TAIL_FACTOR * best_tail:
        fails.append(f"TTFT p99 over {TAIL_FACTOR:g}x")
    if not _num(rec, "abandoned") <= _num(best, "abandoned"):
        fails.append("more abandoned")
    return not fails, fails


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "–"


def _s(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if math.isfinite(ms) else "–"


def lines(results: Mapping[str, Mapping[str, Mapping]], capacities: Mapping[str, Mapping] | None = None,
          recommended: str = RECOMMENDED) -> list[str]:
    """The verdict as markdown lines (empty when the run has no recommended profile or no heuristic)."""
    out: list[str] = []
    for label, per in results.items():
        if recommended not in per:
            continue
        best = best_heuristic(per)
        if best is None:
            continue
        rec, b = per[recommended], per[best]
        wins, fails = judge_load(rec, b)
        out.append(f"- load {label}: `{recommended}` **{'wins' if wins else 'does not win'}** against `{best}`: "
                   f"attainment {_pct(_num(rec, 'slo_attainment'))} vs {_pct(_num(b, 'slo_attainment'))}, "
                   f"TTFT p99 {_s(_num(rec, 'ttft_p99_ms'))} vs {_s(_num(b, 'ttft_p99_ms'))}, "
                   f"abandoned {_num(rec, 'abandoned'):g} vs {_num(b, 'abandoned'):g}, "
                   f"shed {_num(rec, 'shed'):g} vs {_num(b, 'shed'):g}"
                   + (f" ({'; '.join(fails)})" if fails else ""))
    if capacities and recommended in capacities:
        heur = {p: c for p, c in capacities.items() if is_heuristic(p)}
        if heur:
            best = max(heur, key=lambda p: heur[p]["capacity"])
            rec_c, best_c = capacities[recommended]["capacity"], heur[best]["capacity"]
            ratio = rec_c / best_c if best_c > 0 else math.inf
            out.insert(0, f"- capacity at SLO: `{recommended}` {rec_c:.3f} vs `{best}` {best_c:.3f} "
                          f"(fraction of the pool's capacity): **{ratio:.2f}x** the best heuristic's")
    if not out:
        return []
    return ["## Verdict", "",
            f"The recommended profile (`{recommended}`) against the best heuristic (llm-d default or token-load, "
            "with or without flow control) at each load: it wins only with higher attainment, TTFT p99 <= "
            f"{TAIL_FACTOR:g}x and abandoned <= the heuristic's (docs/evaluation.md §4).", "", *out, ""]


def prepend(report, text_lines: list[str]) -> None:
    """Insert the verdict under the report's title (``report`` a path to report.md)."""
    if not text_lines:
        return
    from pathlib import Path

    p = Path(report)
    head, _, rest = p.read_text().partition("\n")
    p.write_text("\n".join([head, "", *text_lines]) + rest)
