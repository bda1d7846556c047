"""Flow control in the real gateway on loopback, in front of fake engines: under saturation
two fairness ids are released in the fairness policy's order, an expired request gets 429
with its reason, a full band rejects, and the fairness metrics are on /metrics."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from epp_client.framework.loader import build_scheduler
from fake_engine import ADMIN_TOKEN, ServerThread, admin_get, engines, free_port  # noqa: F401 (fixture)
from gateway.app import build_app
from gateway.core import Gateway
from gateway.flowgate import FlowGate
from gateway.settings import GatewaySettings
from load.gateway_configs import concurrency_gate_config

BASE = """
plugins:
- type: program-aware-fairness
  parameters: {{strategy: turn-priority}}
- type: queue-scorer
- type: max-score-picker
flowControl:
  defaultRequestTTL: {ttl}
  defaultPriorityBand: {{fairnessPolicyRef: {policy}, maxRequests: {cap}}}
"""
BODY = {"prompt": "hello there", "max_tokens": 3, "stream": True}


def start(tmp, urls, text):
    cfg = tmp / f"epp-{free_port()}.yaml"
    cfg.write_text(text)
    s = GatewaySettings(endpoints=urls, port=free_port(), config=str(cfg), scrape_interval_s=0.05,
                        admin_token=ADMIN_TOKEN)
    router = FlowGate.wrap(build_scheduler(text), text, s.scrape_interval_s)
    assert isinstance(router, FlowGate)
    return ServerThread(build_app(Gateway(s, router)), s.port).start()


def post(url, fid):
    return httpx.post(url + "/v1/completions", json=BODY, headers={"x-llm-d-inference-fairness-id": fid}, timeout=30)


def wait_for(url, pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = admin_get(url, "/gateway/flow").json()
        if pred(snap):
            return snap
        time.sleep(0.02)
    raise AssertionError(f"condition not reached: {snap}")


def most_at_once(spans):
    """The most (start, end) spans open at one instant."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda x: (x[0], x[1]))
    most = now = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    return most


def saturate(url, engines, waiting):
    for e in engines:
        e.state.waiting = waiting
    return wait_for(url, lambda s: (s["saturation"] >= 1.0) == (waiting >= 5))


@pytest.mark.parametrize("policy,expected", [("program-aware-fairness", ["deep", "new"]),
                                             ("global-strict-fairness-policy", ["new", "deep"])])
def test_saturated_pool_releases_flows_in_the_policy_order(tmp_path, engines, policy, expected):
    srv = start(tmp_path, [e.url for e in engines], BASE.format(ttl="30s", policy=policy, cap=100))
    try:
        for _ in range(3):                       # the "deep" program has three turns behind it
            assert post(srv.url, "deep").status_code == 200
        saturate(srv.url, engines, 10)           # 10 waiting / threshold 5: saturated
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(post, srv.url, "new")       # arrives first
            wait_for(srv.url, lambda s: s["queued"] == 1)
            second = pool.submit(post, srv.url, "deep")
            snap = wait_for(srv.url, lambda s: s["queued"] == 2)
            assert sorted(q["fairness_id"] for q in snap["queues"]) == ["deep", "new"]
            assert sum(len(e.state.received) for e in engines) == 3    # nothing dispatched while saturated
            saturate(srv.url, engines, 0)
            assert first.result().status_code == 200 and second.result().status_code == 200
        snap = admin_get(srv.url, "/gateway/flow").json()
        assert [d["fairness_id"] for d in snap["dispatched"][-2:]] == expected
        assert sum(len(e.state.received) for e in engines) == 5
        m = httpx.get(srv.url + "/metrics").text
        assert "llm_d_epp_flow_control_pool_saturation" in m
        if policy == "program-aware-fairness":
            assert 'llm_d_epp_program_aware_avg_wait_time_milliseconds{program_id="new"}' in m
            assert "llm_d_epp_program_aware_jains_fairness_index" in m
    finally:
        srv.stop()


def test_expired_request_gets_429_with_its_reason_and_a_full_band_rejects(tmp_path, engines):
    srv = start(tmp_path, [e.url for e in engines],
                BASE.format(ttl="2s", policy="program-aware-fairness", cap=1))
    try:
        saturate(srv.url, engines, 0)     # scraped and not saturated: what follows is measured, not assumed
        saturate(srv.url, engines, 20)
        with ThreadPoolExecutor(1) as pool:
            queued = pool.submit(post, srv.url, "a")
            wait_for(srv.url, lambda s: s["queued"] == 1)
            full = post(srv.url, "b")                        # the band holds one request
            assert full.status_code == 429
            assert full.headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
            assert full.headers["retry-after"] == "1"      # when to try again
            r = queued.result()
        assert r.status_code == 429
        assert r.headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired" and r.headers["retry-after"] == "1"
        assert "rejected-ttl-expired" in r.json()["error"]["message"]
        assert sum(len(e.state.received) for e in engines) == 0
        m = httpx.get(srv.url + "/metrics").text
        assert 'llm_d_epp_flow_control_rejected_total{reason="rejected-ttl-expired"} 1.0' in m
        assert 'latency_gateway_requests_total{path="/v1/completions",status="429"} 2.0' in m
    finally:
        srv.stop()


CONCURRENCY = concurrency_gate_config(1, "30s")


def test_concurrency_detector_never_lets_more_than_the_limit_reach_the_engines(tmp_path, engines):
    """Two endpoints x maxConcurrency 1: six requests at once reach the engines two at a time,
    the rest wait in the flow-control queue (released requests count before they are dispatched)."""
    for e in engines:
        e.state.first_token_delay = 0.5
    srv = start(tmp_path, [e.url for e in engines], CONCURRENCY)
    try:
        with ThreadPoolExecutor(6) as pool:
            futs = [pool.submit(post, srv.url, f"p{i}") for i in range(6)]
            queued = 0
            while not all(f.done() for f in futs):
                queued = max(queued, admin_get(srv.url, "/gateway/flow").json()["queued"])
                time.sleep(0.01)
            assert all(f.result().status_code == 200 for f in futs)
        assert most_at_once([s for e in engines for s in e.state.spans]) == 2    # the engines' own record
        assert queued >= 1                                          # the others waited at the gateway
        assert sum(len(e.state.received) for e in engines) == 6
    finally:
        srv.stop()
