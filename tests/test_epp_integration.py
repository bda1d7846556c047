"""epp_client with the real servers on loopback (subprocesses on free ports): the B2.8
reference wiring schedules 1,000 requests over 8 endpoints with predictions from two
prediction servers, its training samples reach the training server, SLO headers change
the choice; with the prediction servers stopped or answering slowly, scheduling still
returns a pick within the deadline from the composite score and the fallbacks are counted."""
from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import pytest

from epp_client import Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.framework.loader import build_scheduler
from epp_client.predictor import PredictorClient
from epp_client.profiles import REFERENCE_CONFIG
from epp_client.training import TrainingReporter
from load.ports import free_port
from support.inject import inject

pytestmark = pytest.mark.slow


def _get(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, json.loads(r.read() or b"null")


def _start(args: list[str], port: int, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1", LATENCY_LOG_LEVEL="warning", **(env or {}))
    proc = subprocess.Popen([sys.executable, "-m", *args, "--host", "127.0.0.1", "--port", str(port)], env=e,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            raise RuntimeError(f"{args[0]} exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if _get(url + "/healthz", 1)[0] == 200:
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{args[0]} did not start")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    procs = []
    try:
        tp, turl = _start(["training_server", "--data-dir", str(tmp_path_factory.mktemp("training"))], free_port(),
                          {"LATENCY_RETRAINING_INTERVAL_SEC": "1"})
        procs.append(tp)
        purls = []
        for _ in range(2):
            pp, purl = _start(["prediction_server", "--training-server-url", turl, "--sync-interval", "1"],
                              free_port())
            procs.append(pp)
            purls.append(purl)
        yield turl, purls
    finally:
        for p in procs:
            _stop(p)


def cluster():
    """8 endpoints (4 pods × 2 data-parallel ranks) with different load and prefix hits."""
    eps = []
    for i in range(8):
        eps.append(Endpoint(name=f"pod{i // 2}-rank-{i % 2}", address=f"10.1.0.{i // 2}", port=8000 + i % 2,
                            rank=i % 2,
                            metrics=EndpointMetrics(kv_cache_usage=0.1 * i, waiting_queue_size=i // 2,
                                                    running_requests_size=2 * i),
                            prefix_match=PrefixMatch(i * 4, 50)))  # all below the 0.8 affinity
    return eps


def test_reference_wiring_1000_requests_with_real_servers(servers):
    turl, purls = servers
    t = [1000.0]
    client = PredictorClient(purls, deadline_ms=2000)  # generous: CI machines are shared
    reporter = TrainingReporter(turl, flush_interval_s=0.2)
    sched = build_scheduler(REFERENCE_CONFIG, predictor=client, sink=reporter, rng=random.Random(7),
                            clock=lambda: t[0])
    base = _get(turl + "/data/status")[1]["inserted_since_start"]
    eps = cluster()
    picks = {"none": Counter(), "slo": Counter()}
    positive_picks = slo_requests = 0
    versions = set()
    for i in range(1000):
        slo = i % 2 == 1
        headers = {"x-llm-d-slo-ttft-ms": "700"} if slo else {}
        req = InferenceRequest(request_id=f"req-{i}", headers=headers, input_tokens=800)
        res = sched.schedule(req, eps)
        assert res.ok
        chosen = res.picked[0]
        picks["slo" if slo else "none"][chosen.name] += 1
        assert chosen.prediction is not None  # predictions came from the servers
        versions.add(chosen.prediction.model_version)
        if slo and any(c.prediction.ttft_headroom_ms >= 0 for c in res.candidates):
            slo_requests += 1
            positive_picks += chosen.prediction.ttft_headroom_ms >= 0
        sched.pre_request(req, res, now=t[0])
        # the served latency grows with the endpoint's queue and KV use
        t[0] += 0.05 + 0.1 * chosen.metrics.waiting_queue_size + 0.2 * chosen.metrics.kv_cache_usage
        sched.on_complete(req.request_id, now=t[0])
    m = client.metrics.snapshot()
    assert m["successes"] == 1000 and m["fallbacks"] == 0
    assert all(s["calls"] > 100 for s in m["per_server"].values()) and len(m["per_server"]) == 2  # spread
    assert all(v for v in versions)
    # SLO headers change the choice: picks go to endpoints predicted within the SLO
    # (1 % negative-tier exploration aside), and the pick distribution differs
    assert slo_requests > 300 and positive_picks >= 0.95 * slo_requests
    tv = 0.5 * sum(abs(picks["slo"][k] - picks["none"][k]) for k in set(picks["slo"]) | set(picks["none"])) / 500
    assert tv > 0.2, (picks, tv)
    # training samples reach the training server: one E2E sample per completed request
    assert sched.producer.counters["ttft_samples"] == 1000
    reporter.close()
    assert reporter.sent == 1000 and reporter.failed == 0 and reporter.dropped == 0
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        status = _get(turl + "/data/status")[1]
        if status["inserted_since_start"] - base >= 1000:
            break
        time.sleep(0.2)
    assert status["inserted_since_start"] - base == 1000
    client.close()


def test_fallback_with_prediction_servers_stopped(servers):
    turl, _ = servers
    proc, purl = _start(["prediction_server", "--training-server-url", ""], free_port())
    client = PredictorClient([purl], deadline_ms=50)
    sched = build_scheduler(REFERENCE_CONFIG, predictor=client, rng=random.Random(3))
    try:
        res = sched.schedule(InferenceRequest(input_tokens=500), cluster())
        assert res.ok
    finally:
        _stop(proc)
    before = client.metrics.fallbacks
    scorer = sched.profiles[0].scorers[0][0]
    for _i in range(20):
        res = sched.schedule(InferenceRequest(input_tokens=500, headers={"x-llm-d-slo-ttft-ms": "300"}), cluster())
        assert res.ok and all(c.prediction is None for c in res.candidates)
        # composite score: pod0-rank-0 (no queue, KV 0) scores highest
        assert max(res.scores, key=res.scores.get) == "pod0-rank-0"
    assert client.metrics.fallbacks == before + 20 and scorer.fallbacks >= 20
    assert client.metrics.failures["connection"] >= 3 and client.metrics.failures.get("circuit_open", 0) >= 1
    assert "timeout" not in client.metrics.failures  # refused connections fail fast: no call waited out its deadline

    async def async_path():
        r = await sched.aschedule(InferenceRequest(input_tokens=500), cluster())
        await client.aclose()
        return r

    assert asyncio.run(async_path()).ok and client.metrics.fallbacks == before + 21


def test_fallback_with_a_slow_prediction_server():
    def answer(path, body):
        n = len(json.loads(body)["requests"])
        return 200, json.dumps({"predictions": [{"ttft_ms": 1.0, "tpot_ms": 1.0}] * n}).encode()

    with inject(answer, hold=True) as slow:  # failure injection: answers only once released
        client = PredictorClient([slow.url], deadline_ms=50, failure_threshold=1000)
        sched = build_scheduler(REFERENCE_CONFIG, predictor=client, rng=random.Random(4))
        for _ in range(3):
            res = sched.schedule(InferenceRequest(input_tokens=500), cluster())
            assert res.ok and max(res.scores, key=res.scores.get) == "pod0-rank-0"

        async def async_path():
            return await sched.aschedule(InferenceRequest(input_tokens=500), cluster())

        res = asyncio.run(async_path())
        assert res.ok and slow.answered == 0  # every schedule went on without waiting for the answer
        assert client.metrics.fallbacks == 4 and client.metrics.failures["timeout"] == 4
