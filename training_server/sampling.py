"""Strata and the stratified, bounded training set.

Rows are bucketed like upstream: queue-depth bucket x KV-use bucket x prefix-score bucket.
The store caps rows per stratum by evicting from the largest strata first, and the training
set takes at most ``max_per_bucket`` of the newest rows per stratum per target, so rare
regimes (long queues, full KV caches) are not crowded out by the common ones.

The held-out test share is a pure function of the row id (a multiplicative hash), so a row
never moves between train and test, across cycles and restarts alike. The same formula is
usable inside SQLite (:data:`TEST_SQL`) for flushing one side.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from features.schema import COL

#: queue depth bucket: min(waiting, 4) -> 0..4
QUEUE_BUCKETS = 5
#: KV use bucket: floor(kv * 10), clipped -> 0..9
KV_BUCKETS = 10
#: prefix-score bucket: quartile -> 0..3
PREFIX_BUCKETS = 4
N_STRATA = QUEUE_BUCKETS * KV_BUCKETS * PREFIX_BUCKETS

_HASH_MUL = 2654435761  # Knuth's multiplicative hash constant
_HASH_MOD = 1 << 32


def strata(raw: np.ndarray) -> np.ndarray:
    """Stratum id (0 .. N_STRATA-1) of each raw row."""
    raw = np.asarray(raw, dtype=np.float64).reshape(-1, len(COL))
    q = np.minimum(raw[:, COL["num_request_waiting"]], QUEUE_BUCKETS - 1).astype(np.int64)
    kv = np.clip(np.floor(raw[:, COL["kv_cache_percentage"]] * KV_BUCKETS), 0, KV_BUCKETS - 1).astype(np.int64)
    p = np.clip(np.floor(raw[:, COL["prefix_cache_score"]] * PREFIX_BUCKETS), 0, PREFIX_BUCKETS - 1).astype(np.int64)
    return (q * KV_BUCKETS + kv) * PREFIX_BUCKETS + p


def test_threshold(ratio: float) -> int:
    return int(round(ratio * _HASH_MOD))


def is_test(ids: np.ndarray, ratio: float) -> np.ndarray:
    """True for rows held out for testing; deterministic in the row id."""
    ids = np.asarray(ids, dtype=np.int64)
    return ((ids * _HASH_MUL) % _HASH_MOD) < test_threshold(ratio)


def test_sql(ratio: float) -> str:
    """SQLite boolean expression equal to :func:`is_test` on column ``id``."""
    return f"((id * {_HASH_MUL}) % {_HASH_MOD}) < {test_threshold(ratio)}"


@dataclass
class Split:
    """Rows of one side (train or test): zeros in a target mean "absent" (not selected)."""

    ids: np.ndarray
    raw: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    ts: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def target(self, name: str) -> np.ndarray:
        return self.ttft if name == "ttft" else self.tpot

    def counts(self) -> dict[str, int]:
        return {"ttft": int((self.ttft > 0).sum()), "tpot": int((self.tpot > 0).sum())}


@dataclass
class TrainingSet:
    train: Split
    test: Split
    max_id: int


def select(ids: np.ndarray, raw: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, ts: np.ndarray,
           stratum: np.ndarray, *, max_per_bucket: int, test_ratio: float) -> TrainingSet:
    """Build the stratified train/test sets from candidate rows.

    Per target and stratum the newest rows (highest id) are kept: at most
    ``max_per_bucket`` train rows and proportionally many test rows. A row selected for one
    target only carries a zero (absent) for the other.
    """
    ids = np.asarray(ids, dtype=np.int64)
    test = is_test(ids, test_ratio)
    test_cap = max(1, int(np.ceil(max_per_bucket * test_ratio / (1.0 - test_ratio))))
    keep_t = {}
    order = np.lexsort((-ids, stratum))  # by stratum, newest first within it
    s_sorted = stratum[order]
    starts = np.r_[0, np.flatnonzero(np.diff(s_sorted)) + 1] if len(order) else np.array([], dtype=np.int64)
    # rank of each row within its stratum for a given mask, computed per (target, side)
    for name, y in (("ttft", ttft), ("tpot", tpot)):
        keep = np.zeros(len(ids), dtype=bool)
        for side_mask, cap in ((~test, max_per_bucket), (test, test_cap)):
            m = (y > 0) & side_mask
            mo = m[order]
            # running count of selected rows within each stratum segment
            c = np.cumsum(mo)
            seg_base = np.zeros(len(order), dtype=np.int64)
            if len(order):
                base = np.r_[0, c[starts[1:] - 1]] if len(starts) > 1 else np.array([0])
                seg_len = np.diff(np.r_[starts, len(order)])
                seg_base = np.repeat(base, seg_len)
            rank = c - seg_base  # 1-based among selected in this stratum
            chosen = mo & (rank <= cap)
            keep[order[chosen]] = True
        keep_t[name] = keep
    any_keep = keep_t["ttft"] | keep_t["tpot"]

    def side(mask: np.ndarray) -> Split:
        sel = any_keep & mask
        return Split(ids[sel], raw[sel], np.where(keep_t["ttft"][sel], ttft[sel], 0.0),
                     np.where(keep_t["tpot"][sel], tpot[sel], 0.0), ts[sel])

    return TrainingSet(train=side(~test), test=side(test), max_id=int(ids.max()) if len(ids) else 0)
