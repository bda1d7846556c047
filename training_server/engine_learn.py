"""The retrain worker's engine learning: refit the engine twin's step model from the stored
engine rows, and get it served.

Every worker cycle :meth:`EngineLearner.refit` fits the manifest's ``engine`` section
(:func:`training_server.engine_fit.fit_engine`, over the newest ``max_rows`` stored rows with
engine fields) once enough such rows arrived since the last fit: ``min_new``, and a quarter of
the rows the last fit read (``growth``): often while it learns, every 5,000 rows at most once it
reads ``max_rows``, so a busy server does not publish a bundle every cycle; and in a cycle that
retrains the latency models, on any row arrived since (that bundle goes out anyway: it carries
the section fitted on every row stored, not one a burst's first rows left behind); and once rows
stop arriving, on those the last fit did not see (a cycle after one that found the same rows
left over: rows committed while a fit read the store would otherwise wait for the next
quarter). A bundle the
cycle publishes carries the newest section (:meth:`EngineLearner.extra`; the served bundle's
when none was fitted since); when the cycle publishes none, the served models are republished
with the new section (:meth:`EngineLearner.publish`), so the EPP's twin learns at the pace of
its data, not of the latency models' retrains. Before the first learned bundle the section
waits for it (the prior bundle is never republished).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .engine_fit import MIN_CLASS_ROWS, MIN_ENDPOINT_ROWS, fit_engine

if TYPE_CHECKING:
    from features.loaded import LoadedBundle

    from .registry import Registry
    from .store import SampleStore

log = logging.getLogger("training_server.engine")

#: new engine rows that trigger a refit (and that share of the rows the last fit read), and the
#: newest rows a fit reads
ENGINE_MIN_NEW = 50
ENGINE_GROWTH = 0.25
ENGINE_MAX_ROWS = 20_000


class EngineLearner:
    def __init__(self, store: SampleStore, *, min_new: int = ENGINE_MIN_NEW, growth: float = ENGINE_GROWTH,
                 max_rows: int = ENGINE_MAX_ROWS, min_class_rows: int = MIN_CLASS_ROWS,
                 min_endpoint_rows: int = MIN_ENDPOINT_ROWS) -> None:
        self.store = store
        self.min_new, self.growth, self.max_rows = min_new, growth, max_rows
        self.min_class_rows, self.min_endpoint_rows = min_class_rows, min_endpoint_rows
        self.fitted_to = 0              # the newest row id the last fit read
        self.rows_read = 0              # how many rows it read
        self.section: dict[str, Any] | None = None
        self.pending = False            # a section fitted since the served bundle
        self.fits = 0
        self._left_over = 0             # rows after the last fit at the previous call

    def refit(self, retraining: bool = False) -> bool:
        """Fit when enough engine rows arrived since the last fit, or any with ``retraining`` (the
        cycle retrains the latency models; see the module docstring); True when a new section
        waits to be served. Never raises (a failed fit keeps the last section)."""
        try:
            need = 1 if retraining else max(self.min_new, int(self.growth * self.rows_read))
            new = self.store.engine_rows_after(self.fitted_to)
            settled = 0 < new == self._left_over     # rows the last fit did not see, and none since
            self._left_over = new
            if new < need and not settled:
                return False
            self._left_over = 0
            rows = self.store.read_engine_rows(self.max_rows)
            self.fitted_to = int(rows.ids[-1]) if len(rows.ids) else self.fitted_to
            self.rows_read = len(rows.ids)
            section = fit_engine(rows.classes, rows.endpoints, rows.features, rows.ttft_ms,
                                 min_class_rows=self.min_class_rows, min_endpoint_rows=self.min_endpoint_rows)
        except Exception:
            log.exception("engine fit failed")
            return False
        if section is None:
            return False
        self.section, self.pending = section, True
        self.fits += 1
        log.info("engine step model fitted on %d rows: %s", section["rows"], ", ".join(
            f"{c} ({s['n_train']} rows, held-out error {s.get('heldout_error', float('nan')):.3f})"
            for c, s in section["classes"].items()))
        return True

    def extra(self, served: LoadedBundle) -> dict[str, Any]:
        """The ``engine`` key of a bundle about to be published: the newest section (then no
        longer pending), else the served bundle's (none: no key)."""
        if self.section is not None:
            self.pending = False
            return {"engine": self.section}
        engine = served.manifest.engine
        return {} if engine is None else {"engine": engine}

    def publish(self, registry: Registry) -> LoadedBundle | None:
        """Republish the served learned bundle with the pending section; None when nothing is
        pending or no learned bundle is served."""
        if not self.pending or not registry.is_learned:
            return None
        self.pending = False
        return registry.publish(registry.served.manifest.updated(engine=self.section), registry.served_files())
