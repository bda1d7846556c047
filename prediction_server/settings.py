"""Configuration of the prediction server: one frozen, validated object.

Every setting is declared once below (environment variable, default, rule, meaning).
Built with :meth:`Settings.from_env` from the environment, with keyword overrides
(command-line flags, tests). A bad value raises :class:`SettingsError` naming the
variable; ``__main__`` turns that into exit status 2. The README's "Configuration" table
is ``Settings.doc_table()`` (checked by a test).
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from features.settings import (
    EnvSettings,
    SettingsError,
    boolean,
    choice,
    host,
    http_url,
    integer,
    number,
    optional,
    setting,
    text,
    token,
)

__all__ = ["Settings", "SettingsError", "redact_url"]

_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def redact_url(url: str) -> str:
    """``url`` with any user:password replaced by ``***`` (for /status and logs)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


@dataclass(frozen=True)
class Settings(EnvSettings):
    host: str = setting("LATENCY_PREDICTION_HOST", "127.0.0.1", host, "bind address (loopback unless set)")
    port: int = setting("LATENCY_PREDICTION_PORT", 8001, integer(0, 65535), "bind port (0 = any free port)")
    training_server_url: str = setting("TRAINING_SERVER_URL", "http://127.0.0.1:8000", optional(http_url, ""),
                                       'where bundles are polled; `""` = none')
    bundle_dir: str | None = setting("LATENCY_BUNDLE_DIR", None, optional(text),
                                     "local bundle directory (shared volume), watched in addition to polling")
    sync_interval_sec: float = setting("MODEL_SYNC_INTERVAL_SEC", 5.0, number(0.0, 86_400.0, lo_open=True),
                                       "seconds between bundle polls (> 0)")
    refuse_without_model: bool = setting("LATENCY_REFUSE_WITHOUT_MODEL", False, boolean,
                                         "`true`: 503 on predictions until a learned model is loaded; `false`: "
                                         'answer from the prior (model_source `"prior"`)')
    api_token: str | None = setting("LATENCY_API_TOKEN", None, token,
                                    "bearer token required on `POST /reload` (8+ printable characters)")
    max_body_bytes: int = setting("LATENCY_MAX_BODY_BYTES", 4 * 1024 * 1024, integer(1024, 1 << 30),
                                  "larger request bodies get 413")
    max_batch_rows: int = setting("LATENCY_MAX_BATCH_ROWS", 10_000, integer(1, 1_000_000),
                                  "larger batches get 422 (`requests`)")
    quantile_alpha: float = setting("LATENCY_QUANTILE_ALPHA", 0.9, number(0.0, 1.0, lo_open=True, hi_open=True),
                                    "quantile reported with the built-in prior")
    log_level: str = setting("LATENCY_LOG_LEVEL", "info", choice(*_LOG_LEVELS),
                             "`debug`, `info`, `warning`, `error` or `critical`")
    access_log: bool = setting("LATENCY_ACCESS_LOG", False, boolean, "uvicorn access log (costs throughput)")
    enable_bench_routes: bool = setting("LATENCY_ENABLE_BENCH_ROUTES", False, boolean,
                                        "`POST /bench/noop` (benchmark floor); never enable in production")
    sync_timeout_sec: float = setting("LATENCY_SYNC_TIMEOUT_SEC", 10.0, number(0.0, 3600.0, lo_open=True),
                                      "per-request timeout of bundle downloads")
    max_bundle_bytes: int = setting("LATENCY_MAX_BUNDLE_BYTES", 64 * 1024 * 1024, integer(64 * 1024, 1 << 30),
                                    "bundles whose model files declare more bytes in all are refused unread "
                                    "(downloads are capped at each file's declared size)")
