"""Online learning inside the simulation: the training server's own service, on simulated time.

The learner is a :class:`training_server.service.TrainingService` (the object the HTTP
server adapts) over a temporary data directory: training entries from the producer go
through its ingestion (the same validation, the same durable SQLite sample store, and the
same pairing of the entries' ``predicted_*_ms`` / ``model_version`` with their actuals
into the retrain worker's live feedback), and its cycle runs the same live correction,
retrain, publish gate and bundle registry. Predictions come from the served
``LoadedBundle`` through epp_client's ``InProcessPredictor``, so the live correction's
republished calibration reaches routing at once.

Only the clock differs: the service's clock is simulated time (row timestamps, the
freshness of live pairs), and the simulator triggers the cycles: every
``retrain_interval_s`` *simulated* seconds (and, before the first learned model, as soon as
``min_new`` samples exist, at most every ``first_model_check_s``); once a model is served,
a cycle retrains only with ``periodic_min_new`` new samples (the server's default is 100
every 2 s of wall time: fresher models than here). Training takes no simulated time.
"""
from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from epp_client.predictor import InProcessPredictor
from training_server.service import TrainingService
from training_server.settings import Settings
from training_server.trainer import TrainConfig

from .driver import EPOCH

if TYPE_CHECKING:
    from training_server.worker import RetrainWorker


class OnlineLearner:
    def __init__(self, recipe: str = "default", retrain_interval_s: float = 60.0, seed: int = 0,
                 min_new: int = 100, periodic_min_new: int = 1000, max_per_bucket: int = 5000, test_ratio: float = 0.1,
                 model_type: str = "xgboost", first_model_check_s: float = 5.0, tolerance: float = 0.02) -> None:
        if retrain_interval_s <= 0:
            raise ValueError("retrain_interval_s must be > 0")
        self.recipe = recipe
        self.tick_interval_s = retrain_interval_s
        self.first_model_check_s = first_model_check_s
        self.min_new = min_new
        self.periodic_min_new = periodic_min_new
        self._dir = Path(tempfile.mkdtemp(prefix="sim-learner-"))
        settings = Settings(data_dir=self._dir, model_type=model_type, retraining_interval_sec=retrain_interval_s,
                            min_samples_for_retrain=min_new, max_training_data_size_per_bucket=max_per_bucket,
                            test_train_ratio=test_ratio, max_stored_samples=1_000_000, ingest_queue_size=1_000_000,
                            bundles_keep=2, publish_tolerance=tolerance)
        self._clock = lambda: 0.0
        #: the training service: its clock is the simulated wall clock (bound by the router)
        self.service = TrainingService(settings, clock=lambda: EPOCH + self._clock(),
                                       train_config=TrainConfig(recipe=recipe, model_type=model_type, seed=seed))
        try:
            self.service.start(run_worker=False)  # cycles are run by the simulator
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self.predictor = InProcessPredictor(lambda: self.service.registry.served)
        self._pending: Future | None = None
        self._last_check = -1e18
        self.invalid = 0
        self.outcomes: dict[str, int] = {}
        self.first_learned_at: float | None = None
        self.samples = 0
        self.samples_at_first_model = 0

    def bind(self, clock) -> None:
        self._clock = clock

    def _worker(self) -> RetrainWorker:
        """The service's retrain worker (it exists once the service is started, in ``__init__``)."""
        worker = self.service.worker
        if worker is None:
            raise RuntimeError("the learner's training service has no retrain worker (not started)")
        return worker

    # -- sink protocol -------------------------------------------------------------------
    def add(self, entries: list[dict]) -> None:
        svc = self.service
        batch = svc.validate([list(entries)])
        self.invalid += batch.total - len(batch.valid)
        if not batch.valid:
            return
        self.samples += len(batch.valid)
        self._pending = svc.submit(batch)
        if svc.registry.served.source != "learned":
            now = self._clock()
            if now - self._last_check >= self.first_model_check_s:
                self._last_check = now
                self._cycle(now)

    # -- retraining ----------------------------------------------------------------------
    def _drain(self) -> None:
        """Wait until every entry produced so far is stored and its live pairs observed (one
        writer, in order: the last submission is the last to resolve)."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def _cycle(self, now: float) -> None:
        self._drain()                   # the cycle sees every entry produced so far
        report = self.service.run_cycle()
        self.outcomes[report.outcome] = self.outcomes.get(report.outcome, 0) + 1
        if report.outcome == "published" and self.first_learned_at is None:
            self.first_learned_at = now
            self.samples_at_first_model = self.samples
            # after the first model, retrain when enough new data arrived (keeps the number of
            # cycles per run bounded by the traffic, not by the simulated duration)
            worker = self._worker()
            worker.min_new = max(self.min_new, self.periodic_min_new)

    def tick(self, now: float) -> None:
        self._cycle(now)

    def stats(self) -> dict:
        self._drain()
        worker = self._worker()
        return {"retrain_" + k: v for k, v in sorted(self.outcomes.items())} | {
            "served_version": self.service.registry.served.version,
            "first_learned_model_at_s": self.first_learned_at,
            "samples_at_first_model": self.samples_at_first_model,
            "invalid_entries": self.invalid,
            "live_pairs": sum(worker.feedback.added.values()),
            "recalibrations": worker.recalibrations,
            "live_factor_ttft": worker.live_factor.get("ttft", 1.0),
            "live_factor_tpot": worker.live_factor.get("tpot", 1.0),
            "engine_fits": worker.engine.fits,
        } | self._engine()

    def _engine(self) -> dict:
        """The served engine section in brief: per class its held-out error, rows and learned step
        coefficients, and per endpoint its learned speed (relative to its class)."""
        engine = self.service.registry.served.manifest.engine
        if engine is None:
            return {}
        classes = engine["classes"]
        return {"engine_heldout_error": {c: s.get("heldout_error") for c, s in classes.items()},
                "engine_rows": {c: s["n_train"] + s["n_heldout"] for c, s in classes.items()},
                "engine_speeds": {e: v["speed"] for s in classes.values() for e, v in s["endpoints"].items()},
                "engine_coefficients": {c: dict(s["coefficients"]) for c, s in classes.items()}}

    def close(self) -> None:
        try:
            self.service.stop()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
