"""Prometheus metrics of one training-server instance (its own CollectorRegistry).

The metrics only observe: the live-error window they expose is kept by the retrain
worker's :class:`~training_server.feedback.LiveFeedback` and passed to :meth:`render`."""
from __future__ import annotations

import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from features.matrix import TARGETS

PREFIX = "latency_training_"


class TrainingMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.accepted = Counter(PREFIX + "entries_accepted", "Training entries stored", registry=r)
        self.rejected = Counter(PREFIX + "entries_rejected", "Training entries rejected, by reason", ["reason"],
                                registry=r)
        self.requests_refused = Counter(PREFIX + "ingest_refused", "Ingest requests refused, by status",
                                        ["status"], registry=r)
        self.store_rows = Gauge(PREFIX + "store_rows", "Rows in the sample store", registry=r)
        self.queue_depth = Gauge(PREFIX + "ingest_queue_depth", "Entries waiting for the store writer", registry=r)
        self.ingest_latency = Histogram(PREFIX + "ingest_request_seconds",
                                        "Bulk ingest request latency (receive to durable commit)", registry=r,
                                        buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
        self.commit_latency = Histogram(PREFIX + "store_commit_seconds", "Group-commit transaction latency",
                                        registry=r, buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5))
        self.retrains = Counter(PREFIX + "retrains", "Retrain cycles that trained a candidate, by outcome",
                                ["outcome"], registry=r)
        self.retrain_failures = Counter(PREFIX + "retrain_failures", "Retrain cycles that failed", registry=r)
        self.retrain_skips = Counter(PREFIX + "retrain_skips", "Retrain checks that found too few new samples",
                                     registry=r)
        self.retrain_seconds = Histogram(PREFIX + "retrain_seconds", "Retrain cycle wall time", registry=r,
                                         buckets=(.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300))
        self.served_bundle = Gauge(PREFIX + "served_bundle", "Served bundle (1 for the current version)",
                                   ["version", "source"], registry=r)
        self.bundle_age = Gauge(PREFIX + "bundle_age_seconds", "Seconds since the served bundle was loaded",
                                registry=r)
        self.heldout_pinball = Gauge(PREFIX + "heldout_pinball_ms", "Held-out pinball loss of the served bundle",
                                     ["target", "regime"], registry=r)
        self.heldout_coverage = Gauge(PREFIX + "heldout_coverage_percent",
                                      "Held-out coverage (% actual <= predicted) of the served bundle",
                                      ["target", "regime"], registry=r)
        self.live_pinball = Gauge(PREFIX + "live_pinball_ms", "Pinball loss of predictions reported with entries "
                                  "(rolling window)", ["target"], registry=r)
        self.live_coverage = Gauge(PREFIX + "live_coverage_percent", "Coverage of predictions reported with "
                                   "entries (rolling window)", ["target"], registry=r)
        self.live_samples = Gauge(PREFIX + "live_samples", "Entries in the live-error window", ["target"],
                                  registry=r)
        self._served_labels: tuple[str, str] | None = None
        self._loaded_at = time.time()

    # ---- model state -----------------------------------------------------------------------
    def set_served(self, version: str, source: str, loaded_at: float) -> None:
        if self._served_labels is not None:
            try:
                self.served_bundle.remove(*self._served_labels)
            except KeyError:
                pass
        self._served_labels = (version, source)
        self.served_bundle.labels(version, source).set(1)
        self._loaded_at = loaded_at

    def set_heldout(self, scores: Mapping[str, Mapping]) -> None:
        for t, s in scores.items():
            self._set_score(t, "all", s)
            for regime, rs in (s.get("by_regime") or {}).items():
                self._set_score(t, regime, rs)

    def _set_score(self, target: str, regime: str, s: Mapping) -> None:
        if s.get("n"):
            self.heldout_pinball.labels(target, regime).set(float(s["pinball"]))
            self.heldout_coverage.labels(target, regime).set(float(s["coverage"]))

    # ---- exposition ------------------------------------------------------------------------
    def render(self, store_rows: int, queue_depth: int, live: Mapping[str, Mapping]) -> bytes:
        """The exposition; ``live``: the served bundle's live scores per target
        (``LiveFeedback.live_scores``)."""
        self.store_rows.set(store_rows)
        self.queue_depth.set(queue_depth)
        self.bundle_age.set(max(0.0, time.time() - self._loaded_at))
        for t in TARGETS:
            s = live.get(t)
            self.live_samples.labels(t).set(0 if s is None else s["n"])
            if s is not None:
                self.live_pinball.labels(t).set(s["pinball"])
                self.live_coverage.labels(t).set(s["coverage"])
        return generate_latest(self.registry)
