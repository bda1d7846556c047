"""Capacity at SLO (``simulate --capacity``): per policy, the highest load at which SLO attainment
stays >= 90%, found by narrowing a bracket over the load scale (DistServe's goodput definition).

Per policy the search runs the scenario at load 1.0, then steps up (x1.25) while the attainment
holds, or down while it does not (by the attainment's shortfall: x attainment / 90%, between
x0.5 and x0.8), until one load holds and a higher one fails; then it
narrows that bracket until its width is at most 2% of the lower end. Each narrowing probe is placed
where the line through the bracket's two attainments crosses 90% (regula falsi), kept at least 2%
of the lower end inside either end, so that a probe on the side it leans to closes the bracket;
where the last probe did not halve the bracket, the next one halves it (bisection), so a search
needs at most about twice bisection's probes and, where attainment falls smoothly, fewer. The
capacity is the lower end (the highest load run that held), as a fraction of the pool's analytic
capacity and in requests/s. The search assumes attainment falls with load; every probe is kept in the results,
so a non-monotone policy shows. The policies' searches run side by side in ``--workers``
processes (each probe is one ordinary run: same seed, same arrivals scaled to the load); a
worker with no probe of its own to run takes the next of another search: the next step up or
down while a bracket is sought, or the middle of the widest gap left in the bracket between the
loads already running, so a search with more workers narrows its bracket more per round.

A probe ends as soon as its outcome is decided: once more requests are known to miss their SLO
than 10% of the arrivals allow (``misses_allowed``), its attainment is certainly below 90% and
the rest of the run cannot change that (``bench.RunOptions.stop_below``). Such a probe records
the attainment it could at most have reached and the share of arrivals routed when it was
decided (``decided_at``); a step down from it is sized by the misses among the arrivals routed
by then. Probes that hold always run to the end, so every figure reported at the capacity is a
full run's.

``--from-sweep DIR`` starts the searches from a sweep's runs (``simulate --out DIR`` with the
same scenario, seed and options, checked against its ``meta.run_key``): each of its (load,
policy) runs is that policy's probe at that load, so a search usually starts with a bracket.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TARGET = 0.9          # attainment that must hold
TOLERANCE = 0.02      # bracket width relative to its lower end
STEP_UP, STEP_DOWN = 1.25, 0.8
MIN_LOAD, MAX_LOAD = 0.05, 10.0
#: the policies ``--capacity`` compares when none are given
DEFAULT_POLICIES = ("predicted", "llmd-token-load", "llmd-default")
PROBE_KEYS = ("slo_attainment", "goodput_rps", "ttft_p99_ms", "tpot_p99_ms", "abandoned", "shed", "preemptions")


def misses_allowed(n: int, target: float = TARGET) -> int:
    """The most misses among ``n`` arrivals that still leave attainment (met / n) >= ``target``
    (-1 when even none does)."""
    k = n - int(target * n)
    while k >= 0 and (n - k) / n < target:
        k -= 1
    while k + 1 <= n and (n - k - 1) / n >= target:
        k += 1
    return k


def attainment_estimate(probe: dict) -> float:
    """A probe's attainment, or for one decided early the share met among the arrivals routed by
    then (the misses so far over them): what a step down is sized by."""
    at = probe.get("decided_at")
    if at is None:
        return float(probe["slo_attainment"] or 0.0)
    routed = at * probe["requests"]
    return max(0.0, 1.0 - probe["known_misses"] / routed) if routed > 0 else 0.0


@dataclass
class Search:
    """One policy's bisection: ``lo`` the highest load that held, ``hi`` the lowest that failed."""

    policy: str
    target: float = TARGET
    tolerance: float = TOLERANCE
    start: float = 1.0
    lo: float | None = None
    hi: float | None = None
    probes: list[dict] = field(default_factory=list)
    #: place the bracket's narrowing probes by the attainments (module doc); False: halve the bracket
    guided: bool = True
    #: the bracket's width after each probe recorded once there was one
    widths: list[float] = field(default_factory=list)

    def next_load(self, inflight: Sequence[float] = ()) -> float | None:
        """The next load to run while ``inflight`` loads are running; None when there is none to
        run now (the search is over, or it waits for a running probe)."""
        lo, hi = self.lo, self.hi
        if lo is None and hi is None:
            return None if inflight else self.start
        if lo is None:
            assert hi is not None   # down by the attainment's shortfall, between x0.5 and x0.8
            att = attainment_estimate(next(p for p in self.probes if p["load"] == hi))
            x = min([hi, *inflight]) * min(STEP_DOWN, max(0.5, att / self.target))
            return None if x < MIN_LOAD else round(x, 4)
        if hi is None:
            x = max([lo, *inflight]) * STEP_UP
            return None if x > MAX_LOAD else round(x, 4)
        if lo >= hi:        # a load failed below one that held: not monotone, nothing left to narrow
            return None
        if self.guided and not any(lo < x < hi for x in inflight):
            x = self._guided(lo, hi)
            if x is not None:
                return x
        # the widest gap between the bracket's ends and the loads running inside it, halved
        cuts = sorted({lo, hi, *(x for x in inflight if lo < x < hi)})
        width, neg_left = max((b - a, -a) for a, b in zip(cuts, cuts[1:]))   # ties: the lower gap
        left = -neg_left
        if width <= self.tolerance * lo:
            return None
        x = round(left + width / 2.0, 4)
        return None if x in inflight else x

    def _guided(self, lo: float, hi: float) -> float | None:
        """The bracket's next probe where its attainments' line crosses the target, at least
        ``tolerance * lo`` inside either end; None where the bracket is too narrow for that, or
        the last probe recorded did not halve it (then the bracket is halved)."""
        width, w = hi - lo, self.widths
        if len(w) >= 2 and w[-1] > w[-2] / 2.0 + 1e-4:     # the last probe did not halve it: halve it now
            return None
        least = math.floor(lo * (1.0 + self.tolerance) * 1e4) / 1e4   # failing there closes the bracket
        if least - lo > self.tolerance * lo:      # (as the bracket's width is compared, in floats)
            least = round(least - 1e-4, 4)
        most = math.ceil((hi - self.tolerance * lo) * 1e4) / 1e4      # holding there closes it too
        if not lo < least < most < hi:
            return None
        att_lo = attainment_estimate(next(p for p in self.probes if p["load"] == lo))
        att_hi = attainment_estimate(next(p for p in self.probes if p["load"] == hi))
        share = (att_lo - self.target) / (att_lo - att_hi) if att_lo > att_hi else 0.5
        return round(min(most, max(least, lo + share * width)), 4)

    def record(self, load: float, metrics: dict, wall_s: float = 0.0, cpu_s: float = 0.0, reused: bool = False) -> None:
        att = float(metrics.get("slo_attainment") or 0.0)
        early = {k: metrics[k] for k in ("decided_at", "known_misses", "requests") if k in metrics} \
            if "decided_at" in metrics else {}
        self.probes.append({"load": load, **{k: metrics.get(k, 0) for k in PROBE_KEYS}, **early, "wall_s": wall_s,
                            "cpu_s": cpu_s, **({"reused": True} if reused else {})})
        if att >= self.target:
            self.lo = load if self.lo is None else max(self.lo, load)
        else:
            self.hi = load if self.hi is None else min(self.hi, load)
        if self.lo is not None and self.hi is not None:
            self.widths.append(self.hi - self.lo)

    def result(self, capacity_rps: float) -> dict:
        cap = self.lo or 0.0
        at = next((p for p in self.probes if p["load"] == self.lo), {})
        return {"capacity": cap, "capacity_rps": cap * capacity_rps, "bracket": [self.lo, self.hi],
                "at_capacity": at, "probes": sorted(self.probes, key=lambda p: p["load"]),
                "wall_s": sum(p["wall_s"] for p in self.probes if not p.get("reused")),
                "cpu_s": sum(p["cpu_s"] for p in self.probes if not p.get("reused")),
                "reused": sum(1 for p in self.probes if p.get("reused"))}


#: a sweep's runs of one policy: (load, metrics, wall s, CPU s)
Known = dict[str, list[tuple[float, dict, float, float]]]


def from_sweep(path: Path, key: dict) -> Known:
    """The runs of a sweep's results.json (``path``, or the directory holding it) whose
    ``meta.run_key`` equals ``key`` (``bench.run_key``); ValueError naming what differs."""
    from .report import _clean

    path = path / "results.json" if path.is_dir() else path
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--from-sweep: cannot read {path}: {e}") from None
    meta = d.get("meta") or {}
    got = meta.get("run_key")
    if not isinstance(got, dict) or "results" not in d:
        raise ValueError(f"--from-sweep: {path} is not a sweep's results.json with a run_key (a one-seed sweep "
                         "of this version of simulate)")
    want = json.loads(json.dumps(_clean(key)))
    diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    if diff:
        raise ValueError("--from-sweep: the sweep ran with other settings: "
                         + "; ".join(f"{k} {got.get(k)!r}, here {want.get(k)!r}" for k in diff))
    wall, cpu = meta.get("wall_s") or {}, meta.get("cpu_s") or {}
    out: Known = {}
    for label, per in d["results"].items():
        for pol, m in per.items():
            out.setdefault(pol, []).append((float(meta["load_share"][label]), m, wall.get(f"{label}|{pol}", 0.0),
                                            cpu.get(f"{label}|{pol}", 0.0)))
    return out


def _searches(policies: Sequence[str], start: float, known: Known | None) -> dict[str, Search]:
    """A search per policy, with the runs ``known`` for it recorded as its probes."""
    out = {}
    for pol in policies:
        s = out[pol] = Search(pol, start=start)
        for load, m, w, c in (known or {}).get(pol, ()):
            s.record(load, m, w, c, reused=True)
    return out


def search(policies: Sequence[str], run: Callable[[float, str], tuple[dict, float, float]], capacity_rps: float,
           start: float = 1.0, known: Known | None = None) -> dict[str, dict]:
    """Sequential searches: ``run(load, policy)`` -> (metrics, wall s, CPU s)."""
    out = {}
    for pol, s in _searches(policies, start, known).items():
        while (x := s.next_load()) is not None:
            m, w, c = run(x, pol)
            s.record(x, m, w, c)
        out[pol] = s.result(capacity_rps)
    return out


def run(scenario, arrivals, capacity_rps: float, policies: Sequence[str], opts, workers: int,
        start: float = 1.0, log: Callable[[str], None] | None = None, early_stop: bool = True,
        known: Known | None = None) -> dict[str, dict]:
    """Every policy's capacity at SLO on the scenario (probes of all policies in ``workers`` processes);
    ``early_stop``: a probe ends once it certainly fails; ``known``: runs to start from (module doc)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    from . import bench, parallel

    say = log or (lambda _msg: None)
    if early_stop:
        opts = dataclasses.replace(opts, stop_below=TARGET)
    if workers <= 1:
        def one(load: float, pol: str) -> tuple[dict, float, float]:
            t0, c0 = time.monotonic(), time.process_time()
            m, _, _ = bench.run_one(scenario, arrivals, capacity_rps, load, pol, opts)
            say(f"{pol} at load {load:g}: {outcome(m)}")
            return m, time.monotonic() - t0, time.process_time() - c0
        return search(policies, one, capacity_rps, start, known)
    searches = _searches(policies, start, known)
    workers = min(workers, 4 * len(policies))
    with parallel.pool(scenario, arrivals, capacity_rps, opts, workers) as ex:
        pending: dict = {}

        def fill() -> None:
            """Give every idle worker the next probe of the search with the fewest running."""
            while len(pending) < workers:
                running = {p: [x for q, x in pending.values() if q == p] for p in searches}
                for pol in sorted(searches, key=lambda p: len(running[p])):
                    x = searches[pol].next_load(running[pol])
                    if x is not None:
                        pending[ex.submit(parallel.work, x, pol)] = (pol, x)
                        break
                else:
                    return

        fill()
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                pol, x = pending.pop(fut)
                m, _, _, w, c = fut.result()
                searches[pol].record(x, m, w, c)
                say(f"{pol} at load {x:g}: {outcome(m)} ({w:.0f} s, CPU {c:.0f} s)")
            fill()
    return {p: s.result(capacity_rps) for p, s in searches.items()}


def outcome(probe: dict) -> str:
    """A probe's attainment, or for one decided early the bound it stayed under."""
    if probe.get("decided_at") is None:
        return f"attainment {100 * probe['slo_attainment']:.1f}%"
    return (f"attainment < {100 * probe['slo_attainment']:.1f}% (decided at {100 * probe['decided_at']:.0f}% of "
            "arrivals)")


def table(caps: dict[str, dict]) -> list[str]:
    rows = ["| policy | capacity at SLO (load) | requests/s | bracket (held, failed) | attainment there | "
            "TTFT p99 there (s) | abandoned | shed | probes | wall s | CPU s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for pol, c in caps.items():
        at = c["at_capacity"]
        lo, hi = c["bracket"]
        rows.append(f"| {pol} | {c['capacity']:.3f} | {c['capacity_rps']:.3f} | "
                    f"{'–' if lo is None else f'{lo:g}'}, {'–' if hi is None else f'{hi:g}'} | "
                    + (f"{100 * at['slo_attainment']:.1f}% | {(at['ttft_p99_ms'] or 0) / 1000:.2f} | "
                       f"{at['abandoned']} | {at['shed']}" if at else "– | – | – | –")
                    + f" | {len(c['probes'])} | {c['wall_s']:.0f} | {c['cpu_s']:.0f} |")
    return rows


def write(out: Path, scenario, seed: int, caps: dict[str, dict], meta: dict) -> Path:
    """results.json (``capacity`` per policy with every probe) and report.md (verdict first)."""
    from . import verdict
    from .report import _clean

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(_clean({"scenario": scenario.name, "seed": seed, "capacity": caps,
                                                         "meta": meta}), indent=1))
    lines = [f"# Capacity at SLO: `{scenario.name}` (seed {seed})", "", *verdict.lines({}, caps),
             f"- Workload: {scenario.description}.", f"- Cluster: {scenario.cluster_desc()}.",
             f"- Capacity at SLO = the highest load (fraction of the pool's analytic capacity, "
             f"{meta.get('capacity_rps', 0):.3f} requests/s at 1.0) at which SLO attainment over all arrivals "
             f"stays >= {100 * TARGET:g}%, its bracket narrowed to {100 * TOLERANCE:g}% (`load/sim/capacity.py`).",
             f"- Search wall time: {meta.get('wall_s', 0):.0f} s with {meta.get('workers', 1)} worker(s); CPU time "
             f"of all probes: {sum(c['cpu_s'] for c in caps.values()):.0f} s.", "",
             *table(caps), "", "## Probes", ""]
    for pol, c in caps.items():
        lines.append(f"- `{pol}`: " + ", ".join(f"{p['load']:g}: {outcome(p)}" for p in c["probes"]))
    p = out / "report.md"
    p.write_text("\n".join(lines) + "\n")
    return p
