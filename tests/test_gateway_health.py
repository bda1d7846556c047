"""Endpoint health and timeouts through a real gateway in front of stub engines: ejection
with a backoff then a half-open trial, recovery on a good scrape, client behaviour that
cannot eject an engine, separate first-byte and idle timeouts; and the stub engine command."""
from __future__ import annotations

import subprocess
import sys

import httpx

from gateway.health import Breaker
from load.real_engine.procs import Proc
from fake_engine import FakeEngine, admin_get, engines, free_port  # noqa: F401 (fixture)
from test_gateway_hostile import BODY, raw_post, start
from test_gateway_proxy import FixedOrder, wait_until


def endpoint(url: str, i: int) -> dict:
    return admin_get(url, "/gateway/endpoints").json()[i]


class Clock:
    """The gateway's health clock, moved by the test."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_an_ejected_endpoint_gets_a_trial_after_its_backoff_and_recovers(engines):
    bad, good = engines
    bad.state.mode = "error503"
    clock = Clock()
    gw, srv = start([bad.url, good.url], FixedOrder(), clock, ejection_base_s=10, scrape_interval_s=0.05)
    try:
        for _ in range(3):   # three failures in a row: ejected (each request is retried on the good one)
            assert httpx.post(srv.url + "/v1/completions", json=BODY).status_code == 200
        ep = endpoint(srv.url, 0)
        assert not ep["healthy"] and ep["ejections"] == 1 and ep["ejected_for_s"] == 10
        assert httpx.post(srv.url + "/v1/completions", json=BODY).status_code == 200
        assert len(bad.state.received) == 3            # not tried while ejected, though its scrapes succeed
        # backoff over: the next request is a trial; it fails, so the ejection doubles
        clock.t += 10
        assert endpoint(srv.url, 0)["healthy"]
        assert httpx.post(srv.url + "/v1/completions", json=BODY).status_code == 200
        ep = endpoint(srv.url, 0)
        assert len(bad.state.received) == 4 and ep["ejections"] == 2 and ep["ejected_for_s"] == 20
        bad.state.mode = "ok"
        clock.t += 19
        assert not endpoint(srv.url, 0)["healthy"]
        clock.t += 1
        assert endpoint(srv.url, 0)["healthy"]
        r = httpx.post(srv.url + "/v1/completions", json=BODY)
        assert r.headers["x-engine"] == "a"             # the trial succeeded: closed again
        ep = endpoint(srv.url, 0)
        assert ep["healthy"] and ep["ejections"] == 0 and ep["dispatch_failures"] == 0
        assert 'latency_gateway_endpoint_ejections_total{endpoint="%s"} 2.0' % gw.endpoints[0].name in \
            httpx.get(srv.url + "/metrics").text
    finally:
        srv.stop()


def test_a_restarted_engine_is_back_on_its_first_good_scrape(engines):
    a, b = engines
    gw, srv = start([a.url, b.url], FixedOrder(), ejection_base_s=600, ejection_max_s=600, scrape_interval_s=0.3)
    a2 = None
    try:
        a.state.mode = "error503"   # its dispatches fail while its scrapes succeed: only the breaker ejects it
        for _ in range(3):
            assert httpx.post(srv.url + "/v1/completions", json=BODY).headers["x-engine"] == "b"
        assert gw.endpoints[0].breaker.ejections == 1   # ejected for ten minutes...
        assert gw.endpoints[0].scrape_failures == 0
        a.stop()
        assert wait_until(lambda: gw.endpoints[0].scrape_failures > 0)   # a scrape saw it down
        a2 = FakeEngine("a", port=a.port).start()       # ...but the engine is back: its scrape says so
        assert wait_until(lambda: endpoint(srv.url, 0)["healthy"])
        assert httpx.post(srv.url + "/v1/completions", json=BODY).headers["x-engine"] == "a"
    finally:
        srv.stop()
        if a2 is not None:
            a2.stop()


def test_client_behaviour_cannot_eject_an_engine(engines):
    gw, srv = start([engines[0].url, engines[1].url], FixedOrder())
    try:
        for _ in range(5):   # 1 MB of headers: refused by the gateway, never sent to an engine
            assert raw_post(srv.port, b"x-big: " + b"x" * (1 << 20) + b"\r\n").startswith(b"HTTP/1.1 431")
        r = httpx.post(srv.url + "/v1/completions", json={**BODY, "max_tokens": -3})   # a 400 of its own
        assert r.status_code == 400
        assert all(e.breaker.failures == 0 and e.breaker.ejections == 0 for e in gw.endpoints)
        assert httpx.post(srv.url + "/v1/completions", json=BODY).headers["x-engine"] == "a"
    finally:
        srv.stop()


def test_the_first_byte_timeout_is_not_the_idle_timeout(engines):
    """A non-streaming generation longer than the idle timeout, within the first-byte one, is
    generated once and answered (test_gateway_proxy: a stream idle past the idle timeout is cut)."""
    for e in engines:
        e.state.first_token_delay = 0.8
    gw, srv = start([e.url for e in engines], FixedOrder(), first_byte_timeout_s=10, idle_timeout_s=0.3)
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "p", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert sum(len(e.state.received) for e in engines) == 1     # sent once
        assert gw.records[-1].ttft_ms >= 800
    finally:
        srv.stop()


def test_breaker_backoff_doubles_up_to_its_cap():
    b = Breaker(threshold=2, base_s=1.0, max_s=3.0)
    assert not b.failure(0.0) and b.failure(0.0) and b.ejected(0.5) and not b.ejected(1.0)
    assert b.half_open(1.0) and b.failure(1.0) and b.remaining_s(1.0) == 2.0   # a failed trial: twice as long
    assert b.failure(3.0) and b.remaining_s(3.0) == 3.0                        # capped
    b.success()
    assert not b.ejected(3.0) and not b.half_open(3.0) and b.ejections == 0


def test_the_stub_engine_is_a_command(tmp_path):
    port = free_port()
    p = Proc("stub", [sys.executable, "-m", "gateway.stub_engine", "--port", str(port), "--name", "s1",
                      "--error-rate", "0.5", "--seed", "1", "--token-ms", "0"], tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        p.wait_http(url + "/metrics", 60)
        assert "vllm:num_requests_running" in httpx.get(url + "/metrics").text
        rs = [httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                             "max_tokens": 2, "stream": True}) for _ in range(20)]
        assert {r.status_code for r in rs} == {200, 500}      # failures injected at the given rate
        ok = next(r for r in rs if r.status_code == 200)
        assert b"tok1" in ok.content and ok.content.endswith(b"data: [DONE]\n\n")
        bad = subprocess.run([sys.executable, "-m", "gateway.stub_engine", "--error-rate", "2"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "--error-rate" in bad.stderr
    finally:
        p.stop()
