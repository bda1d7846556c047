"""The gateway under hostile and unlucky clients, through a real gateway on loopback in front
of stub engines: odd header bytes, every failure kind released, the gateway's own request
ids, routing-internal headers stripped, bounded priorities, holds and headers."""
from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson

from epp_client.framework.loader import build_scheduler
from epp_client.framework.profile import SchedulingProfile
from epp_client.framework.scheduler import Scheduler
from epp_client.plugins.producer.inflight_load import InFlightTracker
from fake_engine import ADMIN, ADMIN_TOKEN, ServerThread, admin_get, engines, free_port  # noqa: F401 (fixture)
from gateway.app import build_app
from gateway.core import Gateway
from gateway.flowgate import FlowGate
from gateway.settings import GatewaySettings
from load.gateway_configs import concurrency_gate_config
from test_gateway_proxy import FixedOrder, wait_until

FLOW = concurrency_gate_config(4, "30s", priority_bands=(10,))
BODY = {"prompt": "hello", "max_tokens": 3, "stream": True}


def start(urls, router, clock=time.monotonic, **kw):
    kw.setdefault("scrape_interval_s", 0.05)
    s = GatewaySettings(endpoints=urls, port=free_port(), admin_token=ADMIN_TOKEN, **kw)
    gw = Gateway(s, router, health_clock=clock)
    return gw, ServerThread(build_app(gw), s.port).start()


def flow_gate(inner=None) -> FlowGate:
    router = FlowGate.wrap(inner or build_scheduler(FLOW), FLOW, 0.05)
    assert isinstance(router, FlowGate)
    return router


def raw_post(port: int, headers: bytes, body: bytes = orjson.dumps(BODY), read: bool = True) -> bytes:
    """A request written byte by byte (httpx will not send every byte a server accepts)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" + headers
                  + b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
        out = b""
        while read and (chunk := s.recv(65536)):
            out += chunk
        return out


def test_non_ascii_header_bytes_are_forwarded_as_sent(engines):
    gw, srv = start([engines[0].url], FixedOrder())
    try:
        out = raw_post(srv.port, b"x-user: Jos\xe9\r\n")
        assert out.startswith(b"HTTP/1.1 200") and b"[DONE]" in out
        assert (b"x-user", b"Jos\xe9") in engines[0].state.raw_headers[-1]
        assert gw.inflight.snapshot(gw.endpoints[0].name).requests == 0
    finally:
        srv.stop()


def _disconnect_after(url: str, first_chunk: bool) -> None:
    """A client that leaves before the first byte (a short timeout) or after the first chunk."""
    try:
        with httpx.stream("POST", url + "/v1/completions", json={**BODY, "max_tokens": 50},
                          timeout=0.3 if not first_chunk else 10) as r:
            next(r.iter_raw())
    except httpx.ReadTimeout:
        pass


def test_every_failure_kind_releases_what_it_accounted(engines):
    """Each way a request can end; then nothing is in flight anywhere and flow control is
    unsaturated, and a request is served (the positive witness)."""
    a, b = engines
    gw, srv = start([a.url, b.url], flow_gate(), first_byte_timeout_s=0.5, idle_timeout_s=0.5, max_hold_s=1)
    kinds: dict[str, int] = {}
    try:
        kinds["non-ascii header"] = int(raw_post(srv.port, b"x-user: Jos\xe9\r\n")[9:12])
        kinds["oversized header"] = int(raw_post(srv.port, b"x-big: " + b"x" * 100_000 + b"\r\n")[9:12])
        kinds["bad json"] = httpx.post(srv.url + "/v1/completions", content=b"{").status_code
        kinds["bad priority"] = httpx.post(srv.url + "/v1/completions", json=BODY,
                                           headers={"x-llm-d-priority": "high"}).status_code
        for e in engines:
            e.state.mode = "error500"
        kinds["engine 500"] = httpx.post(srv.url + "/v1/completions", json=BODY).status_code
        for e in engines:
            e.state.mode = "hang"
        kinds["engine hangs"] = httpx.post(srv.url + "/v1/completions", json=BODY).status_code
        for e in engines:
            e.state.mode = "die_mid"
        kinds["engine dies mid-stream"] = httpx.post(srv.url + "/v1/completions", json=BODY).status_code
        for e in engines:
            e.state.mode, e.state.token_delay, e.state.first_token_delay = "ok", 0.2, 0.0
        _disconnect_after(srv.url, first_chunk=True)
        for e in engines:
            e.state.first_token_delay = 2.0
        _disconnect_after(srv.url, first_chunk=False)
        for e in engines:
            e.state.first_token_delay, e.state.token_delay = 0.0, 0.0
        # every endpoint ejected by now (failures in a row): the request still goes somewhere
        assert kinds == {"non-ascii header": 200, "oversized header": 431, "bad json": 400, "bad priority": 400,
                         "engine 500": 502, "engine hangs": 502, "engine dies mid-stream": 200}

        def drained():
            eps = admin_get(srv.url, "/gateway/endpoints").json()
            flow = admin_get(srv.url, "/gateway/flow").json()
            return (all(e["inflight_requests"] == 0 and e["inflight_tokens"] == 0 for e in eps)
                    and flow["saturation"] == 0.0 and flow["queued"] == 0 and not any(e.state.active for e in engines))

        assert wait_until(drained), (admin_get(srv.url, "/gateway/endpoints").json(),
                                     admin_get(srv.url, "/gateway/flow").json())
        assert not gw.router._released and not gw.router._held
        assert httpx.post(srv.url + "/v1/completions", json=BODY).status_code == 200
    finally:
        srv.stop()


def test_the_accounting_key_is_the_gateways_own_id(engines):
    eng = engines[0]
    eng.state.token_delay = 0.2      # the four streams overlap
    gw, srv = start([eng.url], FixedOrder())
    try:
        def stream(_):
            return httpx.post(srv.url + "/v1/completions", json={**BODY, "max_tokens": 8},
                              headers={"x-request-id": "same"}, timeout=30)

        with ThreadPoolExecutor(4) as pool:
            futs = [pool.submit(stream, i) for i in range(4)]
            # four streams with one client id are four requests in flight
            assert wait_until(lambda: gw.inflight.snapshot(gw.endpoints[0].name).requests == 4)
            rs = [f.result() for f in futs]
        assert all(r.status_code == 200 and r.headers["x-request-id"] == "same" for r in rs)
        ours = {r.headers["x-gateway-request-id"] for r in rs}
        assert len(ours) == 4
        assert {h["x-request-id"] for h in eng.state.headers} == ours   # the engine sees the gateway's ids
        assert gw.inflight.snapshot(gw.endpoints[0].name).requests == 0
        recs = admin_get(srv.url, "/gateway/requests?limit=3").json()
        assert len(recs["records"]) == 3 and recs["next"] == 3
        assert {r["client_request_id"] for r in recs["records"]} == {"same"}
        assert len(admin_get(srv.url, "/gateway/requests?since=3").json()["records"]) == 1
        long = httpx.post(srv.url + "/v1/completions", json=BODY, headers={"x-request-id": "x" * 129})
        assert long.status_code == 400 and "x-request-id" in long.json()["error"]["message"]
    finally:
        srv.stop()


def test_routing_internal_headers_from_a_client_never_reach_the_engine(engines):
    gw, srv = start([engines[0].url], FixedOrder())
    try:
        r = httpx.post(srv.url + "/v1/completions", json=BODY, headers={
            "x-prefiller-host-port": "169.254.169.254:80", "x-encoder-hosts-ports": "169.254.169.254:80",
            "x-gateway-destination-endpoint": "169.254.169.254:80", "x-gateway-request-id": "mine",
            "connection": "keep-alive, x-secret", "x-secret": "1", "proxy-connection": "keep-alive",
            "x-kept": "yes"})
        assert r.status_code == 200
        got = engines[0].state.raw_headers[-1]
        names = [k for k, _ in got]
        for h in (b"x-prefiller-host-port", b"x-encoder-hosts-ports", b"x-secret", b"proxy-connection"):
            assert h not in names
        assert [v for k, v in got if k == b"x-gateway-destination-endpoint"] == [engines[0].url[7:].encode()]
        assert (b"x-kept", b"yes") in got
        assert r.headers["x-gateway-request-id"] != "mine"
    finally:
        srv.stop()


class Recording(FixedOrder):
    def __init__(self):
        super().__init__()
        self.priorities: list[int] = []

    def order(self, request, candidates):
        self.priorities.append(request.priority)
        return list(candidates)


def test_priorities_are_a_bounded_configured_set(engines):
    rec = Recording()
    gw, srv = start([engines[0].url], rec, priorities=[-1, 0, 5], objectives={"batch": 7})
    try:
        asked = ["5", "-1", "7", "12345", "-99", "0"]
        for p in asked:
            assert httpx.post(srv.url + "/v1/completions", json=BODY,
                              headers={"x-llm-d-priority": p}).status_code == 200
        assert rec.priorities == [5, -1, 7, 0, 0, 0]     # configured values kept, the others count as 0
    finally:
        srv.stop()
    router = flow_gate()
    gw, srv = start([engines[0].url], router)
    try:
        for p in ["10", *map(str, range(1000, 1040))]:
            assert httpx.post(srv.url + "/v1/completions", json=BODY,
                              headers={"x-llm-d-priority": p}).status_code == 200
        assert set(router.flow.controller.bands) <= {-1, 0, 10}    # no band per value asked
    finally:
        srv.stop()


class HoldFor:
    """A filter holding every request ``times`` times (20 ms each), as decode-harm-filter does."""

    def __init__(self, times: float) -> None:
        self.times = times
        self.calls = 0

    def filter(self, request, endpoints):
        from epp_client import HoldRequest

        self.calls += 1
        if self.calls <= self.times:
            raise HoldRequest(0.02)
        return endpoints


def test_a_held_request_is_not_queued_again_and_its_hold_is_bounded(engines):
    hold = HoldFor(2)
    router = flow_gate(Scheduler(profiles=[SchedulingProfile(filters=[hold])], inflight=InFlightTracker()))
    gw, srv = start([engines[0].url], router, max_hold_s=0.3)
    try:
        assert httpx.post(srv.url + "/v1/completions", json=BODY).status_code == 200
        assert hold.calls == 3
        flow = admin_get(srv.url, "/gateway/flow").json()
        assert len(flow["dispatched"]) == 1               # released once by flow control, held twice after
        hold.times, hold.calls = float("inf"), 0
        r = httpx.post(srv.url + "/v1/completions", json=BODY)
        assert r.status_code == 429 and r.headers["x-llm-d-request-dropped-reason"] == "rejected-hold-expired"
        assert r.headers["retry-after"] == "1"
        assert hold.calls >= 2 and not router._released and not router._held
        assert admin_get(srv.url, "/gateway/flow").json()["saturation"] == 0.0
        assert len(engines[0].state.received) == 1
    finally:
        srv.stop()


def test_stream_null_is_the_default_and_oversized_headers_get_431(engines):
    gw, srv = start([engines[0].url], FixedOrder(), max_header_bytes=4096)
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "p", "max_tokens": 2, "stream": None})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        big = httpx.post(srv.url + "/v1/completions", json=BODY, headers={"x-big": "x" * 5000})
        assert big.status_code == 431 and "4096" in big.json()["error"]["message"]
        assert len(engines[0].state.received) == 1
    finally:
        srv.stop()


def test_a_client_that_leaves_is_counted_499_not_200(engines):
    engines[0].state.token_delay = 0.2
    gw, srv = start([engines[0].url], FixedOrder())
    try:
        with httpx.stream("POST", srv.url + "/v1/completions", json={**BODY, "max_tokens": 100}) as r:
            next(r.iter_raw())
        assert wait_until(lambda: engines[0].state.cancelled == 1)
        m = ""
        assert wait_until(lambda: 'status="499"} 1.0' in (m := httpx.get(srv.url + "/metrics").text))
        assert 'status="200"' not in httpx.get(srv.url + "/metrics").text, m
    finally:
        srv.stop()


def test_admin_endpoints_need_the_token(engines):
    s = GatewaySettings(endpoints=[engines[0].url], port=free_port())
    srv = ServerThread(build_app(Gateway(s, FixedOrder())), s.port).start()
    try:
        for path in ("/gateway/requests", "/gateway/endpoints", "/gateway/flow"):
            r = httpx.get(srv.url + path)
            assert r.status_code == 403 and "LATENCY_GATEWAY_ADMIN_TOKEN" in r.text
        assert httpx.get(srv.url + "/metrics").status_code == 200
    finally:
        srv.stop()
    gw, srv = start([engines[0].url], FixedOrder())
    try:
        assert httpx.get(srv.url + "/gateway/endpoints").status_code == 401
        assert httpx.get(srv.url + "/gateway/endpoints", headers={"authorization": "Bearer wrong-token"}
                         ).status_code == 401
        eps = httpx.get(srv.url + "/gateway/endpoints", headers=ADMIN)
        assert eps.status_code == 200 and eps.json()[0]["url"] == engines[0].url
    finally:
        srv.stop()
