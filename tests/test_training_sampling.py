"""Strata and the stratified, bounded training set: queue x KV x prefix buckets, a held-out
share fixed by the row id (the same in Python and in SQLite), the newest rows per stratum."""
from __future__ import annotations

import sqlite3

import numpy as np

from features.schema import COL
from training_server import sampling


def _raw(waiting, kv, prefix):
    raw = np.zeros((len(waiting), len(COL)))
    raw[:, COL["num_request_waiting"]] = waiting
    raw[:, COL["kv_cache_percentage"]] = kv
    raw[:, COL["prefix_cache_score"]] = prefix
    return raw


def test_strata_bucket_queue_kv_and_prefix_and_clip_the_extremes():
    s = sampling.strata(_raw([0, 3, 9, 0], [0.0, 0.55, 1.0, 0.999], [0.0, 0.3, 1.0, 0.25]))
    assert s.tolist() == [0, (3 * 10 + 5) * 4 + 1, (4 * 10 + 9) * 4 + 3, 9 * 4 + 1]
    assert s.max() == sampling.N_STRATA - 1


def test_the_held_out_share_is_a_function_of_the_id_and_sqlite_agrees():
    ids = np.arange(1, 20_001)
    test = sampling.is_test(ids, 0.1)
    assert abs(test.mean() - 0.1) < 0.01
    assert (sampling.is_test(ids[::-1], 0.1) == test[::-1]).all()
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)")
    db.executemany("INSERT INTO t VALUES (?)", ((int(i),) for i in ids))
    in_sql = [r[0] for r in db.execute(f"SELECT id FROM t WHERE {sampling.test_sql(0.1)} ORDER BY id")]
    assert in_sql == ids[test].tolist()


def test_select_keeps_the_newest_rows_per_stratum_and_target_on_each_side():
    n = 400
    ids = np.arange(1, n + 1)
    stratum = np.where(ids % 4 == 0, 7, 3)               # a rare stratum (7) and a common one (3)
    ttft = np.where(ids % 2 == 0, 100.0, 0.0)             # TTFT rows: even ids
    tpot = np.full(n, 10.0)
    ts = sampling.select(ids, np.zeros((n, len(COL))), ttft, tpot, ids.astype(float), stratum,
                         max_per_bucket=20, test_ratio=0.2)
    train = ts.train
    assert not sampling.is_test(train.ids, 0.2).any() and sampling.is_test(ts.test.ids, 0.2).all()
    assert ts.max_id == n
    for s in (3, 7):
        for target in ("ttft", "tpot"):
            y = train.target(target)
            chosen = train.ids[(stratum[train.ids - 1] == s) & (y > 0)]
            eligible = ids[(stratum == s) & ((ttft if target == "ttft" else tpot) > 0)
                           & ~sampling.is_test(ids, 0.2)]
            assert sorted(chosen.tolist()) == sorted(eligible[-20:].tolist())   # the 20 newest
    assert train.counts() == {"ttft": 40, "tpot": 40} and len(ts.test) <= 2 * 2 * 5
