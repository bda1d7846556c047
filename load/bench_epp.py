"""Scheduling overhead of ``epp_client`` per request: 16 endpoints, the full reference chain
(producer → latency-slo-admitter → strict affinity → SLO tier → loose affinity →
latency scorer → weighted-random picker), plus PreRequest and completion hooks.

Modes (p50/p99/mean per request, in ms):

- ``stub``: an in-process stub predictor (a few arithmetic operations per row), so the
  figure is the library's own cost. Target: p99 <= 0.5 ms.
- ``inprocess``: ``InProcessPredictor`` over the built-in prior bundle (row validation +
  numpy model runtime), what the simulator uses.
- ``server``: a real prediction server started by this benchmark on loopback
  (``python -m prediction_server --port P``), called through ``PredictorClient``, both
  the synchronous path and ``await Scheduler.aschedule`` (asyncio keep-alive client).

    python -m load.bench_epp                       # all modes, 16 endpoints
    python -m load.bench_epp --mode stub --requests 20000 --json out.json
    python -m load.bench_epp --mode stub --config predicted-latency-recommended --inflight 256
    python -m load.bench_epp --mode stub --config predicted-latency-recommended --inflight 256 --prefilling 16
    python -m load.bench_epp --mode prefix         # prefix index + scorer (load.bench_prefix)
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request

from epp_client import Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.framework.loader import build_scheduler
from epp_client.framework.scheduler import Scheduler
from epp_client.predictor import BulkPrediction, InProcessPredictor, PredictorClient
from epp_client.profiles import REFERENCE_CONFIG, config_text
from epp_client.training import ListSink
from load.ports import free_port


class StubPredictor:
    """Cheap deterministic predictions from the rows (no validation, no numpy)."""

    def predict_bulk(self, rows):
        ttft = [40.0 + 0.05 * r["input_token_length"] * (1.0 - r["prefix_cache_score"])
                + 80.0 * r["num_request_waiting"] + 0.02 * r["prefill_tokens_in_flight"] for r in rows]
        tpot = [10.0 + 0.5 * r["num_request_running"] + 8.0 * r["kv_cache_percentage"] for r in rows]
        return BulkPrediction(ttft, tpot, "stub")

    async def apredict_bulk(self, rows):
        return self.predict_bulk(rows)


def make_workload(n_requests: int, n_endpoints: int, seed: int = 1):
    """Endpoint-state snapshots and requests: half with SLO headers, some sheddable."""
    rng = random.Random(seed)
    states = []
    for _ in range(64):
        eps = []
        for i in range(n_endpoints):
            total = rng.randrange(1, 256)
            eps.append(Endpoint(name=f"pod{i // 2}-rank-{i % 2}", address=f"10.0.0.{i // 2}", port=8000 + i % 2,
                                rank=i % 2,
                                metrics=EndpointMetrics(kv_cache_usage=rng.random() * 0.95,
                                                        waiting_queue_size=rng.choice((0, 0, 0, 1, 2, 5)),
                                                        running_requests_size=rng.randrange(0, 32)),
                                prefix_match=PrefixMatch(rng.choice((0, total // 2, total)), total)))
        states.append(eps)
    reqs = []
    for i in range(n_requests):
        h = {}
        if i % 2:
            h["x-llm-d-slo-ttft-ms"] = str(rng.choice((200, 500, 1000, 3000)))
            h["x-llm-d-slo-tpot-ms"] = str(rng.choice((20, 50)))
        reqs.append((states[i % len(states)], h, rng.randrange(16, 8000), -1 if i % 7 == 0 else 0))
    return reqs


def summarize(wall_s: list[float], cpu_s: list[float]) -> dict:
    """Wall-clock and CPU-time (this thread) percentiles. On a shared 2-core machine the
    wall-clock tail includes preemption by other processes (a 4 ms scheduler tick);
    the CPU time is the library's own cost."""
    out: dict = {"n": len(wall_s)}
    for key, samples in (("", wall_s), ("cpu_", cpu_s)):
        xs = sorted(x * 1000.0 for x in samples)
        n = len(xs)
        out[f"{key}p50_ms"] = round(xs[n // 2], 4)
        out[f"{key}p99_ms"] = round(xs[min(n - 1, int(0.99 * n))], 4)
        out[f"{key}p999_ms"] = round(xs[min(n - 1, int(0.999 * n))], 4)
        out[f"{key}mean_ms"] = round(statistics.fmean(xs), 4)
    return out


class _Recorder:
    """Wall and CPU time of each request after the warm-up."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.wall, self.cpu = warmup, [], []
        gc.collect()

    @staticmethod
    def start() -> tuple[float, float]:
        return time.thread_time(), time.perf_counter()

    def stop(self, i: int, started: tuple[float, float]) -> None:
        t1, c1 = time.perf_counter(), time.thread_time()
        if i >= self.warmup:
            self.wall.append(t1 - started[1])
            self.cpu.append(c1 - started[0])

    def summary(self) -> dict:
        return summarize(self.wall, self.cpu)


def _request(prefix: str, i: int, headers: dict, tokens: int, prio: int) -> InferenceRequest:
    return InferenceRequest(request_id=f"{prefix}{i}", headers=dict(headers), input_tokens=tokens, priority=prio)


class _InFlight:
    """Requests kept running after their decision: each gets its first chunk ``prefilling``
    decisions after its own (0: at once) and completes ``n`` decisions after that (0: at once),
    so plugins that read the requests running on an endpoint (the decode-harm-filter) do their
    real work: on requests decoding, and with ``prefilling`` > 0 on requests still prefilling."""

    def __init__(self, sched: Scheduler, n: int, prefilling: int = 0) -> None:
        self.sched, self.n, self.prefilling = sched, n, prefilling
        self.live: collections.deque = collections.deque()
        self.queued: collections.deque = collections.deque()

    def dispatched(self, request_id: str) -> None:
        if self.n <= 0:
            self.sched.on_complete(request_id)
            return
        self.queued.append(request_id)
        if len(self.queued) > self.prefilling:
            first = self.queued.popleft()
            self.sched.on_first_chunk(first, tokens=1)
            self.live.append(first)
        if len(self.live) > self.n:
            self.sched.on_complete(self.live.popleft())


def run_sync(sched: Scheduler, workload, warmup: int = 500, inflight: int = 0, prefilling: int = 0) -> dict:
    rec, running = _Recorder(warmup), _InFlight(sched, inflight, prefilling)
    for i, (eps, headers, tokens, prio) in enumerate(workload):
        req = _request("r", i, headers, tokens, prio)
        started = rec.start()
        res = sched.schedule(req, eps)
        if res.ok:
            sched.pre_request(req, res)
        rec.stop(i, started)
        if res.ok:
            running.dispatched(req.request_id)
    return rec.summary()


async def run_async(sched: Scheduler, workload, warmup: int = 500, inflight: int = 0, prefilling: int = 0) -> dict:
    rec, running = _Recorder(warmup), _InFlight(sched, inflight, prefilling)
    for i, (eps, headers, tokens, prio) in enumerate(workload):
        req = _request("a", i, headers, tokens, prio)
        started = rec.start()
        res = await sched.aschedule(req, eps)
        if res.ok:
            sched.pre_request(req, res)
        rec.stop(i, started)
        if res.ok:
            running.dispatched(req.request_id)
    return rec.summary()



def start_prediction_server(timeout: float = 30.0) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", LATENCY_LOG_LEVEL="warning")
    proc = subprocess.Popen([sys.executable, "-m", "prediction_server", "--host", "127.0.0.1", "--port", str(port),
                             "--training-server-url", ""], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            raise RuntimeError(f"prediction server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("prediction server did not start")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bench(mode: str, n_requests: int, n_endpoints: int, config: str = REFERENCE_CONFIG, inflight: int = 0,
          prefilling: int = 0) -> dict:
    """``config``: EndpointPickerConfig YAML text (default llm-d's reference wiring); ``inflight``:
    requests kept running per decision, ``prefilling`` of them still before their first chunk
    (stub and inprocess modes)."""
    workload = make_workload(n_requests, n_endpoints)
    out: dict = {}
    if mode in ("stub", "all"):
        s = build_scheduler(config, predictor=StubPredictor(), sink=ListSink(1000), rng=random.Random(1))
        out["stub_sync"] = run_sync(s, workload, inflight=inflight, prefilling=prefilling)
        s = build_scheduler(config, predictor=StubPredictor(), sink=ListSink(1000), rng=random.Random(1))
        out["stub_async"] = asyncio.run(run_async(s, workload, inflight=inflight, prefilling=prefilling))
    if mode in ("inprocess", "all"):
        from features.loaded import LoadedBundle

        bundle = LoadedBundle.builtin_prior()
        s = build_scheduler(config, predictor=InProcessPredictor(lambda: bundle), sink=ListSink(1000),
                            rng=random.Random(1))
        out["inprocess_prior"] = run_sync(s, workload, inflight=inflight, prefilling=prefilling)
    if mode in ("server", "all"):
        proc, url = start_prediction_server()
        try:
            n = min(n_requests, 5000)
            client = PredictorClient([url], deadline_ms=1000)
            s = build_scheduler(REFERENCE_CONFIG, predictor=client, sink=ListSink(1000), rng=random.Random(1))
            out["server_sync"] = run_sync(s, workload[:n])

            async def go():
                aclient = PredictorClient([url], deadline_ms=1000)
                sa = build_scheduler(REFERENCE_CONFIG, predictor=aclient, sink=ListSink(1000),
                                     rng=random.Random(1))
                r = await run_async(sa, workload[:n])
                r["fallbacks"] = aclient.metrics.fallbacks
                await aclient.aclose()
                return r

            out["server_async"] = asyncio.run(go())
            out["server_sync"]["fallbacks"] = client.metrics.fallbacks
            client.close()
        finally:
            stop(proc)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("stub", "inprocess", "server", "all", "prefix"), default="all")
    ap.add_argument("--requests", type=int, default=None,
                    help="requests (default 10000; prefix mode: decisions per cell, default 2000)")
    ap.add_argument("--endpoints", type=int, default=16)
    ap.add_argument("--fresh-index", action="store_true",
                    help="prefix mode: time from a fresh index (the LRUs still growing) instead of full LRUs")
    ap.add_argument("--config", default=None,
                    help="EndpointPickerConfig YAML file or well-known name (default: llm-d's reference wiring)")
    ap.add_argument("--inflight", type=int, default=0,
                    help="stub/inprocess modes: requests kept running (first chunk received), each completed this "
                         "many decisions after its own; 0 completes each at once")
    ap.add_argument("--prefilling", type=int, default=0,
                    help="with --inflight: each request gets its first chunk this many decisions after its own, so "
                         "about this many are prefilling at any time (0: every request decodes at once)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    if args.inflight < 0:
        ap.error("--inflight must be >= 0")
    if args.prefilling < 0:
        ap.error("--prefilling must be >= 0")
    if args.mode == "prefix":
        return _main_prefix(args)
    if args.requests is None:
        args.requests = 10000
    if args.requests <= 500:
        ap.error("--requests must be > 500 (the first 500 are warm-up)")
    res = {"endpoints": args.endpoints, "requests": args.requests, "python": sys.version.split()[0],
           "config": args.config or "llm-d reference", "inflight": args.inflight,
           "prefilling": args.prefilling,
           "results": bench(args.mode, args.requests, args.endpoints,
                            config_text(args.config) if args.config else REFERENCE_CONFIG, args.inflight,
                            args.prefilling)}
    for name, r in res["results"].items():
        extra = f"  fallbacks={r['fallbacks']}" if "fallbacks" in r else ""
        print(f"{name:16s} n={r['n']:6d}  wall p50={r['p50_ms']:.3f} p99={r['p99_ms']:.3f} "
              f"mean={r['mean_ms']:.3f} ms   cpu p50={r['cpu_p50_ms']:.3f} p99={r['cpu_p99_ms']:.3f} ms{extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def _main_prefix(args) -> int:
    """Approximate prefix index + prefix scorer per decision (``load.bench_prefix``)."""
    from load.bench_prefix import bench_prefix, table

    n = args.requests if args.requests is not None else 2000
    if n < 100:
        raise SystemExit("bench_epp: --requests must be >= 100 in prefix mode")
    res = {"endpoints": args.endpoints, "decisions_per_cell": n, "python": sys.version.split()[0],
           "steady_state": not args.fresh_index,
           "results": bench_prefix(n, args.endpoints, _Recorder, steady=not args.fresh_index)}
    print(table(res["results"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
