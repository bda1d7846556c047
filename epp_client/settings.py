"""Environment settings of the EPP-side clients (llm-d variable names), declared once.

:meth:`PredictorClient.from_env <epp_client.predictor.PredictorClient.from_env>` and
:meth:`TrainingReporter.from_env <epp_client.training.TrainingReporter.from_env>` build
these and refuse to start (:class:`SettingsError` naming the variable) on a bad value. A
blank variable counts as unset. The field names are the clients' constructor keywords.
The README's "EPP side" tables are ``doc_table()`` of these classes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from features.settings import EnvSettings, SettingsError, http_url, integer, setting, url_list

__all__ = ["PredictorSettings", "ReporterSettings", "SettingsError"]

#: upstream MaxBulkSize (LATENCY_MAX_BULK_SIZE, 1..100)
MAX_BULK_SIZE = 100


def _whole_seconds(v: Any) -> float:
    """A whole number of seconds > 0 (upstream reads these as integers), as a float."""
    return float(integer(1)(int(v) if isinstance(v, float) and v.is_integer() else v))


@dataclass(frozen=True)
class PredictorSettings(EnvSettings):
    """What :class:`~epp_client.predictor.PredictorClient` reads from the environment."""

    blank_is_unset = True

    urls: list[str] = setting("PREDICTION_SERVER_URL", ["http://localhost:8001"], url_list(min_items=1),
                              "prediction servers, comma-separated (every one is used)")
    max_bulk_size: int = setting("LATENCY_MAX_BULK_SIZE", MAX_BULK_SIZE, integer(1, 100),
                                 "most rows in one bulk prediction call (1-100)")
    coalesce_window_ms: int = setting("LATENCY_COALESCE_WINDOW_MS", 0, integer(0),
                                      "milliseconds concurrent async calls wait to be merged into one request "
                                      "(0 = off)")
    max_coalesced_rows: int = setting("LATENCY_MAX_COALESCED_ROWS", 0, integer(0),
                                      "rows that dispatch a merged request before its window ends (0 = no cap)")
    max_concurrent_dispatches: int = setting("LATENCY_MAX_CONCURRENT_DISPATCHES", 36, integer(1),
                                             "merged requests in flight at once (> 0)")
    deadline_ms: int = setting("LATENCY_PREDICTION_DEADLINE_MS", 50, integer(1),
                               "milliseconds for a whole call, retry included (> 0)")

    def kwargs(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReporterSettings(EnvSettings):
    """What :class:`~epp_client.training.TrainingReporter` reads from the environment."""

    blank_is_unset = True

    url: str = setting("TRAINING_SERVER_URL", "http://localhost:8000", http_url, "the training server")
    max_sample_size: int = setting("LATENCY_MAX_SAMPLE_SIZE", 1000, integer(1),
                                   "most entries in one flush; above it the batch is stratified-downsampled")
    flush_interval_s: float = setting("LATENCY_FLUSH_INTERVAL_SEC", 1.0, _whole_seconds,
                                      "whole seconds between flushes (> 0)")
    http_timeout_s: float = setting("LATENCY_HTTP_TIMEOUT_SEC", 10.0, _whole_seconds,
                                    "whole seconds allowed for one flush POST (> 0)")

    def kwargs(self) -> dict[str, Any]:
        return asdict(self)
