"""Durable, bounded sample store: SQLite in WAL mode with one group-committing writer.

* Durability: ``journal_mode=WAL`` with ``synchronous=FULL``: a commit returns only after
  the WAL is fsynced, and the HTTP handler acknowledges (202) only after the commit
  holding its entries returned. An acknowledged entry survives ``kill -9``.
* Group commit: handlers :meth:`SampleStore.submit` a batch into a bounded in-memory
  queue (bounded in *entries*) and await a future; the single writer thread takes every
  waiting batch and commits them in one transaction. A full queue raises
  :class:`Saturated` (HTTP 429 with Retry-After): back-pressure instead of growth.
* Bound: at most ``max_rows`` rows. Over it, the oldest rows of the *largest* strata are
  deleted first (water-filling on per-stratum counts kept in memory), in the same
  transaction as the insert, so rare regimes survive and the cap always holds on disk.
* Reading for training uses its own connection (WAL readers never block the writer) and
  returns numpy arrays; the stratified selection happens in SQL, so only the rows that
  can be selected are materialised.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from features.schema import RAW_COLUMNS, TrainingEntry

from . import sampling
from .engine_store import ENGINE_COLUMNS, EngineRows, engine_rows_after, engine_values, migrate, read_engine_rows

log = logging.getLogger("training_server.store")

TARGET_COLUMNS = ("actual_ttft_ms", "actual_tpot_ms", "ts", "predicted_ttft_ms", "predicted_tpot_ms",
                  "model_version", *ENGINE_COLUMNS, "stratum")
COLUMNS = (*RAW_COLUMNS, *TARGET_COLUMNS)
#: Most entries one transaction takes from the queue (bounds a commit's duration).
MAX_ENTRIES_PER_COMMIT = 50_000

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS samples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    {", ".join(f"{c} REAL NOT NULL" for c in RAW_COLUMNS)},
    actual_ttft_ms REAL NOT NULL,
    actual_tpot_ms REAL NOT NULL,
    ts REAL NOT NULL,
    predicted_ttft_ms REAL NOT NULL DEFAULT 0,
    predicted_tpot_ms REAL NOT NULL DEFAULT 0,
    model_version TEXT NOT NULL DEFAULT '',
    stratum INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_stratum_id ON samples (stratum, id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_INSERT = f"INSERT INTO samples ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"


class Saturated(Exception):
    """The ingest queue is full; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: int = 1) -> None:
        self.retry_after = retry_after
        super().__init__(f"ingest queue full, retry after {retry_after}s")


class StoreClosed(Exception):
    """The store is shutting down and accepts no more writes."""


@dataclass
class _Job:
    kind: str  # "insert" | "flush"
    rows: list
    future: Future
    flush_train: bool = False
    flush_test: bool = False


def entries_to_rows(entries: Sequence[TrainingEntry], now: float | None = None) -> list[tuple]:
    """Validated entries to store rows (stratum computed here, receive time when no timestamp)."""
    if not entries:
        return []
    now = time.time() if now is None else now
    raw = np.array([e.raw for e in entries], dtype=np.float64)
    strata = sampling.strata(raw).tolist()
    return [(*e.raw, e.actual_ttft_ms, e.actual_tpot_ms, now if e.timestamp is None else e.timestamp,
             e.predicted_ttft_ms, e.predicted_tpot_ms, e.model_version, *engine_values(e), s)
            for e, s in zip(entries, strata)]


def connect(path: Path, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0, check_same_thread=False)
    else:
        conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
    return conn


class SampleStore:
    """The sample store. ``open()`` starts the writer; ``close()`` drains and stops it."""

    def __init__(self, path: Path, *, max_rows: int, queue_size: int, test_ratio: float) -> None:
        self.path, self.max_rows, self.queue_size, self.test_ratio = Path(path), max_rows, queue_size, test_ratio
        #: failure injection (tests only): called in the writer thread before each commit
        self.before_commit: Callable[[], None] | None = None
        #: called in the writer thread after each committed insert: (n_rows, seconds)
        self.on_commit: Callable[[int, float], None] | None = None
        self._cond = threading.Condition()
        self._jobs: list[_Job] = []
        self._pending = 0
        self._closing = False
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._strata: Counter = Counter()
        self._rows = self._last_id = 0
        self.inserted_total = self.evicted_total = self.commits_total = 0
        #: identity of the store (uuid4 hex, unix seconds), set by open()
        self.store_id = ""
        self.created_at = 0.0

    # ---- lifecycle -------------------------------------------------------------------
    def open(self) -> SampleStore:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = connect(self.path)
        conn.executescript(_SCHEMA)
        migrate(conn)   # the engine columns (training_server.engine_store), added to an older store
        # the store's identity (bundle lineage): created with the store, kept across restarts
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                             [("store_id", uuid.uuid4().hex), ("created_at", repr(time.time()))])
        meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('store_id', 'created_at')"))
        self.store_id, self.created_at = meta["store_id"], float(meta["created_at"])
        self._conn = conn
        self._recount()
        self._thread = threading.Thread(target=self._writer, name="sample-store-writer", daemon=True)
        self._thread.start()
        log.info("sample store %s: %d rows in %d strata (cap %d)", self.path, self._rows, len(self._strata),
                 self.max_rows)
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop accepting writes, commit everything queued, stop the writer."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._conn is not None:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
            self._conn.close()
            self._conn = None

    # ---- writes (any thread) ---------------------------------------------------------
    def submit(self, rows: list[tuple]) -> Future:
        """Queue rows for the next group commit; the future resolves after the commit.

        Raises Saturated when the queue holds ``queue_size`` entries already (a single
        batch larger than the whole queue is admitted only into an empty queue).
        """
        fut: Future = Future()
        if not rows:
            fut.set_result(0)
            return fut
        with self._cond:
            if self._closing or self._thread is None:
                raise StoreClosed("sample store is closed")
            if self._pending and self._pending + len(rows) > self.queue_size:
                raise Saturated(1)
            self._jobs.append(_Job("insert", rows, fut))
            self._pending += len(rows)
            self._cond.notify()
        return fut

    def flush(self, train: bool, test: bool) -> Future:
        """Delete the train and/or test side of the stored rows (through the writer)."""
        fut: Future = Future()
        with self._cond:
            if self._closing or self._thread is None:
                raise StoreClosed("sample store is closed")
            self._jobs.append(_Job("flush", [], fut, train, test))
            self._cond.notify()
        return fut

    # ---- state ------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return self._pending

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def last_id(self) -> int:
        return self._last_id

    def strata_counts(self) -> dict[int, int]:
        return {k: v for k, v in self._strata.items() if v}

    # ---- writer thread ----------------------------------------------------------------
    def _writer(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closing:
                    self._cond.wait()
                if not self._jobs and self._closing:
                    return
                batch, n = [], 0
                while self._jobs and (not batch or n + len(self._jobs[0].rows) <= MAX_ENTRIES_PER_COMMIT):
                    batch.append(self._jobs.pop(0))
                    n += len(batch[-1].rows)
                    if batch[-1].kind == "flush":
                        break
            self._run(batch)
            del batch  # the committed rows are not kept while the writer waits

    def _release(self, batch: list[_Job]) -> None:
        """Free the batch's queue slots (before its futures resolve, so an acknowledged
        client's next request sees the room)."""
        with self._cond:
            self._pending -= sum(len(j.rows) for j in batch)

    def _run(self, batch: list[_Job]) -> None:
        conn = self._conn
        assert conn is not None
        t0 = time.perf_counter()
        inserts = [j for j in batch if j.kind == "insert"]
        flushes = [j for j in batch if j.kind == "flush"]
        rows = [r for j in inserts for r in j.rows]
        try:
            if self.before_commit is not None:
                self.before_commit()
            conn.execute("BEGIN IMMEDIATE")
            added: Counter = Counter()
            evicted = 0
            if rows:
                conn.executemany(_INSERT, rows)
                added = Counter(r[-1] for r in rows)
                evicted = self._evict(conn, added, len(rows))
            for f in flushes:
                clauses = []
                if f.flush_train:
                    clauses.append(f"NOT ({sampling.test_sql(self.test_ratio)})")
                if f.flush_test:
                    clauses.append(sampling.test_sql(self.test_ratio))
                if clauses:
                    conn.execute(f"DELETE FROM samples WHERE {' OR '.join(clauses)}")
            conn.execute("COMMIT")
        except BaseException as e:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            log.error("sample store commit failed (%d rows): %s", len(rows), e)
            if flushes or rows:
                self._recount()
            self._release(batch)
            for j in batch:
                if not j.future.done():
                    j.future.set_exception(e if isinstance(e, Exception) else RuntimeError(str(e)))
            if not isinstance(e, Exception):
                raise
            return
        # committed: update in-memory mirrors, then acknowledge
        if rows:
            self._strata.update(added)
            self._rows += len(rows) - evicted
            self.inserted_total += len(rows)
            self.evicted_total += evicted
            self._last_id = int(conn.execute("SELECT MAX(id) FROM samples").fetchone()[0] or self._last_id)
        if flushes:
            self._recount()
        self.commits_total += 1
        dt = time.perf_counter() - t0
        if rows and self.on_commit is not None:
            try:
                self.on_commit(len(rows), dt)
            except Exception:  # metrics must never break ingestion
                log.exception("on_commit hook failed")
        self._release(batch)
        for j in inserts:
            j.future.set_result(len(j.rows))
        for j in flushes:
            j.future.set_result(self._rows)

    def _evict(self, conn: sqlite3.Connection, added: Counter, n_added: int) -> int:
        """Delete oldest rows of the largest strata so the table holds at most max_rows."""
        counts = Counter(self._strata)
        counts.update(added)
        total = self._rows + n_added
        excess = total - self.max_rows
        if excess <= 0:
            return 0
        remove = plan_eviction(counts, excess)
        for s, k in remove.items():
            conn.execute("DELETE FROM samples WHERE id IN "
                         "(SELECT id FROM samples WHERE stratum = ? ORDER BY id LIMIT ?)", (int(s), int(k)))
            counts[s] -= k
        # pre-subtract: the caller adds ``added`` to the mirror after the commit
        for s, k in remove.items():
            self._strata[s] -= k
        return sum(remove.values())

    def _recount(self) -> None:
        conn = self._conn
        assert conn is not None
        self._strata = Counter({int(s): int(c) for s, c in
                                conn.execute("SELECT stratum, COUNT(*) FROM samples GROUP BY stratum")})
        self._rows = sum(self._strata.values())
        row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'samples'").fetchone()
        self._last_id = int(row[0]) if row else 0

    # ---- reads (any thread; own connection) -------------------------------------------
    def read_training_set(self, max_per_bucket: int) -> sampling.TrainingSet:
        """The stratified train/test sets (see :mod:`training_server.sampling`)."""
        ratio = self.test_ratio
        test_cap = max(1, int(np.ceil(max_per_bucket * ratio / (1.0 - ratio))))
        te = sampling.test_sql(ratio)
        cols = ", ".join(("id", *RAW_COLUMNS, "actual_ttft_ms", "actual_tpot_ms", "ts", "stratum"))
        rank = ("CASE WHEN {c} > 0 THEN ROW_NUMBER() OVER (PARTITION BY stratum, te, {c} > 0 ORDER BY id DESC) END")
        sql = f"""
            SELECT {cols} FROM (
                SELECT *, {rank.format(c="actual_ttft_ms")} AS r_ttft, {rank.format(c="actual_tpot_ms")} AS r_tpot
                FROM (SELECT *, {te} AS te FROM samples))
            WHERE r_ttft <= CASE te WHEN 1 THEN :tc ELSE :c END
               OR r_tpot <= CASE te WHEN 1 THEN :tc ELSE :c END
            ORDER BY id"""
        conn = connect(self.path, readonly=True)
        try:
            data = conn.execute(sql, {"tc": test_cap, "c": max_per_bucket}).fetchall()
        finally:
            conn.close()
        a = np.array(data, dtype=np.float64).reshape(len(data), len(RAW_COLUMNS) + 5)
        k = len(RAW_COLUMNS)
        ids = a[:, 0].astype(np.int64)
        return sampling.select(ids, a[:, 1:1 + k], a[:, 1 + k], a[:, 2 + k], a[:, 3 + k],
                               a[:, 4 + k].astype(np.int64), max_per_bucket=max_per_bucket, test_ratio=ratio)

    def read_engine_rows(self, limit: int) -> EngineRows:
        """The newest ``limit`` rows with engine fields (:mod:`.engine_store`)."""
        return self._read(read_engine_rows, limit)

    def engine_rows_after(self, after_id: int) -> int:
        return self._read(engine_rows_after, after_id)

    def target_counts(self) -> dict[str, int]:
        t, p = self._read(lambda c: c.execute("SELECT SUM(actual_ttft_ms > 0), SUM(actual_tpot_ms > 0) "
                                              "FROM samples").fetchone())
        return {"ttft": int(t or 0), "tpot": int(p or 0)}

    def _read(self, fn: Callable, *args: object) -> Any:
        conn = connect(self.path, readonly=True)
        try:
            return fn(conn, *args)
        finally:
            conn.close()


def plan_eviction(counts: Counter | dict, excess: int) -> dict[int, int]:
    """How many rows to delete per stratum: level the largest strata down (water-filling).

    Returns {stratum: k} with sum(k) == excess, taking only from strata above a level L
    chosen as high as possible, so small strata keep all their rows.
    """
    items = {s: c for s, c in counts.items() if c > 0}
    if excess <= 0 or not items:
        return {}
    excess = min(excess, sum(items.values()))
    lo, hi = 0, max(items.values())

    def removed(level: int) -> int:
        return sum(c - level for c in items.values() if c > level)

    while lo < hi:  # largest level with removed(level) >= excess
        mid = (lo + hi + 1) // 2
        if removed(mid) >= excess:
            lo = mid
        else:
            hi = mid - 1
    plan = {s: c - lo for s, c in items.items() if c > lo}
    over = sum(plan.values()) - excess
    for s in sorted(plan, key=lambda s: -items[s])[:over]:
        plan[s] -= 1
    return {s: k for s, k in plan.items() if k > 0}
