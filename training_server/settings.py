"""Training-server configuration: one frozen, validated settings object.

Every setting comes from an environment variable (llm-d names where one exists) and can
be overridden by keyword (the CLI flags do that). A bad value raises :class:`SettingsError`
naming the variable; the server refuses to start with it.

| variable | default | meaning |
|---|---|---|
| `LATENCY_TRAINING_HOST` | `127.0.0.1` | bind address (loopback by default; anything else is an explicit choice) |
| `LATENCY_TRAINING_PORT` | `8000` | TCP port (1-65535) |
| `LATENCY_DATA_DIR` | `./latency-data` | holds `samples.sqlite3` (the durable sample store) and `bundles/` |
| `LATENCY_MODEL_TYPE` | `xgboost` | `xgboost` or `lightgbm` |
| `LATENCY_OBJECTIVE_TYPE` | `quantile` | `quantile` (pinball loss at `LATENCY_QUANTILE_ALPHA`) or `mean` (squared error) |
| `LATENCY_QUANTILE_ALPHA` | `0.9` | predicted quantile, in (0, 1) |
| `LATENCY_RETRAINING_INTERVAL_SEC` | `2` | seconds between checks for a retrain (> 0) |
| `LATENCY_MIN_SAMPLES_FOR_RETRAIN` | `100` | new samples since the last training that trigger a retrain; also the minimum to train at all |
| `LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET` | `5000` | training rows per stratum (queue x KV x prefix bucket) per target, newest first |
| `LATENCY_TEST_TRAIN_RATIO` | `0.1` | share of rows held out for evaluation and the publish gate, in (0, 0.5] |
| `LATENCY_MAX_STORED_SAMPLES` | `1000000` | cap on stored rows; over it the oldest rows of the largest strata are evicted |
| `LATENCY_MAX_BODY_BYTES` | `16777216` | largest accepted request body (413 above) |
| `LATENCY_INGEST_QUEUE_SIZE` | `100000` | entries waiting for the store writer; when full, ingestion answers 429 with Retry-After |
| `LATENCY_MAX_INFLIGHT_BYTES` | `16777216` | request body bytes being read and processed at once (>= `LATENCY_MAX_BODY_BYTES`); a body that does not fit gets 429 with Retry-After, unread |
| `LATENCY_API_TOKEN` | unset | when set, write endpoints (`/add_training_data_bulk`, `/flush`) need `Authorization: Bearer <token>`; unset, `/flush` is allowed from loopback only |
| `LATENCY_BUNDLES_KEEP` | `5` | published bundles kept on disk (for rollback) |
| `LATENCY_PUBLISH_TOLERANCE` | `0.02` | a candidate is published only if its held-out pinball loss is at most (1 + this) x the served bundle's, per target |
| `LATENCY_LOG_LEVEL` | `info` | `debug`, `info`, `warning`, `error` or `critical` |
| `LATENCY_SEED_BUNDLE` | unset | bundle directory (or `GET /model/export` JSON file) imported at start-up when no bundle exists |
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping


class SettingsError(ValueError):
    """A setting has a bad value; the message names the environment variable."""

    def __init__(self, env: str, msg: str) -> None:
        self.env = env
        self.msg = msg
        super().__init__(f"{env}: {msg}")


def _int(lo: int, hi: int | None = None) -> Callable[[Any], int]:
    def parse(v: Any) -> int:
        if isinstance(v, bool):
            raise ValueError("must be an integer")
        if isinstance(v, str):
            v = v.strip()
            if not v.lstrip("+-").isdigit():
                raise ValueError(f"must be an integer, got {v!r}")
        elif not isinstance(v, int):
            raise ValueError(f"must be an integer, got {v!r}")
        x = int(v)
        if x < lo or (hi is not None and x > hi):
            raise ValueError(f"must be >= {lo}" + ("" if hi is None else f" and <= {hi}") + f", got {x}")
        return x
    return parse


def _float(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> Callable[[Any], float]:
    def parse(v: Any) -> float:
        if isinstance(v, bool):
            raise ValueError("must be a number")
        try:
            x = float(v.strip() if isinstance(v, str) else v)
        except (TypeError, ValueError):
            raise ValueError(f"must be a number, got {v!r}") from None
        if x != x or (x <= lo if lo_open else x < lo) or (x >= hi if hi_open else x > hi):
            raise ValueError(f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}, got {v!r}")
        return x
    return parse


def _choice(*options: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        s = str(v).strip().lower()
        if s not in options:
            raise ValueError(f"must be one of {', '.join(options)}; got {v!r}")
        return s
    return parse


def _host(v: Any) -> str:
    s = str(v).strip()
    if not s or any(c.isspace() for c in s) or len(s) > 253:
        raise ValueError(f"must be a host name or IP address, got {v!r}")
    return s


def _path(v: Any) -> Path:
    s = str(v).strip()
    if not s:
        raise ValueError("must be a non-empty path")
    return Path(s)


def _data_dir(v: Any) -> Path:
    """A directory, or a path the server can create one at (its nearest existing ancestor
    is a directory): a file there would fail at start-up with a raw traceback."""
    p = _path(v)
    existing = next((q for q in (p, *p.parents) if q.exists() or q.is_symlink()), None)
    if existing is not None and not existing.is_dir():
        raise ValueError(f"{p} is not a directory" + ("" if existing == p else f" ({existing} is not one)"))
    return p


def _optional_token(v: Any) -> str | None:
    if v is None:
        return None
    s = str(v)
    if s == "":
        return None
    if s != s.strip() or len(s) < 8 or any(not c.isprintable() for c in s):
        raise ValueError("must be at least 8 printable characters without surrounding spaces")
    return s


def _seed_path(v: Any) -> Path | None:
    if v is None or str(v).strip() == "":
        return None
    p = Path(str(v).strip())
    if not p.exists():
        raise ValueError(f"{p} does not exist")
    return p


# field name -> (environment variable, parser, default)
_SPEC: dict[str, tuple[str, Callable[[Any], Any], Any]] = {
    "host": ("LATENCY_TRAINING_HOST", _host, "127.0.0.1"),
    "port": ("LATENCY_TRAINING_PORT", _int(1, 65535), 8000),
    "data_dir": ("LATENCY_DATA_DIR", _data_dir, "./latency-data"),
    "model_type": ("LATENCY_MODEL_TYPE", _choice("xgboost", "lightgbm"), "xgboost"),
    "objective_type": ("LATENCY_OBJECTIVE_TYPE", _choice("quantile", "mean"), "quantile"),
    "quantile_alpha": ("LATENCY_QUANTILE_ALPHA", _float(0.0, 1.0, True, True), 0.9),
    "retraining_interval_sec": ("LATENCY_RETRAINING_INTERVAL_SEC", _float(0.0, 86400.0, lo_open=True), 2.0),
    "min_samples_for_retrain": ("LATENCY_MIN_SAMPLES_FOR_RETRAIN", _int(1, 10**8), 100),
    "max_training_data_size_per_bucket": ("LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET", _int(10, 10**7), 5000),
    "test_train_ratio": ("LATENCY_TEST_TRAIN_RATIO", _float(0.0, 0.5, lo_open=True), 0.1),
    "max_stored_samples": ("LATENCY_MAX_STORED_SAMPLES", _int(100, 10**9), 1_000_000),
    "max_body_bytes": ("LATENCY_MAX_BODY_BYTES", _int(1024, 1 << 30), 16 * 1024 * 1024),
    "ingest_queue_size": ("LATENCY_INGEST_QUEUE_SIZE", _int(1, 10**8), 100_000),
    "max_inflight_bytes": ("LATENCY_MAX_INFLIGHT_BYTES", _int(1024, 1 << 34), 16 * 1024 * 1024),
    "api_token": ("LATENCY_API_TOKEN", _optional_token, None),
    "bundles_keep": ("LATENCY_BUNDLES_KEEP", _int(1, 1000), 5),
    "publish_tolerance": ("LATENCY_PUBLISH_TOLERANCE", _float(0.0, 1.0), 0.02),
    "log_level": ("LATENCY_LOG_LEVEL", _choice("debug", "info", "warning", "error", "critical"), "info"),
    "seed_bundle": ("LATENCY_SEED_BUNDLE", _seed_path, None),
}


@dataclass(frozen=True)
class Settings:
    """Validated training-server settings (see the module docstring for each one)."""

    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Path("./latency-data")
    model_type: str = "xgboost"
    objective_type: str = "quantile"
    quantile_alpha: float = 0.9
    retraining_interval_sec: float = 2.0
    min_samples_for_retrain: int = 100
    max_training_data_size_per_bucket: int = 5000
    test_train_ratio: float = 0.1
    max_stored_samples: int = 1_000_000
    max_body_bytes: int = 16 * 1024 * 1024
    ingest_queue_size: int = 100_000
    max_inflight_bytes: int = 16 * 1024 * 1024
    api_token: str | None = None
    bundles_keep: int = 5
    publish_tolerance: float = 0.02
    log_level: str = "info"
    seed_bundle: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Build from ``environ`` (default ``os.environ``); keyword overrides win (None = not given)."""
        env = os.environ if environ is None else environ
        unknown = set(overrides) - set(_SPEC)
        if unknown:
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        values: dict[str, Any] = {}
        for name, (var, parse, default) in _SPEC.items():
            raw = overrides.get(name)
            if raw is None:
                raw = env.get(var)
            try:
                values[name] = parse(default) if raw is None else parse(raw)
            except ValueError as e:
                raise SettingsError(var, str(e)) from None
        if values["max_inflight_bytes"] < values["max_body_bytes"]:
            raise SettingsError("LATENCY_MAX_INFLIGHT_BYTES", f"must be >= LATENCY_MAX_BODY_BYTES "
                                f"({values['max_body_bytes']}), or a body of the largest size is never admitted")
        return cls(**values)

    @property
    def store_path(self) -> Path:
        return self.data_dir / "samples.sqlite3"

    @property
    def bundles_dir(self) -> Path:
        return self.data_dir / "bundles"

    def env_names(self) -> dict[str, str]:
        return {f.name: _SPEC[f.name][0] for f in fields(self)}
