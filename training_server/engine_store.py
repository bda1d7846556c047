"""The engine fields of stored samples: columns of the sample store's ``samples`` table.

A training entry with the engine fields (``features.schema.EngineObservation``) stores the
endpoint, its class, the five step sums, the twin's TTFT and the measured TTFT they go with
(when the entry is not the TTFT sample itself) beside its features; one without stores ``''``
and zeros. The columns are added to a store created before they existed
(:func:`migrate`, at open: ``ALTER TABLE ... ADD COLUMN``, additive, so an old data directory
opens and keeps its rows), with a partial index over the rows that have them. The engine fit
reads the newest of those rows (:func:`read_engine_rows`).
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import numpy as np

from features.schema import ENGINE_FEATURE_FIELDS, TrainingEntry

#: the stored engine columns, in row order (before the stratum, the row's last column)
ENGINE_COLUMNS: tuple[str, ...] = ("engine_endpoint", "engine_class", *(f.name for f in ENGINE_FEATURE_FIELDS),
                                   "engine_ttft_ms", "engine_actual_ttft_ms")
_DECLS = {"engine_endpoint": "TEXT NOT NULL DEFAULT ''", "engine_class": "TEXT NOT NULL DEFAULT ''"}
_NO_ENGINE = ("", "", 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
#: the measured TTFT of an engine row: the sample's own (a TTFT entry) or the one sent with the sums
_MEASURED = "(CASE WHEN actual_ttft_ms > 0 THEN actual_ttft_ms ELSE engine_actual_ttft_ms END)"


def engine_values(e: TrainingEntry) -> tuple:
    """The engine columns of a stored entry (``''`` and zeros without the engine fields)."""
    o = e.engine
    if o is None:
        return _NO_ENGINE
    return (o.endpoint, o.engine_class, *o.features, o.twin_ttft_ms, o.actual_ttft_ms)


def migrate(conn: sqlite3.Connection) -> None:
    """Add the engine columns a store lacks, and their index (idempotent)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(samples)")}
    for name in ENGINE_COLUMNS:
        if name not in have:
            conn.execute(f"ALTER TABLE samples ADD COLUMN {name} {_DECLS.get(name, 'REAL NOT NULL DEFAULT 0')}")
    conn.execute("CREATE INDEX IF NOT EXISTS samples_engine ON samples (id) WHERE engine_endpoint != ''")


@dataclass
class EngineRows:
    """Stored engine rows, oldest first: ids, endpoints, classes, step sums (n x 5), TTFT ms."""

    ids: np.ndarray
    endpoints: list[str]
    classes: list[str]
    features: np.ndarray
    ttft_ms: np.ndarray


def read_engine_rows(conn: sqlite3.Connection, limit: int) -> EngineRows:
    """The newest ``limit`` stored rows with engine fields and a measured TTFT (the sample's, or
    the one sent with the sums), oldest first."""
    sums = ", ".join(f.name for f in ENGINE_FEATURE_FIELDS)
    data = conn.execute(f"SELECT id, engine_endpoint, engine_class, {sums}, {_MEASURED} FROM samples "
                        f"WHERE engine_endpoint != '' AND {_MEASURED} > 0 ORDER BY id DESC LIMIT ?",
                        (int(limit),)).fetchall()
    data.reverse()
    k = len(ENGINE_FEATURE_FIELDS)
    num = np.array([(r[0], *r[3:]) for r in data], dtype=np.float64).reshape(len(data), k + 2)
    return EngineRows(num[:, 0].astype(np.int64), [r[1] for r in data], [r[2] for r in data], num[:, 1:1 + k],
                      num[:, 1 + k])


def engine_rows_after(conn: sqlite3.Connection, after_id: int) -> int:
    """How many stored rows with engine fields have an id above ``after_id``."""
    return int(conn.execute("SELECT COUNT(*) FROM samples WHERE engine_endpoint != '' AND id > ?",
                            (int(after_id),)).fetchone()[0])
