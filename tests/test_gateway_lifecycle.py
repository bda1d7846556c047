"""The gateway's start-up line and its client-disconnect metric, through real servers."""
from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time

import httpx
import pytest

from conftest import REPO
from epp_client.heuristics import LeastLoadScheduler
from epp_client.profiles import PREDICTED_LATENCY_SLO_CONFIG
from fake_engine import ServerThread, engines, free_port  # noqa: F401 (fixture)
from gateway.app import build_app
from gateway.core import Gateway
from gateway.settings import GatewaySettings

DISCONNECTS = re.compile(r'^latency_gateway_client_disconnects_total\{stage="(\w+)"\} (\S+)$', re.M)


def _disconnects(url: str) -> dict[str, float]:
    return {stage: float(v) for stage, v in DISCONNECTS.findall(httpx.get(url + "/metrics").text)}


def _read_until(proc: subprocess.Popen, marker: str, timeout: float = 60) -> str:
    """The process's output up to the line holding ``marker`` (or all of it by ``timeout``)."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    out: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        out.append(line)
        if marker in line:
            break
    return "".join(out)


def test_gateway_prints_where_it_listens_and_what_it_routes_to(engines, tmp_path):
    cfg = tmp_path / "epp.yaml"
    cfg.write_text(PREDICTED_LATENCY_SLO_CONFIG)
    port = free_port()
    urls = [e.url for e in engines]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "latency_cli.main", "gateway", "--endpoints", ",".join(urls),
                             "--port", str(port), "--config", str(cfg),
                             "--prediction-urls", "http://127.0.0.1:1", "--training-url", "http://127.0.0.1:2"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out = _read_until(proc, "[gateway] predictor", timeout=30)
        m = re.search(r"\[gateway\] listening on (http://\S+)", out)
        assert m, out
        url = m.group(1)
        assert url == f"http://127.0.0.1:{port}"
        for u in urls:
            assert u in out
        assert str(cfg) in out
        assert "prediction servers http://127.0.0.1:1" in out
        assert "training server http://127.0.0.1:2" in out
        # the printed URL is the one that answers
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)


def test_builtin_router_start_up_line_says_no_predictor(engines):
    from gateway.cli import startup_lines

    s = GatewaySettings(endpoints=[engines[0].url])
    lines = startup_lines(s, LeastLoadScheduler(), "http://127.0.0.1:9")
    text = "\n".join(lines)
    assert "listening on http://127.0.0.1:9" in text
    assert engines[0].url in text
    assert "built-in" in text and "predictor: none" in text


def test_completed_requests_are_not_client_disconnects(engines):
    engines[0].state.token_delay = 0.0
    s = GatewaySettings(endpoints=[engines[0].url], port=free_port(), scrape_interval_s=0.05)
    gw = Gateway(s, LeastLoadScheduler())
    srv = ServerThread(build_app(gw), s.port).start()
    try:
        for body in ({"prompt": "p", "max_tokens": 5, "stream": True}, {"prompt": "p", "max_tokens": 3}):
            for _ in range(3):
                r = httpx.post(srv.url + "/v1/completions", json=body)
                assert r.status_code == 200
        # a refused request completes too
        assert httpx.post(srv.url + "/v1/completions", content=b"{bad").status_code == 400
        assert engines[0].state.completed == 6
        assert _disconnects(srv.url).get("response", 0.0) == 0.0

        # a client that goes away mid-stream is one real disconnect
        engines[0].state.token_delay = 0.2
        with httpx.stream("POST", srv.url + "/v1/completions",
                          json={"prompt": "p", "max_tokens": 200, "stream": True}) as r:
            next(r.iter_raw())
        deadline = time.monotonic() + 5
        while _disconnects(srv.url).get("response", 0.0) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _disconnects(srv.url).get("response") == 1.0
        assert engines[0].state.completed == 6
    finally:
        srv.stop()


class _HoldTwice:
    """A filter that holds each request twice (20 ms each), then passes the candidates on: what
    decode-harm-filter with holdSlackMs does while every endpoint would be harmed."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float, float]] = []    # (request id, waited_ms, TTFT SLO left)

    def filter(self, request, endpoints):
        from epp_client import HoldRequest

        self.seen.append((request.request_id, request.waited_ms, request.ttft_slo_ms))
        if sum(1 for rid, _, _ in self.seen if rid == request.request_id) <= 2:
            raise HoldRequest(0.02)
        return endpoints


def test_a_held_request_waits_at_the_gateway_and_is_scheduled_again(engines):
    from epp_client.framework.profile import SchedulingProfile
    from epp_client.framework.scheduler import Scheduler
    from epp_client.plugins.producer.inflight_load import InFlightTracker

    engines[0].state.token_delay = 0.0
    before = engines[0].state.completed
    hold = _HoldTwice()
    sched = Scheduler(profiles=[SchedulingProfile(filters=[hold])], inflight=InFlightTracker())
    s = GatewaySettings(endpoints=[engines[0].url], port=free_port(), scrape_interval_s=0.05)
    srv = ServerThread(build_app(Gateway(s, sched)), s.port).start()
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "p", "max_tokens": 3},
                       headers={"x-request-id": "h1", "x-llm-d-slo-ttft-ms": "2000"})
        assert r.status_code == 200
        assert engines[0].state.completed == before + 1              # sent once, after the holds
        assert len({rid for rid, _, _ in hold.seen}) == 1 and len(hold.seen) == 3   # one request, scheduled 3 times
        waited = [w for _, w, _ in hold.seen]
        assert waited[0] == 0.0 < waited[1] < waited[2]     # the time held so far grows...
        assert [slo for _, _, slo in hold.seen] == [pytest.approx(2000.0 - w) for w in waited]   # ...out of its SLO
        assert sched.held == 2
        held = re.search(r"^latency_gateway_held_requests_total (\S+)$", httpx.get(srv.url + "/metrics").text, re.M)
        assert held is not None and float(held.group(1)) == 1.0
    finally:
        srv.stop()
