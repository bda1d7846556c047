"""Live feedback: (actual, predicted) pairs from training entries that carried a prediction.

An entry reports what the EPP predicted for the endpoint it chose (``predicted_*_ms``,
``model_version``) next to what happened (``actual_*_ms``). :func:`pair_entries` turns
validated entries into such pairs per target, two ways:

* *live* pairs: of the served bundle (or of an unversioned prediction): the served model's
  live error, which :class:`LiveFeedback` keeps in a rolling window (live pinball and
  coverage for the metrics, and the drift test that lowers the retrain threshold);
* *correction* pairs: of any learned version this registry served recently, with that
  version (the correction judges each pair by the factor it was predicted with): the input
  of the retrain worker's adaptive live correction, queued until the worker drains them.

The retrain worker owns one :class:`LiveFeedback`; ingestion adds to it after the durable
commit. Thread-safe (ingestion and the worker run in different threads).
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from features.matrix import TARGETS
from features.scoring import evaluate_predictions

#: live-error window (entries carrying a prediction of the served bundle), per target
LIVE_WINDOW = 2000
#: live coverage this many points off the quantile, over at least DRIFT_MIN_SAMPLES, is drift
DRIFT_COVERAGE_POINTS = 5.0
DRIFT_MIN_SAMPLES = 200
#: correction pairs waiting for the worker (bounded: the oldest go)
FEEDBACK_BACKLOG = 20_000

Pairs = Mapping[str, list[tuple]]  # (actual, predicted[, version]) per target


def pair_entries(entries: Iterable, served_version: str,
                 is_learned_version: Callable[[str], bool]) -> tuple[dict[str, list], dict[str, list]]:
    """(live, correction): (actual, predicted) pairs per target of validated entries (see
    the module docstring). Entries without a positive prediction and actual give none."""
    live: dict[str, list] = {t: [] for t in TARGETS}
    correction: dict[str, list] = {t: [] for t in TARGETS}
    for e in entries:
        if e.predicted_ttft_ms <= 0 and e.predicted_tpot_ms <= 0:
            continue  # no prediction reported (e.g. an upstream EPP): nothing to score
        pairs = [(t, a, p) for t, a, p in (("ttft", e.actual_ttft_ms, e.predicted_ttft_ms),
                                           ("tpot", e.actual_tpot_ms, e.predicted_tpot_ms)) if p > 0 and a > 0]
        if not pairs:
            continue
        if not e.model_version or e.model_version == served_version:
            for t, a, p in pairs:
                live[t].append((a, p))
        if e.model_version and is_learned_version(e.model_version):
            for t, a, p in pairs:
                correction[t].append((a, p, e.model_version))
    return live, correction


class LiveFeedback:
    """The served bundle's live-error window and the correction backlog, per target."""

    def __init__(self, quantile: float = 0.9, live_window: int = LIVE_WINDOW,
                 backlog: int = FEEDBACK_BACKLOG) -> None:
        self.quantile = quantile
        self._live = {t: deque(maxlen=live_window) for t in TARGETS}
        self._backlog = {t: deque(maxlen=backlog) for t in TARGETS}
        #: correction pairs ever added, per target (a witness that feedback flows)
        self.added = {t: 0 for t in TARGETS}
        self._lock = threading.Lock()

    def observe(self, live: Pairs, correction: Pairs | None = None) -> None:
        """Add pairs: ``live`` of the served bundle, ``correction`` of any recent learned
        version, as (actual, predicted, version) or (actual, predicted) when the version is
        not known (:func:`pair_entries` makes both)."""
        with self._lock:
            for t, items in live.items():
                if items:
                    self._live[t].extend(items)
            for t, items in (correction or {}).items():
                if items:
                    self._backlog[t].extend(items)
                    self.added[t] += len(items)

    def take(self, target: str) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
        """(actual, predicted, version or None) of the correction pairs of ``target`` that
        arrived since the last call, oldest first; the backlog is emptied."""
        with self._lock:
            d = self._backlog[target]
            items = list(d)
            d.clear()
        a = np.array([i[:2] for i in items], dtype=np.float64).reshape(-1, 2)
        return a[:, 0], a[:, 1], [i[2] if len(i) > 2 else None for i in items]

    def reset_live(self) -> None:
        """Forget the live-error window (a new bundle is served, or /flush asked for it)."""
        with self._lock:
            for d in self._live.values():
                d.clear()

    def live_scores(self) -> dict[str, dict]:
        """Pinball, coverage, ... (``evaluate_predictions``) of the window, per target."""
        with self._lock:
            data = {t: np.array(d, dtype=np.float64).reshape(-1, 2) for t, d in self._live.items()}
        return {t: evaluate_predictions(a[:, 0], a[:, 1], self.quantile) for t, a in data.items() if len(a)}

    def drifting(self, min_n: int = DRIFT_MIN_SAMPLES, tolerance: float = DRIFT_COVERAGE_POINTS) -> list[str]:
        """Targets whose live coverage is off the quantile by more than ``tolerance`` points."""
        return [t for t, s in self.live_scores().items()
                if s["n"] >= min_n and abs(s["coverage"] - 100.0 * self.quantile) > tolerance]
