"""Training-server configuration: one frozen, validated settings object.

Every setting is declared once below (environment variable, default, rule, meaning; llm-d
names where one exists) and can be overridden by keyword (the CLI flags do that). A bad
value raises :class:`SettingsError` naming the variable; the server refuses to start with
it. The README's "Configuration" table is ``Settings.doc_table()`` (checked by a test).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from features.settings import (
    EnvSettings,
    SettingsError,
    choice,
    existing_path,
    host,
    integer,
    number,
    optional,
    setting,
    text,
    token,
)

__all__ = ["Settings", "SettingsError"]


def _data_dir(v: Any) -> Path:
    """A directory, or a path the server can create one at (its nearest existing ancestor
    is a directory): a file there would fail at start-up with a raw traceback."""
    p = Path(text(v))
    if not str(v).strip():
        raise ValueError("must be a non-empty path")
    existing = next((q for q in (p, *p.parents) if q.exists() or q.is_symlink()), None)
    if existing is not None and not existing.is_dir():
        raise ValueError(f"{p} is not a directory" + ("" if existing == p else f" ({existing} is not one)"))
    return p


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class Settings(EnvSettings):
    """Validated training-server settings (each field says its variable and meaning)."""

    host: str = setting("LATENCY_TRAINING_HOST", "127.0.0.1", host,
                        "bind address (loopback by default; anything else is an explicit choice)")
    port: int = setting("LATENCY_TRAINING_PORT", 8000, integer(1, 65535), "TCP port (1-65535)")
    data_dir: Path = setting("LATENCY_DATA_DIR", Path("./latency-data"), _data_dir,
                             "holds `samples.sqlite3` (the durable sample store) and `bundles/`",
                             shown="`./latency-data`")
    model_type: str = setting("LATENCY_MODEL_TYPE", "xgboost", choice("xgboost", "lightgbm"),
                              "`xgboost` or `lightgbm`")
    objective_type: str = setting("LATENCY_OBJECTIVE_TYPE", "quantile", choice("quantile", "mean"),
                                  "`quantile` (pinball loss at `LATENCY_QUANTILE_ALPHA`) or `mean` (squared error)")
    quantile_alpha: float = setting("LATENCY_QUANTILE_ALPHA", 0.9, number(0.0, 1.0, lo_open=True, hi_open=True),
                                    "predicted quantile, in (0, 1)")
    retraining_interval_sec: float = setting("LATENCY_RETRAINING_INTERVAL_SEC", 2.0,
                                             number(0.0, 86400.0, lo_open=True),
                                             "seconds between checks for a retrain (> 0)")
    min_samples_for_retrain: int = setting("LATENCY_MIN_SAMPLES_FOR_RETRAIN", 100, integer(1, 10**8),
                                           "new samples since the last training that trigger a retrain; "
                                           "also the minimum to train at all")
    max_training_data_size_per_bucket: int = setting(
        "LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET", 5000, integer(10, 10**7),
        "training rows per stratum (queue x KV x prefix bucket) per target, newest first")
    test_train_ratio: float = setting("LATENCY_TEST_TRAIN_RATIO", 0.1, number(0.0, 0.5, lo_open=True),
                                      "share of rows held out for evaluation and the publish gate, in (0, 0.5]")
    max_stored_samples: int = setting("LATENCY_MAX_STORED_SAMPLES", 1_000_000, integer(100, 10**9),
                                      "cap on stored rows; over it the oldest rows of the largest strata are evicted")
    max_body_bytes: int = setting("LATENCY_MAX_BODY_BYTES", 16 * 1024 * 1024, integer(1024, 1 << 30),
                                  "largest accepted request body (413 above)")
    ingest_queue_size: int = setting("LATENCY_INGEST_QUEUE_SIZE", 100_000, integer(1, 10**8),
                                     "entries waiting for the store writer; when full, ingestion answers 429 "
                                     "with Retry-After")
    max_inflight_bytes: int = setting("LATENCY_MAX_INFLIGHT_BYTES", 16 * 1024 * 1024, integer(1024, 1 << 34),
                                      "request body bytes read and processed at once (>= `LATENCY_MAX_BODY_BYTES`); "
                                      "a body that does not fit gets 429 with Retry-After, unread")
    api_token: str | None = setting("LATENCY_API_TOKEN", None, token,
                                    "when set, write endpoints (`/add_training_data_bulk`, `/flush`) need "
                                    "`Authorization: Bearer <token>`; unset, `/flush` is allowed from loopback only")
    bundles_keep: int = setting("LATENCY_BUNDLES_KEEP", 5, integer(1, 1000),
                                "published bundles kept on disk (for rollback)")
    publish_tolerance: float = setting("LATENCY_PUBLISH_TOLERANCE", 0.02, number(0.0, 1.0),
                                       "a candidate is published only if its held-out pinball loss is at most "
                                       "(1 + this) x the served bundle's, per target")
    log_level: str = setting("LATENCY_LOG_LEVEL", "info", choice(*_LOG_LEVELS),
                             "`debug`, `info`, `warning`, `error` or `critical`")
    seed_bundle: Path | None = setting("LATENCY_SEED_BUNDLE", None, optional(existing_path),
                                       "bundle directory (or `GET /model/export` JSON file) imported at start-up "
                                       "when no bundle exists")

    def check(self) -> None:
        if self.max_inflight_bytes < self.max_body_bytes:
            raise SettingsError("LATENCY_MAX_INFLIGHT_BYTES", f"must be >= LATENCY_MAX_BODY_BYTES "
                                f"({self.max_body_bytes}), or a body of the largest size is never admitted")

    @property
    def store_path(self) -> Path:
        return self.data_dir / "samples.sqlite3"

    @property
    def bundles_dir(self) -> Path:
        return self.data_dir / "bundles"
