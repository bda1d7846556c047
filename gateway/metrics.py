"""The gateway's own Prometheus metrics (one registry per gateway, no global state)."""
from __future__ import annotations

from typing import TYPE_CHECKING, TypeGuard

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # pragma: no cover
    from .core import Gateway
    from .scrape import EndpointState

def _is_collector(obj: object) -> TypeGuard[Collector]:
    """Whether ``obj`` has a ``collect()`` for a registry (prometheus_client's Collector protocol)."""
    return callable(getattr(obj, "collect", None))


LAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class GatewayMetrics:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "latency_gateway_"
        self.requests = Counter(p + "requests_total", "Requests answered, by path and status (499: the client "
                                "left first; 502 after a 200: the upstream failed mid-stream)",
                                ["path", "status"], registry=r)
        self.ejections = Counter(p + "endpoint_ejections_total", "Endpoints ejected after failed requests",
                                 ["endpoint"], registry=r)
        self.decisions = Counter(p + "decisions_total", "Requests served by each endpoint",
                                 ["endpoint"], registry=r)
        self.retries = Counter(p + "retries_total", "Retries on another endpoint before the first byte",
                               ["endpoint"], registry=r)
        self.upstream_errors = Counter(p + "upstream_errors_total", "Upstream failures by stage",
                                       ["endpoint", "stage"], registry=r)
        self.fallbacks = Counter(p + "fallbacks_total", "Routing decisions made without predictions",
                                 ["reason"], registry=r)
        self.admission_denied = Counter(p + "admission_denied_total", "Requests denied admission (429)",
                                        ["reason"], registry=r)
        self.held = Counter(p + "held_requests_total", "Requests a filter held before dispatch "
                            "(decode-harm-filter holdSlackMs), each counted once", registry=r)
        self.disconnects = Counter(p + "client_disconnects_total",
                                   "Clients gone before their response completed (request: while sending the body; "
                                   "response: while it was produced)", ["stage"], registry=r)
        self.ttft = Histogram(p + "ttft_seconds", "Time to first token from dispatch (E2E when not streaming)",
                              ["endpoint"], buckets=LAT_BUCKETS, registry=r)
        self.tpot = Histogram(p + "tpot_seconds", "Average time per output token after the first",
                              ["endpoint"], buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram(p + "e2e_seconds", "Whole request from dispatch", ["endpoint"],
                             buckets=LAT_BUCKETS, registry=r)
        self.slo_violations = Counter(p + "slo_violations_total", "Requests over their SLO header",
                                      ["type"], registry=r)
        inflight = Gauge(p + "inflight_requests", "Requests in flight per endpoint", ["endpoint"], registry=r)
        inflight_tok = Gauge(p + "inflight_tokens", "Uncached prompt tokens in flight before the first token",
                             ["endpoint"], registry=r)
        healthy = Gauge(p + "endpoint_healthy", "1 while the endpoint is a candidate (scraped, not ejected)",
                        ["endpoint"], registry=r)
        kv = Gauge(p + "endpoint_kv_cache_usage", "Last scraped KV-cache use (fraction)", ["endpoint"], registry=r)
        hit = Gauge(p + "prefix_indexer_hit_ratio", "Share of prompt blocks found in the chosen endpoint's LRU",
                    registry=r)

        def per_endpoint(e: EndpointState) -> None:   # binds ``e`` for the gauges' callbacks
            inflight.labels(endpoint=e.name).set_function(lambda: gw.inflight.snapshot(e.name).requests)
            inflight_tok.labels(endpoint=e.name).set_function(lambda: gw.inflight.snapshot(e.name).tokens)
            kv.labels(endpoint=e.name).set_function(lambda: e.metrics.kv_cache_usage or 0.0)
            healthy.labels(endpoint=e.name).set_function(lambda: float(e.healthy(gw.health_clock())))

        for ep in gw.endpoints:
            per_endpoint(ep)
        hit.set_function(lambda: gw.prefix.hit_ratio)
        if _is_collector(gw.router):   # e.g. flow control's queues and fairness metrics
            r.register(gw.router)

    def observe(self, info, name, ok, ttft_ms, tpot_ms, e2e_ms) -> None:
        """Latencies of a finished request (``requests`` is counted by the caller, by outcome)."""
        if not ok:
            return
        if ttft_ms is not None:
            self.ttft.labels(endpoint=name).observe(ttft_ms / 1000.0)
            slo = info.ttft_slo_ms
            if slo > 0 and ttft_ms > slo:
                self.slo_violations.labels(type="ttft").inc()
        if tpot_ms is not None:
            self.tpot.labels(endpoint=name).observe(tpot_ms / 1000.0)
            slo = info.tpot_slo_ms
            if slo > 0 and tpot_ms > slo:
                self.slo_violations.labels(type="tpot").inc()
        if e2e_ms is not None:
            self.e2e.labels(endpoint=name).observe(e2e_ms / 1000.0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

