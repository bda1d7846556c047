"""Bounded holds and shedding through a real gateway on loopback: the recommended profile's
decode-harm-filter, the real prediction and training servers, fake HTTP engines. A held request
is placed at its bound (``maxHoldMs``), not at the gateway's ceiling; a sheddable request late on
every endpoint gets 429 ``shed-slo-unreachable`` with Retry-After; a non-sheddable one is placed
where it is least late; any request the twin would queue past the profile's 60 s gets 429
``shed-ttft-over-bound``."""
from __future__ import annotations

import re
import threading
import time

import httpx
import yaml

from epp_client.engine.model import Outcome
from epp_client.plugins.filter.decode_harm import DecodeHarmFilter
from epp_client.profiles import config_text
from fake_engine import engines  # noqa: F401 (fixture)
from test_gateway_scheduler import servers, start  # noqa: F401 (fixture)


def _recommended(**filter_params) -> str:
    cfg = yaml.safe_load(config_text("predicted-latency-recommended"))
    plugin = next(p for p in cfg["plugins"] if p["type"] == "decode-harm-filter")
    plugin.setdefault("parameters", {}).update(filter_params)
    return yaml.safe_dump(cfg)


def _harm_filter(gw) -> DecodeHarmFilter:
    return next(f for p in gw.router.profiles for f in p.filters if isinstance(f, DecodeHarmFilter))


def _metric(url: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", httpx.get(url + "/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


class AlwaysHarms:
    """An engine model that says the request harms running requests wherever it goes and has all
    the time in the world (10 ms to its first token): the filter would hold it for ever. Records
    the time held at each scheduling."""

    def __init__(self) -> None:
        self.waited: list[float] = []

    def placement(self, request, endpoint, prompt, cached) -> Outcome:
        if endpoint.name.startswith("ep0"):
            self.waited.append(request.waited_ms)
        return Outcome(1, 10.0, 1.0)


def test_a_held_request_is_placed_at_its_bound_not_at_the_gateways_ceiling(servers, engines):  # noqa: F811
    gw, srv = start(servers["tmp"], [e.url for e in engines],
                    _recommended(holdSlackMs=300, holdRetryMs=50, maxHoldMs=250), [servers["prediction"]],
                    servers["training"], max_hold_s=60.0)
    model = AlwaysHarms()
    f = _harm_filter(gw)
    f.use_engine_model(model)
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2},
                       headers={"x-llm-d-slo-ttft-ms": "20000", "x-llm-d-slo-tpot-ms": "100"}, timeout=30)
        # placed, though the model never stopped saying it harms: only the bound released it
        assert r.status_code == 200
        assert sum(e.state.completed for e in engines) == 1
        assert f.holds >= 2 and len(model.waited) == f.holds + 1 and gw.router.held == f.holds
        # held at each scheduling until the time held reached the bound (250 ms, under half its SLO)
        w = model.waited
        assert w[0] == 0.0 and all(a < b for a, b in zip(w, w[1:]))
        assert all(x < 250.0 - 1.0 for x in w[:-1]) and w[-1] >= 250.0 - 1.0
        assert _metric(srv.url, "latency_gateway_held_requests_total") == 1.0
    finally:
        srv.stop()


def test_a_hopeless_request_is_shed_when_sheddable_else_placed_where_least_late(servers, engines):  # noqa: F811
    for e in engines:
        e.state.first_token_delay = 1.0
    gw, srv = start(servers["tmp"], [e.url for e in engines], _recommended(shedWhenHopeless=True),
                    [servers["prediction"]], servers["training"])
    f = _harm_filter(gw)
    try:
        # a long prompt waiting for its first token on one endpoint: what is queued there in the twin
        blocker = threading.Thread(target=lambda: httpx.post(
            srv.url + "/v1/completions", json={"prompt": "word " * 3000, "max_tokens": 2}, timeout=30))
        blocker.start()
        deadline = time.monotonic() + 10
        while sum(e.state.active for e in engines) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        busy = next(i for i, e in enumerate(engines) if e.state.active)
        hopeless = {"x-llm-d-slo-ttft-ms": "0.5", "x-llm-d-slo-tpot-ms": "100"}   # no engine step is that short
        body = {"prompt": "hello", "max_tokens": 2}
        r = httpx.post(srv.url + "/v1/completions", json=body, headers={**hopeless, "x-llm-d-priority": "-1"})
        assert r.status_code == 429
        assert r.headers["x-llm-d-request-dropped-reason"] == "shed-slo-unreachable"
        assert int(r.headers["retry-after"]) >= 1
        assert "shed-slo-unreachable" in r.json()["error"]["message"]
        assert f.shed == 1 and sum(len(e.state.received) for e in engines) == 1     # only the blocker
        # the same request, not sheddable: placed, on the endpoint without the long prompt ahead of it
        r = httpx.post(srv.url + "/v1/completions", json=body, headers=hopeless)
        assert r.status_code == 200
        assert len(engines[1 - busy].state.received) == 1 and f.hopeless == 2 and f.shed == 1
        blocker.join(30)
        m = httpx.get(srv.url + "/metrics").text
        assert re.search(r'^latency_gateway_admission_denied_total\{reason="shed-slo-unreachable"\} 1\.0$', m, re.M)
    finally:
        srv.stop()


class FixedTtft:
    """An engine model that puts the request's first token ``ttft_ms`` away on every endpoint,
    harming nobody."""

    def __init__(self, ttft_ms: float) -> None:
        self.ttft_ms = ttft_ms

    def placement(self, request, endpoint, prompt, cached) -> Outcome:
        return Outcome(0, self.ttft_ms, 1.0)


def test_the_recommended_profile_refuses_a_request_it_would_queue_past_30_s(servers, engines):  # noqa: F811
    gw, srv = start(servers["tmp"], [e.url for e in engines], config_text("predicted-latency-recommended"),
                    [servers["prediction"]], servers["training"])
    f = _harm_filter(gw)
    assert (f.max_ttft_ms, f.over_max_ttft) == (30_000.0, "shed")
    body = {"prompt": "hello", "max_tokens": 2}
    try:
        f.use_engine_model(FixedTtft(45_000.0))       # past the bound everywhere: refused at once, any priority
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 429 and r.headers["x-llm-d-request-dropped-reason"] == "shed-ttft-over-bound"
        assert int(r.headers["retry-after"]) >= 1 and f.shed == 1
        assert sum(len(e.state.received) for e in engines) == 0
        f.use_engine_model(FixedTtft(25_000.0))       # within it: placed
        assert httpx.post(srv.url + "/v1/completions", json=body, timeout=30).status_code == 200
        assert sum(len(e.state.received) for e in engines) == 1 and f.shed == 1
        m = httpx.get(srv.url + "/metrics").text
        assert re.search(r'^latency_gateway_admission_denied_total\{reason="shed-ttft-over-bound"\} 1\.0$', m, re.M)
    finally:
        srv.stop()
