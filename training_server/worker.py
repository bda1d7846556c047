"""The retrain worker: off the request path, on an interval, only with new data.

Every ``interval`` seconds the worker checks whether at least ``min_new`` rows arrived
since the data the last candidate was trained on (row ids are monotone, so this survives
restarts through the served manifest's ``trained_on.max_row_id``). If so it reads the
stratified train/test sets, trains a candidate (``nthread`` 1 by default, so ingestion
and serving keep a core; XGBoost releases the GIL), scores candidate and served bundle on
the *same* current held-out rows and judges each target: the candidate's model is good
enough when its pinball loss is at most ``(1 + tolerance)`` x the served one (strictly no
worse than the prior while the prior is served). A new bundle is published when at least one
target's model is good enough, the first learned one included; a target whose model is not
keeps what is served for it (the served model, or the served prior), so no target ever
regresses beyond the tolerance, and a target that learns fast (TPOT, on few rows) is not held
back by one that does not yet beat the prior. Failures are counted and
logged; the loop never dies. The stop flag is checked between phases and after every boosting round, so shutdown waits
at most a few seconds. When the served bundle's live coverage (from entries that carry its
predictions) drifts off the quantile, a quarter of ``min_new`` new rows suffices.

Every cycle starts with the online adaptive correction (:meth:`RetrainWorker.recalibrate`,
:mod:`training_server.correction`): the live (actual, predicted) pairs that arrived since the
last cycle, queued in the worker's :class:`~training_server.feedback.LiveFeedback` by
ingestion, move a per-target live factor; when it moved enough, the served models are
republished with their calibration scaled by it. A large move is a drift: the rows from then
on count as recent (weight ``RECENT_WEIGHT`` in model fit and conformal calibration until
``RECENT_ROWS`` rows have arrived since) and the next retrain runs at the lowered threshold.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from features.bundle import BundleError
from features.scoring import evaluate_bundle

from . import trainer
from .correction import LEVEL_ROWS, LiveCorrection
from .engine_learn import EngineLearner
from .feedback import LiveFeedback
from .gate import publish_gate, target_verdicts
from .metrics import TrainingMetrics
from .registry import Registry
from .store import SampleStore

log = logging.getLogger("training_server.worker")

#: sample weight of rows stored after a detected drift, and how long rows count as recent
RECENT_WEIGHT = 4.0
RECENT_ROWS = 20_000
#: trainings per full choice of each target's base link (``TrainConfig.auto_links``); the others
#: fit only the links chosen last: half the trees per cycle (3 fits instead of 6)
LINK_CHOICE_EVERY = 4


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


class RetrainWorker:
    """Retrains and republishes; owns the live feedback (``feedback``: ingestion adds the
    pairs, each cycle drains them into the live correction). ``clock`` (seconds, any origin;
    simulated time in the simulator) dates the live pairs."""

    def __init__(self, store: SampleStore, registry: Registry, metrics: TrainingMetrics, *,
                 config: trainer.TrainConfig, interval: float, min_new: int, max_per_bucket: int,
                 tolerance: float, clock: Callable[[], float] = time.monotonic) -> None:
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
        #: live pairs from ingestion: the served bundle's live error and the correction's input
        self.feedback = LiveFeedback(config.quantile)
        self.correction = LiveCorrection(clock)
        self._recalibrated_at = -float("inf")  # on ``clock``
        #: per target, the base link the last full choice kept (trees over a base), and trainings since
        self._links: dict[str, str] = {}
        self._trainings = 0
        self.correction.sync(served.manifest if served.source == "learned" else None,
                             served.version if served.source == "learned" else None)
        #: the engine twin's step model, refitted each cycle from the stored engine rows
        self.engine = EngineLearner(store)

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
    def live_factor(self) -> dict[str, float]:
        """Per target, the live factor published with the served bundle."""
        return self.correction.live_factor

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
        drift = self.feedback.drifting() if self.registry.is_learned else []
        if drift:
            return max(1, self.min_new // 4), f"live drift on {', '.join(drift)}"
        if self.drift_retrain_pending:
            return max(1, self.min_new // 4), "drift (live recalibration) not yet retrained on"
        return self.min_new, ""

    def _serve(self, bundle) -> None:
        """A new bundle is served: metrics follow; live error is tracked for it alone."""
        self.metrics.set_served(bundle.version, bundle.source, bundle.loaded_at)
        self.feedback.reset_live()

    def recalibrate(self) -> CycleReport | None:
        """Move the live factors by the live pairs that arrived since the last cycle, and
        republish the served models when a factor has moved enough; None when nothing was
        published."""
        served = self.registry.served
        changed = self.correction.update(self.feedback, served)
        if not changed:
            return None
        manifest = self.correction.recalibrated_manifest(served, changed)
        bundle = self.registry.publish(manifest, self.registry.served_files())
        self._serve(bundle)
        drifted = self.correction.published(changed, bundle.version)
        self.recalibrations += 1
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

    def _recalibrate_safely(self) -> CycleReport | None:
        self._recalibrated_at = self.correction.clock()
        try:
            return self.recalibrate()
        except Exception as e:  # never let the correction kill the loop
            self.failures += 1
            log.exception("live recalibration failed")
            return CycleReport("failed", f"recalibration: {type(e).__name__}: {e}")

    def _while_training(self) -> bool:
        """Called between boosting rounds; True stops the training. A retrain takes seconds:
        meanwhile the live correction keeps running every ``interval`` s (on ``clock``), or
        under a steady drift the level would lag by a whole retrain (on a ramp into overload,
        windows of 10 s fell to 8% coverage)."""
        if self._stop.is_set():
            return True
        if self.correction.clock() - self._recalibrated_at >= self.interval:
            self._recalibrate_safely()
        return False

    def run_once(self) -> CycleReport:
        """One check-and-maybe-retrain cycle; never raises."""
        t0 = time.perf_counter()
        recal = self._recalibrate_safely()
        if recal is not None:
            self.last = recal
        need, why = self.threshold()
        self.engine.refit(retraining=self.new_samples >= need)
        if self.new_samples < need:
            self.metrics.retrain_skips.inc()
            engine = self._publish_engine()
            if engine is not None:
                self.last = engine
            return engine or CycleReport("skipped", f"{self.new_samples} new samples < {need}")
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
        engine = self._publish_engine()   # a cycle that published none: the served models with it
        if engine is not None:
            report.reason += f"; {engine.reason} ({engine.version})"
        self.last = report
        return report

    def _publish_engine(self) -> CycleReport | None:
        """Serve a newly fitted engine section with the served models (:mod:`.engine_learn`)."""
        try:
            bundle = self.engine.publish(self.registry)
        except Exception as e:  # never let it kill the loop; the section goes out with the next bundle
            log.exception("engine section not published")
            return CycleReport("failed", f"engine: {type(e).__name__}: {e}")
        if bundle is None:
            return None
        self.metrics.set_served(bundle.version, bundle.source, bundle.loaded_at)
        self.correction.published({}, bundle.version)
        return CycleReport("engine", "engine step model republished with the served models", version=bundle.version)

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
        choose = not self._links or self._trainings % LINK_CHOICE_EVERY == 0
        config = self.config if choose else trainer.with_config(
            self.config, auto_links={**self.config.auto_links, **{t: (k,) for t, k in self._links.items()}})
        result = trainer.train_models(train.raw, train.ttft, train.tpot, config=config, ts=train.ts,
                                      weights=self._recency_weights(train.ids), stop=self._while_training)
        self._trainings += 1
        if choose:
            self._links = {t: b["link"] for t, b in result.base.items() if t in result.models}
        if not result.targets:  # a target answered by its base alone has no model file
            return CycleReport("rejected", f"no target had {self.config.min_rows} rows {counts}")
        try:  # a candidate no manifest accepts (e.g. trees answering an idle server with <= 0 ms)
            self.correction.hand_over(result, ts, self.registry.served)
            self._phase("evaluate")
            candidate = trainer.loaded_bundle(result)
        except BundleError as e:
            return CycleReport("rejected", f"candidate not servable: {e}")
        served = self.registry.served
        cand_scores = evaluate_bundle(candidate, test.raw, test.ttft, test.tpot)
        served_scores = evaluate_bundle(served, test.raw, test.ttft, test.tpot, quantile=candidate.quantile)
        served_is_prior = served.source != "learned"
        ok, reason = publish_gate(cand_scores, served_scores, served_is_prior=served_is_prior,
                                  tolerance=self.tolerance, learned=result.targets)
        if not ok:
            self.metrics.set_heldout(served_scores)
            return CycleReport("rejected", reason, candidate=cand_scores, served=served_scores)
        verdicts = target_verdicts(cand_scores, served_scores, served_is_prior=served_is_prior,
                                   tolerance=self.tolerance, learned=result.targets)
        # per target: a model that lost, or a target the candidate did not learn, keeps the
        # served one (no regression)
        kept = [t for t, (v, _) in verdicts.items() if v is False or t not in result.targets]
        if kept:
            carried = self._compose(result, kept, served)
            if carried:
                reason += f"; kept served {', '.join(carried)}"
            if len(carried) < len(kept):
                reason += (f"; served {', '.join(t for t in kept if t not in carried)} not carried over "
                           "(other model kind, objective, quantile or features): the candidate's model goes out")
            cand_scores = evaluate_bundle(trainer.loaded_bundle(result), test.raw, test.ttft, test.tpot)
        self._phase("publish")
        test_counts = test.counts()
        manifest, files = trainer.build_bundle(
            result, self.registry.next_version(), metrics=cand_scores,
            training={t: {"n_test": test_counts[t]} for t in test_counts},
            extra={"trained_on": {"max_row_id": ts.max_id, "stored_rows": self.store.rows},
                   **self.engine.extra(self.registry.served)})
        bundle = self.registry.publish(manifest, files)
        self._serve(bundle)
        self.metrics.set_heldout(cand_scores)
        self.correction.sync(bundle.manifest, bundle.version)
        return CycleReport("published", reason, version=bundle.version, candidate=cand_scores,
                           served=served_scores)

    def _compose(self, result: trainer.TrainResult, kept: list[str], served) -> list[str]:
        """Replace, in place, the candidate's models for ``kept`` targets by the served ones where
        they are compatible (same kind, objective, quantile and features; a served base alone
        needs no model file), or by the served prior where the prior serves them, and return the
        targets that kept what is served. An incompatible served model (the configuration
        changed since it was trained) cannot go into this bundle: the target keeps the
        candidate's model, or, when the candidate has none, the served prior."""
        carried = []
        m = served.manifest
        files = self.registry.served_files()
        for t in kept:
            spec = m.models.get(t)
            trees = (spec is not None and spec.file in files and served.model_kind == result.config.model_type)
            compatible = (served.source == "learned" and (trees or m.base_only(t))
                          and served.objective == result.config.objective
                          and served.quantile == result.config.quantile
                          and tuple(m.feature_names(t) or ()) == tuple(result.feature_names[t]))
            learned_there = served.source == "learned" and (spec is not None or m.base_only(t))
            if not compatible and learned_there and t in result.models:
                continue     # a learned model that cannot travel: the candidate's replaces it
            carried.append(t)
            result.prior[t] = m.prior[t].to_json()
            result.base.pop(t, None)
            if compatible:
                if spec is None:
                    result.models.pop(t, None)
                else:
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
        return carried
