"""Prometheus exposition of the library's counters (no global registry at import time).

``EppCollector(scheduler=..., predictor=..., reporter=...)`` is a prometheus-client
custom collector; register it on the registry of your choice::

    registry = prometheus_client.CollectorRegistry()
    registry.register(EppCollector(scheduler=sched, predictor=client, reporter=reporter))

Series (all counters unless noted): ``epp_prediction_calls_total``,
``epp_prediction_successes_total``, ``epp_prediction_fallbacks_total``,
``epp_prediction_retries_total``, ``epp_prediction_failures_total{kind}``,
``epp_prediction_server_calls_total{server}``, ``epp_prediction_server_failures_total{server}``,
``epp_prediction_circuit_open{server}`` (gauge), ``epp_prediction_latency_ms{quantile}``
(gauge over the recent window), ``epp_training_entries_total{outcome}`` (added, sent,
dropped, downsampled, failed), ``epp_training_buffered`` (gauge), ``epp_producer_events_total{event}``,
``epp_scorer_composite_fallbacks_total``, ``epp_admission_rejections_total{admitter}``,
``epp_inflight_requests{endpoint}`` / ``epp_inflight_tokens{endpoint}`` (gauges),
``llm_d_epp_disagg_decision_total{plugin_name, plugin_type, model_name, decision_type}``
(upstream's P/D decision counter, with a disagg profile handler) or
``epp_prediction_opt_in_decision_total{...}`` (``predicted``, ``heuristic``, ``warm-up``;
with the prediction opt-in profile handler).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class EppCollector(Collector):
    def __init__(self, scheduler: Any = None, predictor: Any = None, reporter: Any = None) -> None:
        self.scheduler = scheduler
        self.predictor = predictor
        self.reporter = reporter

    def collect(self) -> Iterator:
        yield from self._predictor()
        yield from self._reporter()
        yield from self._scheduler()

    def _predictor(self) -> Iterator:
        m = getattr(self.predictor, "metrics", None)
        if m is None:
            return
        for name, value, doc in (("calls", m.calls, "bulk prediction calls"),
                                 ("successes", m.successes, "calls that returned predictions"),
                                 ("fallbacks", m.fallbacks, "calls without predictions (composite fallback used)"),
                                 ("retries", m.retries, "retries on another server after a connection failure")):
            yield CounterMetricFamily(f"epp_prediction_{name}", doc, value=value)
        fam = CounterMetricFamily("epp_prediction_failures", "failed attempts by kind", labels=["kind"])
        for kind, n in sorted(m.failures.items()):
            fam.add_metric([kind], n)
        yield fam
        calls = CounterMetricFamily("epp_prediction_server_calls", "attempts per server", labels=["server"])
        fails = CounterMetricFamily("epp_prediction_server_failures", "failed attempts per server", labels=["server"])
        for server, c in sorted(m.per_server.items()):
            calls.add_metric([server], c["calls"])
            fails.add_metric([server], c["failures"])
        yield calls
        yield fails
        breakers = getattr(self.predictor, "breakers", None)
        if breakers:
            g = GaugeMetricFamily("epp_prediction_circuit_open", "1 while the server's circuit is open",
                                  labels=["server"])
            for server, b in sorted(breakers.items()):
                g.add_metric([server], 1.0 if b.is_open else 0.0)
            yield g
        lat = m.snapshot()["latency_ms"]
        g = GaugeMetricFamily("epp_prediction_latency_ms", "prediction call latency over the recent window",
                              labels=["quantile"])
        g.add_metric(["0.5"], lat["p50"])
        g.add_metric(["0.99"], lat["p99"])
        yield g

    def _reporter(self) -> Iterator:
        r = self.reporter
        if r is None or not hasattr(r, "stats"):
            return
        st = r.stats()
        fam = CounterMetricFamily("epp_training_entries", "training entries by outcome", labels=["outcome"])
        for outcome in ("added", "sent", "dropped", "downsampled", "failed"):
            fam.add_metric([outcome], st[outcome])
        yield fam
        yield GaugeMetricFamily("epp_training_buffered", "entries waiting for the next flush", value=st["buffered"])

    def _scheduler(self) -> Iterator:
        s = self.scheduler
        if s is None:
            return
        if s.producer is not None:
            fam = CounterMetricFamily("epp_producer_events", "producer events", labels=["event"])
            for event, n in sorted(s.producer.counters.items()):
                fam.add_metric([event], n)
            yield fam
        fallbacks = sum(getattr(sc, "fallbacks", 0) for p in s.profiles for sc, _ in p.scorers)
        yield CounterMetricFamily("epp_scorer_composite_fallbacks", "latency-scorer composite fallbacks",
                                  value=fallbacks)
        fam = CounterMetricFamily("epp_admission_rejections", "denied admissions", labels=["admitter"])
        for a in s.admitters:
            fam.add_metric([getattr(a, "TYPE", type(a).__name__)], getattr(a, "rejected", 0))
        yield fam
        handler = getattr(s, "profile_handler", None)
        if handler is not None:
            metric, doc = handler.DECISION_METRIC
            fam = CounterMetricFamily(metric, doc, labels=["plugin_name", "plugin_type", "model_name", "decision_type"])
            for (model, decision), n in sorted(handler.decisions.items()):
                fam.add_metric([handler.name, handler.TYPE, model, decision], n)
            yield fam
        if s.inflight is not None:
            req = GaugeMetricFamily("epp_inflight_requests", "requests in flight", labels=["endpoint"])
            tok = GaugeMetricFamily("epp_inflight_tokens", "uncached prompt tokens in flight", labels=["endpoint"])
            for name, ld in sorted(s.inflight.loads().items()):
                req.add_metric([name], ld.requests)
                tok.add_metric([name], ld.tokens)
            yield req
            yield tok
