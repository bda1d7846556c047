"""Configuration of the prediction server: one frozen, validated object.

Built with :meth:`Settings.from_env` from environment variables (names below), with
keyword overrides (command-line flags, tests). A bad value raises :class:`SettingsError`
naming the environment variable; ``__main__`` turns that into exit status 2.

======================================  ===========================  ===========================================
Environment variable                    Default                      Meaning
======================================  ===========================  ===========================================
``LATENCY_PREDICTION_HOST``             ``127.0.0.1``                bind address (loopback unless set)
``LATENCY_PREDICTION_PORT``             ``8001``                     bind port (0 = any free port)
``TRAINING_SERVER_URL``                 ``http://127.0.0.1:8000``    where bundles are polled; ``""`` = none
``LATENCY_BUNDLE_DIR``                  unset                        local bundle directory (shared volume),
                                                                     watched in addition to polling
``MODEL_SYNC_INTERVAL_SEC``             ``5``                        seconds between bundle polls (> 0)
``LATENCY_REFUSE_WITHOUT_MODEL``        ``false``                    ``true``: 503 on predictions until a
                                                                     learned model is loaded; ``false``:
                                                                     answer from the prior (model_source
                                                                     ``"prior"``)
``LATENCY_API_TOKEN``                   unset                        bearer token required on ``POST /reload``
                                                                     (8+ printable characters)
``LATENCY_MAX_BODY_BYTES``              ``4194304``                  larger request bodies get 413
``LATENCY_MAX_BATCH_ROWS``              ``10000``                    larger batches get 422 (``requests``)
``LATENCY_QUANTILE_ALPHA``              ``0.9``                      quantile reported with the built-in prior
``LATENCY_LOG_LEVEL``                   ``info``                     debug, info, warning, error
``LATENCY_ACCESS_LOG``                  ``false``                    uvicorn access log (costs throughput)
``LATENCY_ENABLE_BENCH_ROUTES``         ``false``                    ``POST /bench/noop`` (benchmark floor);
                                                                     never enable in production
``LATENCY_SYNC_TIMEOUT_SEC``            ``10``                       per-request timeout of bundle downloads
``LATENCY_MAX_BUNDLE_BYTES``            ``67108864``                 bundles whose model files declare more
                                                                     bytes (in all) are refused unread
======================================  ===========================  ===========================================
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping
from urllib.parse import urlparse, urlsplit, urlunsplit


class SettingsError(ValueError):
    """A setting has a bad value; ``env`` is the environment variable at fault."""

    def __init__(self, env: str, msg: str) -> None:
        self.env = env
        super().__init__(f"{env}: {msg}")


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _bool(env: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise SettingsError(env, f"must be true or false, got {value!r}")


def _int(lo: int, hi: int) -> Callable[[str, str], int]:
    def parse(env: str, value: str) -> int:
        try:
            x = int(value.strip())
        except ValueError:
            raise SettingsError(env, f"must be an integer, got {value!r}") from None
        if not lo <= x <= hi:
            raise SettingsError(env, f"must be between {lo} and {hi}, got {x}")
        return x
    return parse


def _float(lo: float, hi: float, open_lo: bool = False, open_hi: bool = False) -> Callable[[str, str], float]:
    def parse(env: str, value: str) -> float:
        try:
            x = float(value.strip())
        except ValueError:
            raise SettingsError(env, f"must be a number, got {value!r}") from None
        if not (x > lo if open_lo else x >= lo) or not (x < hi if open_hi else x <= hi):
            raise SettingsError(env, f"must be in {'(' if open_lo else '['}{lo:g}, {hi:g}{')' if open_hi else ']'}, got {value!r}")
        return x
    return parse


def _str(env: str, value: str) -> str:
    return value.strip()


def _opt_str(env: str, value: str) -> str | None:
    return value.strip() or None


def _token(env: str, value: str) -> str | None:
    if value == "":
        return None
    if value != value.strip() or len(value) < 8 or not value.isprintable():
        raise SettingsError(env, "must be at least 8 printable characters without surrounding spaces")
    return value


def _url(env: str, value: str) -> str:
    v = value.strip().rstrip("/")
    if not v:
        return ""
    u = urlparse(v)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise SettingsError(env, f"must be an http(s) URL or empty, got {value!r}")
    return v


def redact_url(url: str) -> str:
    """``url`` with any user:password replaced by ``***`` (for /status and logs)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def _log_level(env: str, value: str) -> str:
    v = value.strip().lower()
    if v not in _LOG_LEVELS:
        raise SettingsError(env, f"must be one of {', '.join(_LOG_LEVELS)}, got {value!r}")
    return v


def _host(env: str, value: str) -> str:
    v = value.strip()
    if not v or any(c.isspace() for c in v):
        raise SettingsError(env, f"must be a host name or address, got {value!r}")
    return v


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8001
    training_server_url: str = "http://127.0.0.1:8000"
    bundle_dir: str | None = None
    sync_interval_sec: float = 5.0
    refuse_without_model: bool = False
    api_token: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    max_batch_rows: int = 10_000
    quantile_alpha: float = 0.9
    log_level: str = "info"
    access_log: bool = False
    enable_bench_routes: bool = False
    sync_timeout_sec: float = 10.0
    max_bundle_bytes: int = 64 * 1024 * 1024

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Read settings from ``environ`` (default ``os.environ``), then apply ``overrides``
        (attribute names; ``None`` means "not given"). Validates everything."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for attr, (env, parse) in _ENV.items():
            if overrides.get(attr) is not None:
                raw = overrides[attr]
                values[attr] = parse(env, raw) if isinstance(raw, str) else raw
            elif env in environ:
                values[attr] = parse(env, environ[env])
        unknown = set(overrides) - set(_ENV)
        if unknown:
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        s = cls(**values)
        s.validate()
        return s

    def validate(self) -> None:
        """Re-check typed values (overrides may bypass string parsing)."""
        for attr, (env, parse) in _ENV.items():
            value = getattr(self, attr)
            if value is None:
                continue
            if isinstance(value, bool) and attr not in _BOOLS:
                raise SettingsError(env, f"must not be a boolean, got {value!r}")
            if attr in _BOOLS and not isinstance(value, bool):
                raise SettingsError(env, f"must be true or false, got {value!r}")
            parse(env, str(value))  # range checks

    def replace(self, **changes: Any) -> "Settings":
        s = dataclasses.replace(self, **changes)
        s.validate()
        return s

    def env_name(self, attr: str) -> str:
        return _ENV[attr][0]


_ENV: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "host": ("LATENCY_PREDICTION_HOST", _host),
    "port": ("LATENCY_PREDICTION_PORT", _int(0, 65535)),
    "training_server_url": ("TRAINING_SERVER_URL", _url),
    "bundle_dir": ("LATENCY_BUNDLE_DIR", _opt_str),
    "sync_interval_sec": ("MODEL_SYNC_INTERVAL_SEC", _float(0.0, 86_400.0, open_lo=True)),
    "refuse_without_model": ("LATENCY_REFUSE_WITHOUT_MODEL", _bool),
    "api_token": ("LATENCY_API_TOKEN", _token),
    "max_body_bytes": ("LATENCY_MAX_BODY_BYTES", _int(1024, 1 << 30)),
    "max_batch_rows": ("LATENCY_MAX_BATCH_ROWS", _int(1, 1_000_000)),
    "quantile_alpha": ("LATENCY_QUANTILE_ALPHA", _float(0.0, 1.0, open_lo=True, open_hi=True)),
    "log_level": ("LATENCY_LOG_LEVEL", _log_level),
    "access_log": ("LATENCY_ACCESS_LOG", _bool),
    "enable_bench_routes": ("LATENCY_ENABLE_BENCH_ROUTES", _bool),
    "sync_timeout_sec": ("LATENCY_SYNC_TIMEOUT_SEC", _float(0.0, 3600.0, open_lo=True)),
    "max_bundle_bytes": ("LATENCY_MAX_BUNDLE_BYTES", _int(64 * 1024, 1 << 30)),
}
_BOOLS = frozenset({"refuse_without_model", "access_log", "enable_bench_routes"})
