"""The one workload parameter the runs do not record, fitted on a stack's lowest-QPS run.

Which prompts continue an earlier one (and so can reuse its cached KV) is not in the CSVs,
but it shows at low load: a request whose TTFT is under half the time its prompt takes to
prefill from scratch on the preset (``FAST``) reused cached tokens. ``fit_continued``
chooses the share of continued prompts whose simulated fast share on the lowest-QPS run
matches the measured one; the other runs are predicted with it.
"""
from __future__ import annotations

from collections.abc import Sequence

from load.sim.stepmodel import ServerSpec
from load.sim.workloads import isolated_prefill_ms

from .replay import replay
from .runs import Run

FAST = 0.5
GRID = tuple(k / 20 for k in range(19))      # 0, 0.05, ..., 0.9


def fast_share(spec: ServerSpec, prompts: Sequence[int], ttft_s: Sequence[float]) -> float:
    """Share of requests with a TTFT under ``FAST`` x their prompt's isolated prefill time."""
    if not prompts:
        return float("nan")
    n = sum(1 for p, t in zip(prompts, ttft_s) if t * 1000.0 < FAST * isolated_prefill_ms(spec, p))
    return n / len(prompts)


def measured_fast_share(run: Run, spec: ServerSpec) -> float:
    return fast_share(spec, [r.prompt_tokens for r in run.rows], [r.ttft_s for r in run.rows])


def fit_continued(run: Run, spec: ServerSpec, replicas: int, policy: str, seed: int = 0) -> tuple[float, float, float]:
    """(fitted share of continued prompts, measured fast share, simulated fast share at the fit)."""
    target = measured_fast_share(run, spec)
    best = (float("inf"), 0.0, float("nan"))
    for share in GRID:
        rp = replay(run, spec, replicas, policy, share, seed)
        done = [r for r in rp.requests if r.done and not r.shed]
        got = fast_share(spec, [r.input_len for r in done], [r.ttft_ms / 1000.0 for r in done])
        if abs(got - target) < best[0] - 1e-12:
            best = (abs(got - target), share, got)
    return best[1], target, best[2]
