"""What the runs do not record, fitted on a stack's lowest-QPS run and predicted for the others.

- The engine's fixed cost per step (``fit_step_floor``: the preset's ``c_fix``, kernel
  launches, sampler, scheduler; what CUDA graphs and the vLLM build change): at low load
  nearly every step is a small decode batch, so the TPOT median is the step time. ``c_fix``
  is moved by the measured minus simulated TPOT median on the lowest-QPS run (twice, the
  second pass correcting the first), never below 0.
- The request timeout (``fit_timeout``): a request that takes longer than the stack's timeout
  is cut off and not recorded. A lowest-QPS run that lost requests (put back by ``lost``) shows
  it: the timeout is the smallest whole number of seconds above every recorded request's
  launch-to-last-token time. A run that lost none has no timeout.
- Which prompts continue an earlier one (and so can reuse its cached KV) is not in the CSVs,
  but it shows at low load: a request whose TTFT is under half the time its prompt takes to
  prefill from scratch on the preset (``FAST``) reused cached tokens. ``fit_continued``
  chooses the share of continued prompts whose simulated fast share on the lowest-QPS run
  matches the measured one.
- The cost of a prompt's prefill (``fit_prefill_scale``: a stack that loads part of each prompt's KV
  instead of computing it, as LMCache's CPU tier does with prompts an earlier run sent, computes
  less per prompt token): where the simulated TTFT median on the lowest-QPS run at the fitted share
  is above the measured one, the per-token and prefill-attention costs of a step are scaled down
  (``load.sim.engines.scaled``, one factor for both, at least ``MIN_PREFILL_SCALE``) until the
  medians meet, ``c_fix`` refitted at each factor.
- The fixed latency outside the engine's steps (``fit_latency``: HTTP, the gateway and its
  endpoint picker): the measured TTFT median minus the simulated one on the lowest-QPS run at
  the fitted share and prefill cost, if positive (else 0).

The TTFT median of the lowest-QPS run is so matched from one side or the other: by a cheaper
prefill where the simulated one is above it, by a latency outside the engine where it is below.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from load.sim.engines import scaled
from load.sim.stepmodel import ServerSpec
from load.sim.workloads import isolated_prefill_ms

from .replay import Replay, finished, replay
from .runs import Run, measured

FAST = 0.5
GRID = tuple(k / 20 for k in range(19))      # 0, 0.05, ..., 0.9
MIN_PREFILL_SCALE = 0.2
SCALE_HALVINGS = 10


def fast_share(spec: ServerSpec, prompts: Sequence[int], ttft_s: Sequence[float]) -> float:
    """Share of requests with a TTFT under ``FAST`` x their prompt's isolated prefill time."""
    if not prompts:
        return float("nan")
    n = sum(1 for p, t in zip(prompts, ttft_s) if t * 1000.0 < FAST * isolated_prefill_ms(spec, p))
    return n / len(prompts)


def measured_fast_share(run: Run, spec: ServerSpec) -> float:
    return fast_share(spec, [r.prompt_tokens for r in run.rows], [r.ttft_s for r in run.rows])


STEP_PASSES = 2


def fit_step_floor(run: Run, spec: ServerSpec, replicas: int, policy: str, seed: int = 0,
                   timeout_s: float | None = None) -> ServerSpec:
    """``spec`` with ``c_fix`` (ms per step) fitted to the run's TPOT median."""
    want = float(np.median([r.tpot_ms for r in run.rows if r.output_tokens > 1]))
    for _ in range(STEP_PASSES):
        got = replay(run, spec, replicas, policy, 0.0, seed, timeout_s).stats["tpot_p50"]
        spec = spec.with_overrides({"c_fix": max(0.0, spec.c_fix + want - got)})
    return spec


def fit_timeout(run: Run) -> float | None:
    """The request timeout (s) a run that lost requests shows; None if it lost none."""
    if not run.lost:
        return None
    return float(math.floor(max(r.e2e_s for r in run.rows)) + 1)


def fit_continued(run: Run, spec: ServerSpec, replicas: int, policy: str, seed: int = 0,
                  timeout_s: float | None = None) -> tuple[float, float, float, Replay]:
    """(fitted share of continued prompts, measured fast share, simulated fast share at the fit,
    the replay at the fit)."""
    target = measured_fast_share(run, spec)
    best: tuple = (float("inf"), 0.0, float("nan"), None)
    for share in GRID:
        rp = replay(run, spec, replicas, policy, share, seed, timeout_s)
        done = [r for r in rp.requests if finished(r)]
        got = fast_share(spec, [r.input_len for r in done], [r.ttft_ms / 1000.0 for r in done])
        if abs(got - target) < best[0] - 1e-12:
            best = (abs(got - target), share, got, rp)
    return best[1], target, best[2], best[3]


def fit_latency(run: Run, fitted: Replay) -> float:
    """The fixed latency (s) outside the engine: measured minus simulated TTFT median, if positive."""
    return max(0.0, measured(run)["ttft_p50"] - fitted.stats["ttft_p50"] + fitted.latency_s)


def fit_prefill_scale(run: Run, spec: ServerSpec, replicas: int, policy: str, continued: float, fitted: Replay,
                      seed: int = 0, timeout_s: float | None = None) -> tuple[ServerSpec, float, Replay]:
    """(``spec`` with its prefill cost scaled and ``c_fix`` refitted, the scale, the replay at the
    fit) where ``fitted`` (the replay at ``spec`` and the fitted share) has a TTFT median above the
    run's; else (``spec``, 1.0, ``fitted``)."""
    target = measured(run)["ttft_p50"]
    if fitted.stats["ttft_p50"] <= target:
        return spec, 1.0, fitted

    def at(k: float) -> tuple[ServerSpec, Replay]:
        s = fit_step_floor(run, scaled(spec, per_token_scale=k, prefill_attention_scale=k), replicas, policy, seed,
                           timeout_s)
        return s, replay(run, s, replicas, policy, continued, seed, timeout_s)

    lo, hi = MIN_PREFILL_SCALE, 1.0     # the median is above the measured one at hi
    for _ in range(SCALE_HALVINGS):
        mid = (lo + hi) / 2.0
        if at(mid)[1].stats["ttft_p50"] > target:
            hi = mid
        else:
            lo = mid
    k = (lo + hi) / 2.0
    s, rp = at(k)
    return s, k, rp
