"""Run independent (load, policy) simulations in worker processes (``simulate --workers N``).

Every run builds its own router, servers and requests from the scenario, the arrivals and the
seed, so a run's figures do not depend on which process runs it or in which order: the results
are the ones of a sequential run, gathered back in the sweep's order. Workers are forked (the
scenario, whose workload is a closure, and the arrivals are inherited, not pickled); each returns
only the metrics, the raw latency arrays and the router's one-line note.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from . import bench

#: (scenario, arrivals, capacity, opts) of the sweep, set in each forked worker by _init
_shared: tuple | None = None


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:      # not on Linux
        return max(1, os.cpu_count() or 1)


def router_note(router) -> str:
    return getattr(router, "description", "") or " ".join((router.__doc__ or "").strip().split("\n\n")[0].split())


def _timed(scenario, arrivals, capacity, load: float, policy: str, opts: bench.RunOptions, progress=None):
    t0, c0 = time.monotonic(), time.process_time()
    m, raw, router = bench.run_one(scenario, arrivals, capacity, load, policy, opts, progress)
    return m, raw, router_note(router), time.monotonic() - t0, time.process_time() - c0


def _init(shared: tuple) -> None:
    global _shared
    _shared = shared


def work(load: float, policy: str):
    """One (load, policy) run in a worker of :func:`pool`: (metrics, raw, note, wall s, cpu s)."""
    assert _shared is not None, "worker not initialised"
    scenario, arrivals, capacity, opts = _shared
    return _timed(scenario, arrivals, capacity, load, policy, opts)


def pool(scenario, arrivals: Sequence, capacity: float, opts: bench.RunOptions, workers: int) -> ProcessPoolExecutor:
    """``workers`` forked processes sharing the sweep's scenario, arrivals, capacity and options;
    submit :func:`work` to them."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_init,
                               initargs=((scenario, arrivals, capacity, opts),))


def _cost(load: float, policy: str) -> tuple:
    """Longest runs first (the predicted policies train models; higher loads run longer), so the
    last run to finish is a short one."""
    heavy = 2 if "predicted" in policy else 1 if policy.startswith("oracle") else 0
    return (-heavy, -load)


def run_sweep(scenario, arrivals: Sequence, capacity: float, loads: Sequence[tuple[str, float]],
              policies: Sequence[str], opts: bench.RunOptions, workers: int, bar) -> dict:
    """{(load label, policy): (metrics, raw, note, wall s, cpu s)} in the sweep's order
    (loads, then policies); ``workers`` > 1 runs them in that many forked processes."""
    jobs = [(label, load, pol) for label, load in loads for pol in policies]
    workers = min(workers, len(jobs))
    if workers <= 1 or opts.record_trace is not None or "fork" not in multiprocessing.get_all_start_methods():
        out = {}
        for label, load, pol in jobs:       # in-process: one trace file in run order, live progress
            bar.start(f"load {label} {pol}")
            out[(label, pol)] = _timed(scenario, arrivals, capacity, load, pol, opts, bar.update)
            bar.finish_run()
        return out
    done: dict = {}
    with pool(scenario, arrivals, capacity, opts, workers) as ex:
        futures = {ex.submit(work, load, pol): (label, pol)
                   for label, load, pol in sorted(jobs, key=lambda j: _cost(j[1], j[2]))}
        bar.start(f"{workers} workers")
        for fut in as_completed(futures):
            done[futures[fut]] = fut.result()
            bar.label = f"{workers} workers, done load {futures[fut][0]} {futures[fut][1]}"
            bar.finish_run()
    return {(label, pol): done[(label, pol)] for label, _, pol in jobs}
