"""The training service: the training server's work without a transport.

One object holds the sample store, the bundle registry, the retrain worker and the metrics:

* ingestion: :meth:`TrainingService.validate` (per-entry validation, the first errors
  named) then :meth:`TrainingService.submit` (stored rows; the returned future resolves
  after the durable commit, when the entries' live pairs have reached the worker's live
  feedback); :meth:`TrainingService.ingest` does both for a list of entries;
* learning: :meth:`TrainingService.run_cycle` (one live correction + retrain cycle; the
  worker thread runs them on an interval when started with ``run_worker``);
* answers: :meth:`TrainingService.predict`, :meth:`TrainingService.flush`,
  :meth:`TrainingService.render_metrics`, and the read-only ones in :mod:`.info`.

The HTTP app (:mod:`.app`) adapts it (bodies, status codes, auth); the simulator
(``load.sim.online``) uses it as is, with ``clock`` returning simulated time. Without a
clock, rows are stamped with ``time.time()`` and live pairs dated with ``time.monotonic()``.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from features.bundle import make_lineage
from features.render import PredictionFields, rfc3339
from features.schema import FieldError, TrainingEntry, parse_row, parse_training_entry

from .feedback import LiveFeedback, pair_entries
from .metrics import TrainingMetrics
from .registry import Registry
from .settings import Settings
from .store import SampleStore, entries_to_rows
from .trainer import TrainConfig
from .worker import CycleReport, RetrainWorker

if TYPE_CHECKING:
    from features.loaded import LoadedBundle

#: validation errors named in an ingest answer (all are counted)
MAX_ERRORS_REPORTED = 10


@dataclass
class Batch:
    """Validated training entries: the valid ones, the first errors ({"index", "loc",
    "msg", "type"}) and how many entries there were."""

    valid: list[TrainingEntry]
    errors: list[dict]
    total: int


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    total: int
    errors: list[dict]

    @property
    def rejected(self) -> int:
        return self.total - self.accepted

    def to_json(self) -> dict:
        return {"message": f"accepted {self.accepted} of {self.total} entries", "accepted": self.accepted,
                "rejected": self.rejected, "errors": self.errors}


def prediction_object(bundle: LoadedBundle, ttft: float, tpot: float, now: float | None = None) -> dict:
    """One prediction ``p`` (wire-api §1.2) plus model_version and model_source, exactly as
    the prediction server renders it."""
    now = time.time() if now is None else now
    return PredictionFields.of(bundle).render(np.array([float(ttft)]), np.array([float(tpot)]), rfc3339(now))[0]


class TrainingService:
    """Store, registry, retrain worker and metrics, configured by ``settings``;
    ``train_config`` overrides the one the settings give (the simulator's recipe and seed)."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] | None = None,
                 train_config: TrainConfig | None = None) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = TrainingMetrics()
        self.store = SampleStore(settings.store_path, max_rows=settings.max_stored_samples,
                                 queue_size=settings.ingest_queue_size, test_ratio=settings.test_train_ratio)
        self.store.on_commit = lambda n, dt: self.metrics.commit_latency.observe(dt)
        self.registry = Registry(settings.bundles_dir, keep=settings.bundles_keep, quantile=settings.quantile_alpha)
        self.train_config = train_config or TrainConfig(model_type=settings.model_type,
                                                        objective=settings.objective_type,
                                                        quantile=settings.quantile_alpha)
        self.worker: RetrainWorker | None = None
        #: XGBoost JSON dumps of the served models (/model/*/xgb/json), by (version, target)
        self.xgb_json_cache: dict[tuple[str, str], bytes] = {}
        self.started_at = time.time()

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self, run_worker: bool = True) -> TrainingService:
        """Open the store, serve the newest bundle (or the seed, or the prior) and create the
        worker; ``run_worker`` starts its thread (else cycles run only by :meth:`run_cycle`)."""
        self.store.open()
        self.registry.lineage = make_lineage(self.store.store_id, self.store.created_at)
        bundle = self.registry.load(self.settings.seed_bundle)
        self.metrics.set_served(bundle.version, bundle.source, bundle.loaded_at)
        if bundle.source == "learned":
            self.metrics.set_heldout(bundle.manifest.metrics_json())
        s = self.settings
        clock = {} if self.clock is None else {"clock": self.clock}
        self.worker = RetrainWorker(self.store, self.registry, self.metrics, config=self.train_config,
                                    interval=s.retraining_interval_sec, min_new=s.min_samples_for_retrain,
                                    max_per_bucket=s.max_training_data_size_per_bucket,
                                    tolerance=s.publish_tolerance, **clock)
        if run_worker:
            self.worker.start()
        return self

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop(timeout=3.0)
        self.store.close()

    def _started(self) -> RetrainWorker:
        if self.worker is None:
            raise RuntimeError("the training service is not started (call start() first)")
        return self.worker

    @property
    def feedback(self) -> LiveFeedback:
        """The retrain worker's live feedback (live error window and correction pairs)."""
        return self._started().feedback

    # ---- ingestion ---------------------------------------------------------------------
    def has_room(self) -> bool:
        """False when the write queue is full (refuse before reading a body)."""
        return self.store.queue_depth < self.store.queue_size

    def validate(self, parts: Iterable[list]) -> Batch:
        """Validate training entries given as lists (slices of one request); each parsed
        dict is freed as it is converted. Rejections are counted by reason."""
        valid, errors = [], []
        reasons: dict[str, int] = {}
        i = 0
        for part in parts:
            for k, obj in enumerate(part):
                part[k] = None
                try:
                    valid.append(parse_training_entry(obj, ("entries", i)))
                except FieldError as e:
                    reasons[e.kind] = reasons.get(e.kind, 0) + 1
                    if len(errors) < MAX_ERRORS_REPORTED:
                        errors.append({"index": i, "loc": ["body", *e.loc], "msg": e.msg, "type": e.kind})
                i += 1
        for kind, n in reasons.items():
            self.metrics.rejected.labels(kind).inc(n)
        return Batch(valid, errors, i)

    def submit(self, batch: Batch) -> Future[IngestResult]:
        """Store the valid entries of ``batch``. The future resolves after the durable commit
        (the live pairs of the entries then reach the worker's live feedback), or fails with
        the commit's error. Raises ``store.Saturated`` (queue full) or ``store.StoreClosed``."""
        worker = self._started()
        live, correction = pair_entries(batch.valid, self.registry.served.version,
                                        self.registry.is_learned_version)
        rows = entries_to_rows(batch.valid, now=None if self.clock is None else self.clock())
        result = IngestResult(len(batch.valid), batch.total, batch.errors)
        stored = self.store.submit(rows)
        del rows
        done: Future = Future()

        def committed(f: Future) -> None:
            try:
                f.result()
            except BaseException as e:  # noqa: BLE001 (handed to the caller)
                done.set_exception(e)
                return
            self.metrics.accepted.inc(result.accepted)
            worker.feedback.observe(live, correction)
            done.set_result(result)

        stored.add_done_callback(committed)
        return done

    def ingest(self, entries: Iterable[Mapping]) -> Future[IngestResult]:
        """Validate and store wire-format training entries (dicts); see :meth:`submit`."""
        return self.submit(self.validate([list(entries)]))

    # ---- learning ----------------------------------------------------------------------
    def run_cycle(self) -> CycleReport:
        """One cycle of the worker: live correction, then a retrain when enough new rows."""
        return self._started().run_once()

    # ---- other answers ---------------------------------------------------------------------
    def flush(self, *, training: bool, test: bool) -> Future[int]:
        """Delete the stored training and/or test rows; resolves to the rows left."""
        if training or test:
            return self.store.flush(training, test)
        done: Future = Future()
        done.set_result(self.store.rows)
        return done

    def reset_live(self) -> None:
        """Forget the live-error window of the served bundle."""
        self.feedback.reset_live()

    def predict(self, row: Any) -> dict:
        """The served bundle's prediction for one wire-format row (raises FieldError)."""
        raw = np.array([parse_row(row)], dtype=np.float64)
        b = self.registry.served
        ttft, tpot = b.predict(raw)
        return prediction_object(b, float(ttft[0]), float(tpot[0]))

    def render_metrics(self) -> bytes:
        live = self.worker.feedback.live_scores() if self.worker is not None else {}
        return self.metrics.render(self.store.rows, self.store.queue_depth, live)
