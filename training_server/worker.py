"""The retrain worker: off the request path, on an interval, only with new data.

Every ``interval`` seconds the worker checks whether at least ``min_new`` rows arrived
since the data the last candidate was trained on (row ids are monotone, so this survives
restarts through the served manifest's ``trained_on.max_row_id``). If so it reads the
stratified train/test sets, trains a candidate (``nthread`` 1 by default, so ingestion
and serving keep a core; XGBoost releases the GIL), scores candidate and served bundle on
the *same* current held-out rows and judges each target: the candidate's model is good
enough when its pinball loss is at most ``(1 + tolerance)`` x the served one (strictly no
worse than the prior while the prior is served). The first learned bundle must beat the prior
on every target. After that, a new bundle is published when at least one target's model is
good enough; a target whose model is not keeps what is served for it (the served model, or
the served prior), so no target ever regresses beyond the tolerance. Failures are counted and logged; the loop never dies.
The stop flag is checked between phases and after every boosting round, so shutdown waits
at most a few seconds. When the served bundle's live coverage (from entries that carry its
predictions) drifts off the quantile, a quarter of ``min_new`` new rows suffices.

Online adaptive correction (:meth:`RetrainWorker.recalibrate`, adaptive conformal inference):
every cycle, the live (actual, predicted) pairs that arrived since the last cycle from any
recent learned version move a per-target *live factor* (:func:`training_server.calibration.
aci_update`, ``ACI_STEP`` per pair in log units): up on a miss, down on a hit, so that misses
settle at 1 - quantile. When the factor has moved more than ``ACI_REPUBLISH`` since it was
last published, the served models are republished at once with their calibration scaled by
the change: no training, a new version the prediction servers pick up at their next poll. A
drift the features cannot see (e.g. slower GPUs) is thus corrected within a few hundred
live pairs, and noise moves the factor by a few percent.

When the factor has moved more than ``DRIFT_LOG`` from where the last retrain left it, that
is a drift: the rows from then on count as recent (weight ``RECENT_WEIGHT`` in model fit and
conformal calibration until ``RECENT_ROWS`` rows have arrived since) and the next retrain
runs at the lowered threshold. A retrained model may have partly absorbed such a drift, so
while live pairs keep the correction up to date (``LEVEL_MIN_FEEDBACK`` pairs seen, the last
within ``FEEDBACK_FRESH_S``) a retrain is handed over by level, not by copying the factor:
the candidate is scaled to the served model's level on the most recent ``LEVEL_ROWS`` stored
rows per target (:func:`training_server.calibration.level_factor`), and the live factor goes
on from there. Without live pairs (an EPP that sends no predictions) every retrained model
keeps its own conformal calibration.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from features.manifest import Manifest
from features.matrix import TARGETS

from . import calibration, trainer
from .metrics import TrainingMetrics
from .registry import Registry
from .store import SampleStore

log = logging.getLogger("training_server.worker")

#: adaptive-conformal step per live pair (log units): a x1.5 slowdown is corrected within a
#: few hundred pairs (about 13 s of traffic at 25 pairs/s), noise moves the factor by a few %
ACI_STEP = 0.02
#: largest move of the live factor in one cycle (log units): the pairs of one cycle were all
#: predicted with an older factor, so a long cycle (a retrain) must not add them all up
ACI_MAX_MOVE = 0.2
#: the live factor is republished when it has moved this much (log units) since last published
ACI_REPUBLISH = 0.02
#: a live factor this far (log units) from where the last retrain left it is a drift
DRIFT_LOG = 0.1
#: most recent stored rows per target that hand the live correction over to a retrained model
LEVEL_ROWS = 500
#: the live correction governs the level (a retrain is handed over by level) once this many
#: live pairs of a target were seen, the last within FEEDBACK_FRESH_S; without live pairs
#: (an EPP that reports no predictions) a retrained model keeps its own conformal level
LEVEL_MIN_FEEDBACK = 100
FEEDBACK_FRESH_S = 120.0
#: sample weight of rows stored after a detected drift, and how long rows count as recent
RECENT_WEIGHT = 4.0
RECENT_ROWS = 20_000



def _recent_rows(ts, target: str, n: int) -> np.ndarray:
    """Raw rows of the ``n`` newest stored samples (train and test) that have ``target``."""
    parts = [(s.ids, s.raw, s.ttft if target == "ttft" else s.tpot) for s in (ts.train, ts.test)]
    ids = np.concatenate([p[0] for p in parts])
    raw = np.concatenate([p[1] for p in parts])
    y = np.concatenate([p[2] for p in parts])
    m = y > 0
    ids, raw = ids[m], raw[m]
    return raw[np.argsort(ids)[-n:]]


class _Stopped(Exception):
    pass


@dataclass
class CycleReport:
    outcome: str  # "skipped" | "published" | "rejected" | "failed" | "stopped"
    reason: str = ""
    version: str | None = None
    candidate: dict = field(default_factory=dict)
    served: dict = field(default_factory=dict)
    seconds: float = 0.0


def target_verdicts(candidate: Mapping[str, Mapping], served: Mapping[str, Mapping], *, served_is_prior: bool,
                    tolerance: float) -> dict[str, tuple[bool | None, str]]:
    """Per target of the candidate: (True = publish it, False = keep the served one,
    None = no held-out rows to compare on), with a reason. Scores are on the same rows."""
    out: dict[str, tuple[bool | None, str]] = {}
    for t, c in candidate.items():
        s = served.get(t)
        if s is None or not s.get("n"):
            out[t] = (None, f"{t}: no held-out rows")
            continue
        limit = s["pinball"] if served_is_prior else s["pinball"] * (1.0 + tolerance)
        what = "prior" if served_is_prior else "served"
        ok = bool(c["pinball"] <= limit)
        out[t] = (ok, f"{t} {c['pinball']:.4g} {'<=' if ok else '>'} {limit:.4g} ({what} {s['pinball']:.4g})")
    return out


def publish_gate(candidate: Mapping[str, Mapping], served: Mapping[str, Mapping], *, served_is_prior: bool,
                 tolerance: float) -> tuple[bool, str]:
    """Publish when at least one compared target's candidate model is good enough (those that
    are not keep the served model; see RetrainWorker._compose)."""
    verdicts = target_verdicts(candidate, served, served_is_prior=served_is_prior, tolerance=tolerance)
    reason = "; ".join(r for _, r in verdicts.values()) or "no targets"
    if not any(v is True for v, _ in verdicts.values()):
        if all(v is None for v, _ in verdicts.values()):
            return False, "no held-out rows to compare on"
        return False, reason
    return True, reason


class RetrainWorker:
    def __init__(self, store: SampleStore, registry: Registry, metrics: TrainingMetrics, *,
                 config: trainer.TrainConfig, interval: float, min_new: int, max_per_bucket: int,
                 tolerance: float) -> None:
        self.store = store
        self.registry = registry
        self.metrics = metrics
        self.config = config
        self.interval = interval
        self.min_new = min_new
        self.max_per_bucket = max_per_bucket
        self.tolerance = tolerance
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        served = registry.served
        self.trained_max_id = served.manifest.trained_max_row_id if served.source == "learned" else 0
        if self.trained_max_id > store.last_id:  # the store was replaced under the bundles
            self.trained_max_id = 0
        self.cycles = 0
        self.failures = 0
        self.last: CycleReport | None = None
        #: test hook: called between phases with the phase name (failure injection)
        self.on_phase: Callable[[str], None] | None = None
        #: first store row id after the last detected drift (None: no recent drift)
        self.drift_from_id: int | None = None
        #: a drift was detected and no retrain has run since (the next one runs early)
        self.drift_retrain_pending = False
        self.recalibrations = 0
        #: per target: the live factor published with the served bundle, the adaptive one (log
        #: units, moved by every live pair), and the one the last retrain left (log units)
        self.live_factor: dict[str, float] = {}
        self._aci: dict[str, float] = {}
        self._retrain_log: dict[str, float] = {}
        self._feedback_total = {t: 0 for t in TARGETS}
        self._feedback_at = {t: -math.inf for t in TARGETS}
        self._sync_live_factor(served.manifest if served.source == "learned" else None)

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="retrain-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Ask the loop to stop and wait up to ``timeout`` s; True if it ended."""
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(timeout)
            if t.is_alive():
                log.warning("retrain worker still busy after %.1fs; leaving it (daemon thread)", timeout)
                return False
            self._thread = None
        return True

    def _loop(self) -> None:
        self._warm_up()
        while not self._stop.wait(self.interval):
            self.run_once()

    def _warm_up(self) -> None:
        """Import the model library now (about 1-2 s on a busy core), not in the first
        retrain: the first learned model is due within seconds of the first samples."""
        try:
            if self.config.model_type == "xgboost":
                import xgboost  # noqa: F401
            else:
                import lightgbm  # noqa: F401
        except ImportError:  # the first cycle reports it
            pass

    @property
    def new_samples(self) -> int:
        return max(0, self.store.last_id - self.trained_max_id)

    def _phase(self, name: str) -> None:
        if self._stop.is_set():
            raise _Stopped(name)
        if self.on_phase is not None:
            self.on_phase(name)

    # ---- one cycle -------------------------------------------------------------------
    def threshold(self) -> tuple[int, str]:
        """New samples needed for a retrain: ``min_new``, a quarter of it while the served
        bundle's live coverage drifts (never zero: no retrain without new data)."""
        drift = self.metrics.drifting() if self.registry.is_learned else []
        if drift:
            return max(1, self.min_new // 4), f"live drift on {', '.join(drift)}"
        if self.drift_retrain_pending:
            return max(1, self.min_new // 4), "drift (live recalibration) not yet retrained on"
        return self.min_new, ""

    def _sync_live_factor(self, manifest: Manifest | None) -> None:
        """Take the live factors of a newly served (retrained or loaded) bundle's manifest."""
        for t in TARGETS:
            cal = None if manifest is None else manifest.calibration_of(t)
            f = 1.0 if cal is None else cal.live
            self.live_factor[t] = f
            self._aci[t] = self._retrain_log[t] = math.log(f)

    def recalibrate(self) -> CycleReport | None:
        """Move the live factors by the live pairs that arrived since the last cycle, and
        republish the served models when a factor has moved enough; None when nothing was
        published."""
        served = self.registry.served
        targets = list(served.manifest.models) if served.source == "learned" else []
        q = served.quantile
        changed: dict[str, float] = {}
        for t in TARGETS:
            actual, predicted = self.metrics.take_feedback(t)  # drained even when unused
            if t not in targets or not len(actual):
                continue
            self._feedback_total[t] += len(actual)
            self._feedback_at[t] = time.monotonic()
            self._aci[t] = calibration.aci_update(self._aci[t], actual, predicted, q, ACI_STEP, ACI_MAX_MOVE)
            step = self._aci[t] - math.log(self.live_factor[t])
            if abs(step) > ACI_REPUBLISH:
                changed[t] = math.exp(step)
        if not changed:
            return None
        cal = {t: c.to_json() for t, c in (served.manifest.calibration or {}).items()}
        for t, f in changed.items():
            cal[t] = calibration.scale_spec(cal.get(t), f)
        manifest = served.manifest.updated(calibration=cal, recalibrated={
            "from": served.version, "factors": changed, "live_factor": {t: math.exp(self._aci[t]) for t in changed}})
        bundle = self.registry.publish(manifest, self.registry.served_files())
        self.metrics.set_served(bundle.version, bundle.source, bundle.loaded_at)
        for t in changed:
            self.live_factor[t] = math.exp(self._aci[t])
        self.recalibrations += 1
        drifted = [t for t in changed if abs(self._aci[t] - self._retrain_log.get(t, 0.0)) > DRIFT_LOG]
        if drifted and not self.drift_retrain_pending:
            last = self.store.last_id
            # the live pairs that revealed it are already stored: count them as recent too
            self.drift_from_id = max(0, last - LEVEL_ROWS) if self.drift_from_id is None else self.drift_from_id
            self.drift_retrain_pending = True
            log.info("drift on %s: live factor %s", ", ".join(drifted),
                     ", ".join(f"{t} x{self.live_factor[t]:.3f}" for t in drifted))
        reason = ", ".join(f"{t} x{f:.3f} (live factor {self.live_factor[t]:.3f})" for t, f in changed.items())
        log.info("live recalibration %s -> %s: %s", served.version, bundle.version, reason)
        return CycleReport("recalibrated", reason, version=bundle.version)

    def _recency_weights(self, ids: np.ndarray) -> np.ndarray | None:
        d = self.drift_from_id
        if d is None:
            return None
        if self.store.last_id - d > RECENT_ROWS:
            self.drift_from_id = None  # the drifted regime is now most of the data
            return None
        return np.where(np.asarray(ids) > d, RECENT_WEIGHT, 1.0)

    def run_once(self) -> CycleReport:
        """One check-and-maybe-retrain cycle; never raises."""
        t0 = time.perf_counter()
        try:
            recal = self.recalibrate()
        except Exception as e:  # never let the correction kill the loop
            self.failures += 1
            log.exception("live recalibration failed")
            recal = CycleReport("failed", f"recalibration: {type(e).__name__}: {e}")
        if recal is not None:
            self.last = recal
        need, why = self.threshold()
        if self.new_samples < need:
            self.metrics.retrain_skips.inc()
            return CycleReport("skipped", f"{self.new_samples} new samples < {need}")
        if why:
            log.info("retraining early: %s", why)
        self.cycles += 1
        try:
            report = self._cycle()
        except (_Stopped, trainer.TrainingStopped):
            report = CycleReport("stopped", "shutdown")
        except Exception as e:
            self.failures += 1
            self.metrics.retrain_failures.inc()
            log.exception("retrain cycle failed")
            report = CycleReport("failed", f"{type(e).__name__}: {e}")
        report.seconds = time.perf_counter() - t0
        if report.outcome in ("published", "rejected"):
            self.metrics.retrains.labels(report.outcome).inc()
            self.metrics.retrain_seconds.observe(report.seconds)
        log.info("retrain cycle: %s (%s) in %.2fs", report.outcome, report.reason, report.seconds)
        self.last = report
        return report

    def _cycle(self) -> CycleReport:
        # whatever happens next (even a failure), this data has been considered: no
        # retrain, and no retry storm, until new rows arrive
        self.trained_max_id = self.store.last_id
        self._phase("read")
        ts = self.store.read_training_set(self.max_per_bucket)
        train, test = ts.train, ts.test
        counts = train.counts()
        if max(counts.values()) < self.config.min_rows:
            return CycleReport("rejected", f"too few training rows {counts}")
        self._phase("train")
        self.drift_retrain_pending = False
        result = trainer.train_models(train.raw, train.ttft, train.tpot, config=self.config, ts=train.ts,
                                      weights=self._recency_weights(train.ids), stop=self._stop.is_set)
        if not result.models:
            return CycleReport("rejected", f"no target had {self.config.min_rows} rows {counts}")
        self._hand_over(result, ts)
        self._phase("evaluate")
        candidate = trainer.loaded_bundle(result)
        served = self.registry.served
        cand_scores = trainer.evaluate_bundle(candidate, test.raw, test.ttft, test.tpot)
        served_scores = trainer.evaluate_bundle(served, test.raw, test.ttft, test.tpot, quantile=candidate.quantile)
        served_is_prior = served.source != "learned"
        ok, reason = publish_gate(cand_scores, served_scores, served_is_prior=served_is_prior,
                                  tolerance=self.tolerance)
        if not ok:
            self.metrics.set_heldout(served_scores)
            return CycleReport("rejected", reason, candidate=cand_scores, served=served_scores)
        verdicts = target_verdicts(cand_scores, served_scores, served_is_prior=served_is_prior,
                                   tolerance=self.tolerance)
        kept = [t for t, (v, _) in verdicts.items() if v is False]
        if kept and served_is_prior:  # the first learned bundle must beat the prior on every target
            self.metrics.set_heldout(served_scores)
            return CycleReport("rejected", reason, candidate=cand_scores, served=served_scores)
        if kept:  # per target: a model that lost keeps the served one (no regression)
            result = self._compose(result, kept, served)
            reason += f"; kept served {', '.join(kept)}"
            cand_scores = trainer.evaluate_bundle(trainer.loaded_bundle(result), test.raw, test.ttft, test.tpot)
        self._phase("publish")
        test_counts = test.counts()
        manifest, files = trainer.build_bundle(
            result, self.registry.next_version(), metrics=cand_scores,
            training={t: {"n_test": test_counts[t]} for t in test_counts},
            extra={"trained_on": {"max_row_id": ts.max_id, "stored_rows": self.store.rows}})
        bundle = self.registry.publish(manifest, files)
        self.metrics.set_served(bundle.version, bundle.source, bundle.loaded_at)
        self.metrics.set_heldout(cand_scores)
        self._sync_live_factor(bundle.manifest)
        return CycleReport("published", reason, version=bundle.version, candidate=cand_scores,
                           served=served_scores)

    def _hand_over(self, result: trainer.TrainResult, ts) -> None:
        """Carry the live correction over to the candidate's models. While live pairs keep it
        up to date, by level: the candidate is scaled to the served model's level on the most
        recent stored rows (a drift it has partly absorbed is not counted twice); otherwise the
        live factor is applied as it is (1 when no live pair was ever seen)."""
        served = self.registry.served
        base = None
        for t in result.models:
            if t not in result.calibration:
                continue
            f = self.live_factor.get(t, 1.0)
            live = (self._feedback_total[t] >= LEVEL_MIN_FEEDBACK
                    and time.monotonic() - self._feedback_at[t] <= FEEDBACK_FRESH_S)
            if live and served.source == "learned" and served.has_model(t):
                raw = _recent_rows(ts, t, LEVEL_ROWS)
                if len(raw):
                    base = base or trainer.loaded_bundle(result)
                    i = TARGETS.index(t)
                    f = calibration.level_factor(served.predict(raw)[i], base.predict(raw)[i])
            if f != 1.0:
                result.calibration[t] = calibration.scale_spec(result.calibration[t], f)

    def _compose(self, result: trainer.TrainResult, kept: list[str], served) -> trainer.TrainResult:
        """Replace the candidate's models for ``kept`` targets by what is served for them: the
        served model when it is compatible (same kind, objective, quantile and features),
        else the served prior (the target then has no model in the new bundle)."""
        m = served.manifest
        files = self.registry.served_files()
        for t in kept:
            spec = m.models.get(t)
            compatible = (served.source == "learned" and spec is not None and spec.file in files
                          and served.model_kind == result.config.model_type
                          and served.objective == result.config.objective
                          and served.quantile == result.config.quantile
                          and tuple(m.feature_names(t) or ()) == tuple(result.feature_names[t]))
            result.prior[t] = m.prior[t].to_json()
            result.base.pop(t, None)
            if compatible:
                result.models[t] = files[spec.file]
                if t in (m.base or {}):  # the served model's own base goes with it
                    result.base[t] = m.base[t].to_json()
                cal = m.calibration_of(t)
                if cal is not None and cal.to_json():
                    result.calibration[t] = cal.to_json()
                else:
                    result.calibration.pop(t, None)
                result.n_train[t] = m.n_train(t)
            else:
                result.models.pop(t, None)
                result.calibration.pop(t, None)
        return result
