"""Online learning inside the simulation, with the training server's own code.

Training entries from the producer go through the same validation
(``features.schema.parse_training_entry``), the same durable sample store (a real SQLite
file in a temporary directory), the same retrain worker cycle (stratified training set,
``trainer.train_models``, held-out publish gate) and the same bundle registry as the
training server; predictions come from the served ``LoadedBundle`` through epp_client's
``InProcessPredictor``. Only the clock differs: the worker's cycle runs every
``retrain_interval_s`` *simulated* seconds (and, before the first learned model, as soon
as ``min_new`` samples exist, at most every ``first_model_check_s``); once a model is
served, a cycle retrains only with ``periodic_min_new`` new samples (the server's
default is 100 every 2 s of wall time: fresher models than here). Training takes no
simulated time.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from epp_client.predictor import InProcessPredictor
from features.schema import FieldError, parse_training_entry
from training_server import trainer
from training_server.metrics import TrainingMetrics
from training_server.registry import Registry
from training_server.store import SampleStore, entries_to_rows
from training_server.worker import RetrainWorker

from .epp_routers import EPOCH


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
        self.store = SampleStore(self._dir / "samples.sqlite3", max_rows=1_000_000, queue_size=1_000_000,
                                 test_ratio=test_ratio).open()
        self.registry = Registry(self._dir / "bundles", keep=2)
        self.metrics = TrainingMetrics()
        config = trainer.TrainConfig(recipe=recipe, model_type=model_type, seed=seed)
        self.worker = RetrainWorker(self.store, self.registry, self.metrics, config=config,
                                    interval=retrain_interval_s, min_new=min_new, max_per_bucket=max_per_bucket,
                                    tolerance=tolerance)
        self.predictor = InProcessPredictor(lambda: self.registry.served)
        self._pending = None
        self._clock = lambda: 0.0
        self._last_check = -1e18
        self.invalid = 0
        self.outcomes: dict[str, int] = {}
        self.first_learned_at: float | None = None
        self.samples = 0
        self.samples_at_first_model = 0

    def bind(self, clock) -> None:
        self._clock = clock

    # -- sink protocol -------------------------------------------------------------------
    def add(self, entries: list[dict]) -> None:
        parsed = []
        for i, e in enumerate(entries):
            try:
                parsed.append(parse_training_entry(e, ("entries", i)))
            except FieldError:
                self.invalid += 1
        if not parsed:
            return
        self.samples += len(parsed)
        self._pending = self.store.submit(entries_to_rows(parsed, now=EPOCH + self._clock()))
        if self.registry.served.source != "learned":
            now = self._clock()
            if now - self._last_check >= self.first_model_check_s:
                self._last_check = now
                self._cycle(now)

    # -- retraining ----------------------------------------------------------------------
    def _cycle(self, now: float) -> None:
        if self._pending is not None:
            self._pending.result()      # the cycle sees every entry produced so far
            self._pending = None
        report = self.worker.run_once()
        self.outcomes[report.outcome] = self.outcomes.get(report.outcome, 0) + 1
        if report.outcome == "published" and self.first_learned_at is None:
            self.first_learned_at = now
            self.samples_at_first_model = self.samples
            # after the first model, retrain when enough new data arrived (keeps the number of
            # cycles per run bounded by the traffic, not by the simulated duration)
            self.worker.min_new = max(self.min_new, self.periodic_min_new)

    def tick(self, now: float) -> None:
        self._cycle(now)

    def stats(self) -> dict:
        return {"retrain_" + k: v for k, v in sorted(self.outcomes.items())} | {
            "served_version": self.registry.served.version,
            "first_learned_model_at_s": self.first_learned_at,
            "samples_at_first_model": self.samples_at_first_model,
            "invalid_entries": self.invalid,
        }

    def close(self) -> None:
        try:
            self.store.close()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
