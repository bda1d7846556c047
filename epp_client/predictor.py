"""Where the producer gets its predictions: the ``Predictor`` protocol and two implementations.

Protocol (duck-typed; both implementations below follow it)::

    predict_bulk(rows: list[dict]) -> BulkPrediction | None         # synchronous
    async apredict_bulk(rows: list[dict]) -> BulkPrediction | None  # asyncio
    metrics: PredictorMetrics                                        # counters, latency
    close() / async aclose()
    engine_section() -> (version, section) | None                    # optional: the learned engine
                                                                     #   step model (decode-harm twin)

``rows`` are wire feature rows (``docs/wire-api.md`` §1.1), one per candidate endpoint.
``None`` means "no predictions" (any failure: invalid rows, too many rows, connection
error, non-200, count mismatch, deadline); the caller then falls back (B1.9) and never
blocks. Predictions map to rows by position.

- :class:`InProcessPredictor` (``get_bundle()`` returns a
  ``features.loaded.LoadedBundle``): validates rows with
  ``features.matrix.raw_matrix`` and calls ``bundle.predict``; for simulators.
- :class:`PredictorClient`: HTTP to N prediction servers (``POST /predict/bulk/strict``),
  spread round-robin, retry once on another server on connection failure, a per-call
  deadline (default 50 ms, A.2.8), a circuit breaker per server (``breaker.py``), an
  optional coalescing window (async, B1.6; ``coalescer.py``), and metrics of calls,
  latency, failures and fallbacks. HTTP goes through ``httpclient.py``, whose only errors
  are ``TransportError`` (any connection or parse failure) and ``TimeoutError``.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from epp_client.breaker import CircuitBreaker
from epp_client.coalescer import Coalescer
from epp_client.engine_fetch import EngineFetcher
from epp_client.httpclient import HttpTransport, ServerAddress, TransportError
from epp_client.settings import MAX_BULK_SIZE, PredictorSettings
from features.schema import FieldError, parse_row

PREDICT_PATH = "/predict/bulk/strict"


@dataclass
class BulkPrediction:
    ttft_ms: list[float]
    tpot_ms: list[float]
    model_version: str = ""
    model_source: str = ""

    def slice(self, offset: int, n: int) -> BulkPrediction:
        """The predictions of rows ``offset .. offset + n - 1``."""
        return BulkPrediction(self.ttft_ms[offset:offset + n], self.tpot_ms[offset:offset + n], self.model_version,
                              self.model_source)


class Predictor(Protocol):
    def predict_bulk(self, rows: list[dict]) -> BulkPrediction | None: ...

    async def apredict_bulk(self, rows: list[dict]) -> BulkPrediction | None: ...


class PredictorMetrics:
    """Counters and a bounded latency reservoir. ``fallbacks`` counts calls that returned
    None (the scheduler then used the composite score)."""

    LATENCY_WINDOW = 10_000

    def __init__(self) -> None:
        self.calls = 0
        self.successes = 0
        self.fallbacks = 0
        self.retries = 0
        self.failures: dict[str, int] = {}
        self.latency_ms: deque = deque(maxlen=self.LATENCY_WINDOW)
        self.per_server: dict[str, dict[str, int]] = {}

    def fail(self, kind: str, server: str | None = None) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1
        if server is not None:
            s = self.per_server.setdefault(server, {"calls": 0, "failures": 0})
            s["failures"] += 1

    def server_call(self, server: str) -> None:
        s = self.per_server.setdefault(server, {"calls": 0, "failures": 0})
        s["calls"] += 1

    def snapshot(self) -> dict[str, Any]:
        lat = sorted(self.latency_ms)

        def q(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0.0

        return {"calls": self.calls, "successes": self.successes, "fallbacks": self.fallbacks,
                "retries": self.retries, "failures": dict(self.failures),
                "latency_ms": {"p50": q(0.5), "p99": q(0.99), "n": len(lat)},
                "per_server": {k: dict(v) for k, v in self.per_server.items()}}


def check_rows(rows: Sequence[dict], max_bulk_size: int = MAX_BULK_SIZE) -> str | None:
    """Client-side checks before any call (B1.6 step 1); an error message or None."""
    if not rows:
        return "empty row list"
    if len(rows) > max_bulk_size:
        return f"{len(rows)} rows exceed the maximum bulk size {max_bulk_size}"
    try:
        for i, r in enumerate(rows):
            parse_row(r, ("requests", i))
    except FieldError as e:
        return str(e)
    return None


class InProcessPredictor:
    """Predictions from a ``LoadedBundle`` in this process (no HTTP)."""

    def __init__(self, get_bundle: Callable[[], Any], max_bulk_size: int = MAX_BULK_SIZE,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.get_bundle = get_bundle
        self.max_bulk_size = max_bulk_size
        self.metrics = PredictorMetrics()
        self._clock = clock

    def predict_bulk(self, rows: list[dict]) -> BulkPrediction | None:
        from features.matrix import raw_matrix

        m = self.metrics
        m.calls += 1
        t0 = self._clock()
        if not rows or len(rows) > self.max_bulk_size:
            m.fail("invalid_rows")
            m.fallbacks += 1
            return None
        try:
            raw = raw_matrix(rows)
            bundle = self.get_bundle()
            ttft, tpot = bundle.predict(raw)
        except FieldError:
            m.fail("invalid_rows")
            m.fallbacks += 1
            return None
        except Exception:  # a broken bundle must not break routing
            m.fail("predict_error")
            m.fallbacks += 1
            return None
        m.successes += 1
        m.latency_ms.append((self._clock() - t0) * 1000.0)
        return BulkPrediction(ttft.tolist(), tpot.tolist(), bundle.version, bundle.source)

    async def apredict_bulk(self, rows: list[dict]) -> BulkPrediction | None:
        return self.predict_bulk(rows)

    def engine_section(self) -> tuple[str, Any] | None:
        """The served bundle's learned engine step model (its manifest ``engine``) and version."""
        bundle = self.get_bundle()
        engine = bundle.manifest.engine
        return None if engine is None else (bundle.version, engine)

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


class _CallFailed(Exception):
    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class PredictorClient:
    """HTTP client for N prediction servers (see the module docstring).

    ``deadline_ms`` bounds a whole call, retry included; ``coalesce_window_ms`` > 0 merges
    concurrent async calls into one POST (B1.6; the sync path never coalesces).
    """

    def __init__(self, urls: Sequence[str] | str, deadline_ms: float = 50.0, max_bulk_size: int = MAX_BULK_SIZE,
                 coalesce_window_ms: float = 0.0, max_coalesced_rows: int = 0, max_concurrent_dispatches: int = 36,
                 failure_threshold: int = 3, circuit_open_s: float = 1.0, max_idle_connections: int = 32,
                 clock: Callable[[], float] = time.monotonic, engine_refresh_s: float = 10.0) -> None:
        if isinstance(urls, str):
            urls = [u for u in (x.strip() for x in urls.split(",")) if u]
        if not urls:
            raise ValueError("PredictorClient needs at least one prediction server URL")
        if deadline_ms <= 0:
            raise ValueError("deadline_ms must be > 0")
        if not 1 <= max_bulk_size <= 10_000:
            raise ValueError("max_bulk_size must be in 1..10000")
        self.servers = [ServerAddress.parse(u) for u in urls]
        self.deadline_s = deadline_ms / 1000.0
        self.max_bulk_size = max_bulk_size
        self.coalesce_window_s = max(0.0, coalesce_window_ms) / 1000.0
        self.max_coalesced_rows = max(0, max_coalesced_rows)
        self.max_concurrent_dispatches = max(1, max_concurrent_dispatches)
        self.clock = clock
        self.breakers = {s.url: CircuitBreaker(failure_threshold, circuit_open_s, clock) for s in self.servers}
        self._transports = {s.url: HttpTransport(s, max_idle_connections) for s in self.servers}
        self._rr = 0
        self._lock = threading.Lock()
        self.metrics = PredictorMetrics()
        self._coalescer: Coalescer | None = None
        self.engine_refresh_s = engine_refresh_s
        self._engine: EngineFetcher | None = None
        self.last_model_version = ""   # of the last predictions (a new one may carry a new engine section)

    def engine_section(self) -> tuple[str, Any] | None:
        """The learned engine step model the prediction servers serve (``GET /v1/engine``),
        refreshed in the background (:class:`~epp_client.engine_fetch.EngineFetcher`)."""
        if self._engine is None:
            self._engine = EngineFetcher([s.url for s in self.servers], self.engine_refresh_s, clock=self.clock)
        return self._engine.current(self.last_model_version)

    @classmethod
    def from_env(cls, **overrides: Any) -> PredictorClient:
        """Upstream environment variables (B1.6, declared in ``epp_client.settings``); a bad
        value raises SettingsError naming the variable. Keyword overrides win."""
        kw: dict[str, Any] = PredictorSettings.from_env().kwargs()
        kw.update(overrides)
        return cls(**kw)

    # -- server choice -------------------------------------------------------------
    def _next_servers(self) -> list[ServerAddress]:
        """Servers whose circuit allows a call, starting at the round-robin position."""
        with self._lock:
            start = self._rr
            self._rr = (self._rr + 1) % len(self.servers)
        n = len(self.servers)
        order = [self.servers[(start + i) % n] for i in range(n)]
        return [s for s in order if self.breakers[s.url].allows()]

    def _parse(self, status: int, payload: bytes, n: int) -> BulkPrediction:
        if status != 200:
            raise _CallFailed(f"status_{status}")
        try:
            preds = orjson.loads(payload)["predictions"]
            if len(preds) != n:
                raise _CallFailed("count_mismatch")
            ttft = [float(p["ttft_ms"]) for p in preds]
            tpot = [float(p["tpot_ms"]) for p in preds]
            first = preds[0] if preds else {}
            self.last_model_version = version = str(first.get("model_version") or "")
            return BulkPrediction(ttft, tpot, version, str(first.get("model_source") or ""))
        except _CallFailed:
            raise
        except Exception:
            raise _CallFailed("bad_response") from None

    def _failed(self, kind: str) -> None:
        self.metrics.fail(kind)
        self.metrics.fallbacks += 1

    # -- one call, shared by both paths ------------------------------------------
    def _begin(self, rows: list[dict]) -> float | None:
        """Count the call and check the rows; the start time, or None when invalid."""
        self.metrics.calls += 1
        t0 = self.clock()
        if check_rows(rows, self.max_bulk_size) is not None:
            self._failed("invalid_rows")
            return None
        return t0

    def _end(self, result: BulkPrediction | None, t0: float) -> BulkPrediction | None:
        m = self.metrics
        if result is None:
            m.fallbacks += 1
        else:
            m.successes += 1
            m.latency_ms.append((self.clock() - t0) * 1000.0)
        return result

    def _attempt(self, attempt: int, s: ServerAddress, t0: float) -> float | None:
        """Bookkeeping before an attempt; the remaining time, or None when it is spent."""
        remaining = self.deadline_s - (self.clock() - t0)
        if remaining <= 0:
            self.metrics.fail("timeout")
            return None
        if attempt:
            self.metrics.retries += 1
        self.metrics.server_call(s.url)
        return remaining

    def _record_failure(self, s: ServerAddress, exc: BaseException) -> bool:
        """Count a failed attempt against the server; True when another server may be tried."""
        self.breakers[s.url].failure()
        if isinstance(exc, TransportError):
            self.metrics.fail("connection", s.url)
            return True
        self.metrics.fail(exc.kind if isinstance(exc, _CallFailed) else "timeout", s.url)
        return False

    def _servers(self) -> list[ServerAddress]:
        servers = self._next_servers()[:2]
        if not servers:
            self.metrics.fail("circuit_open")
        return servers

    # -- synchronous -----------------------------------------------------------------
    def predict_bulk(self, rows: list[dict]) -> BulkPrediction | None:
        t0 = self._begin(rows)
        if t0 is None:
            return None
        return self._end(self._call(orjson.dumps({"requests": rows}), len(rows), t0), t0)

    def _call(self, body: bytes, n: int, t0: float) -> BulkPrediction | None:
        for attempt, s in enumerate(self._servers()):
            remaining = self._attempt(attempt, s, t0)
            if remaining is None:
                return None
            try:
                status, payload = self._transports[s.url].post(PREDICT_PATH, body, remaining)
                result = self._parse(status, payload, n)
            except (TransportError, TimeoutError, _CallFailed) as e:
                if self._record_failure(s, e):
                    continue
                return None
            self.breakers[s.url].success()
            return result
        return None

    # -- asyncio -----------------------------------------------------------------------
    async def apredict_bulk(self, rows: list[dict]) -> BulkPrediction | None:
        t0 = self._begin(rows)
        if t0 is None:
            return None
        if self.coalesce_window_s <= 0:
            return self._end(await self._acall(orjson.dumps({"requests": rows}), len(rows), t0), t0)
        if self._coalescer is None:
            self._coalescer = Coalescer(self.coalesce_window_s, self.max_coalesced_rows,
                                        self.max_concurrent_dispatches, self._acall_rows)
        fut = self._coalescer.submit(rows)
        try:
            result = await asyncio.wait_for(asyncio.shield(fut), self.deadline_s)
        except TimeoutError:
            self.metrics.fail("timeout")
            result = None
        return self._end(result, t0)

    async def _acall_rows(self, rows: list[dict]) -> BulkPrediction | None:
        """One coalesced batch (its deadline starts now)."""
        return await self._acall(orjson.dumps({"requests": rows}), len(rows), self.clock())

    async def _acall(self, body: bytes, n: int, t0: float) -> BulkPrediction | None:
        """One bulk POST within the deadline, retrying once on another server on a
        connection failure. Failures are counted here; None on failure."""
        for attempt, s in enumerate(self._servers()):
            remaining = self._attempt(attempt, s, t0)
            if remaining is None:
                return None
            try:
                async with asyncio.timeout(remaining):
                    status, payload = await self._transports[s.url].apost(PREDICT_PATH, body)
                result = self._parse(status, payload, n)
            except (TransportError, TimeoutError, _CallFailed) as e:
                if self._record_failure(s, e):
                    continue
                return None
            self.breakers[s.url].success()
            return result
        return None

    def close(self) -> None:
        for t in self._transports.values():
            t.close()

    async def aclose(self) -> None:
        if self._coalescer is not None:
            self._coalescer.shutdown()
            self._coalescer = None
        for t in self._transports.values():
            await t.aclose()

