"""Prometheus metrics of one prediction server (a registry per app, nothing global).

The hot path costs three increments (request counter, rows counter, latency histogram)
on children bound once; everything else is updated on the (rare) sync path or computed
at scrape time.
"""
from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

#: Fine latency buckets, 0.1 ms .. 1 s (seconds).
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075,
                   0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

#: Why a bundle sync failed (label values of ``latency_prediction_sync_failures_total``).
SYNC_FAILURE_REASONS = ("network", "timeout", "http_status", "bad_json", "bad_manifest", "unknown_schema",
                        "checksum", "truncated", "too_large", "load_error", "local_dir")

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("latency_prediction_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.rows = Counter("latency_prediction_rows_predicted", "rows predicted, by model source (learned/prior)",
                            ["source"], registry=r)
        self.latency = Histogram("latency_prediction_request_seconds",
                                 "server-side processing time of prediction requests",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.sync_attempts = Counter("latency_prediction_sync_attempts", "bundle sync attempts by result",
                                     ["result"], registry=r)
        self.sync_failures = Counter("latency_prediction_sync_failures", "failed bundle syncs by reason",
                                     ["reason"], registry=r)
        self.swaps = Counter("latency_prediction_bundle_swaps", "bundles swapped in", registry=r)
        self.model_info = Gauge("latency_prediction_model_info", "the served bundle (value 1)",
                                ["version", "source", "model_type", "objective_type", "quantile"], registry=r)
        self.bundle_loaded = Gauge("latency_prediction_bundle_loaded_timestamp_seconds",
                                   "when the served bundle was loaded (unix time)", registry=r)
        self.bundle_age = Gauge("latency_prediction_bundle_age_seconds",
                                "seconds since the served bundle was loaded", registry=r)
        self._loaded_at = time.time()
        self.bundle_age.set_function(lambda: time.time() - self._loaded_at)
        for reason in SYNC_FAILURE_REASONS:
            self.sync_failures.labels(reason)
        self._children: dict[tuple[str, int, str], tuple] = {}
        self._lock = threading.Lock()

    def bind(self, endpoint: str, status: int, source: str) -> tuple:
        """Children for (endpoint, status, source), created once."""
        key = (endpoint, status, source)
        c = self._children.get(key)
        if c is None:
            with self._lock:
                c = (self.requests.labels(endpoint, str(status)), self.rows.labels(source),
                     self.latency.labels(endpoint))
                self._children[key] = c
        return c

    def observe(self, endpoint: str, status: int, seconds: float, rows: int, source: str) -> None:
        """A successful prediction request: three increments on pre-bound children."""
        req, rows_c, hist = self.bind(endpoint, status, source)
        req.inc()
        rows_c.inc(rows)
        hist.observe(seconds)

    def count(self, endpoint: str, status: int) -> None:
        """A request that predicted nothing (error answers, /reload)."""
        self.requests.labels(endpoint, str(status)).inc()

    def served(self, version: str, source: str, model_type: str, objective: str, quantile: float,
               loaded_at: float) -> None:
        self.model_info.clear()
        self.model_info.labels(version, source, model_type, objective, f"{quantile:g}").set(1)
        self._loaded_at = loaded_at
        self.bundle_loaded.set(loaded_at)

    def render(self) -> bytes:
        return generate_latest(self.registry)
