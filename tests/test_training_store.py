"""Sample store on real SQLite files: group commit, back-pressure, bound with stratified
eviction, flush, and the stratified, deterministic train/test selection."""
import sqlite3
import threading
from collections import Counter

import numpy as np
import pytest

from features.schema import COL, RAW_COLUMNS, TrainingEntry
from training_server import sampling
from training_server.store import SampleStore, Saturated, entries_to_rows, plan_eviction


def entry(waiting=0, kv=0.1, ttft=100.0, tpot=0.0, prefix=0.0):
    raw = [0.0] * len(RAW_COLUMNS)
    raw[COL["num_request_waiting"]] = waiting
    raw[COL["kv_cache_percentage"]] = kv
    raw[COL["prefix_cache_score"]] = prefix
    raw[COL["input_token_length"]] = 100
    return TrainingEntry(tuple(raw), ttft, tpot, None)


@pytest.fixture
def store_factory(tmp_path):
    opened = []

    def make(**kw):
        args = {"max_rows": 1000, "queue_size": 10_000, "test_ratio": 0.1, **kw}
        s = SampleStore(tmp_path / "samples.sqlite3", **args).open()
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


def db_rows(store):
    with sqlite3.connect(store.path) as c:
        return c.execute("SELECT id, stratum, actual_ttft_ms FROM samples ORDER BY id").fetchall()


def test_group_commit_acknowledges_after_commit(store_factory):
    store = store_factory()
    gate = threading.Event()
    store.before_commit = gate.wait  # failure injection: hold the writer
    futures = [store.submit(entries_to_rows([entry(ttft=float(i + 1))])) for i in range(50)]
    assert not any(f.done() for f in futures)  # nothing is acknowledged before its commit
    assert store.queue_depth >= 49
    gate.set()
    assert [f.result(10) for f in futures] == [1] * 50
    assert len(db_rows(store)) == 50
    # 50 requests, but the writer grouped those waiting into few transactions
    assert store.commits_total <= 3


def test_full_queue_is_saturated_not_unbounded(store_factory):
    store = store_factory(queue_size=10)
    gate = threading.Event()
    store.before_commit = gate.wait
    first = store.submit(entries_to_rows([entry()] * 6))  # in flight, writer blocked
    second = store.submit(entries_to_rows([entry()] * 4))  # 6 + 4 = 10 entries: still fits
    with pytest.raises(Saturated):
        store.submit(entries_to_rows([entry()]))
    assert store.queue_depth == 10
    gate.set()
    assert first.result(10) == 6 and second.result(10) == 4
    assert store.rows == 10 and store.queue_depth == 0
    store.submit(entries_to_rows([entry()] * 25)).result(10)  # an oversized batch fits an empty queue


def test_plan_eviction_levels_the_largest_strata():
    assert plan_eviction({1: 100, 2: 10, 3: 50}, 60) == {1: 55, 3: 5}
    assert sum(plan_eviction({1: 7, 2: 7, 3: 7}, 4).values()) == 4
    assert plan_eviction({1: 5}, 0) == {}


def test_bound_evicts_oldest_rows_of_the_largest_stratum(store_factory):
    store = store_factory(max_rows=200)
    rare = [entry(waiting=10, kv=0.95, ttft=5000.0 + i) for i in range(20)]
    store.submit(entries_to_rows(rare)).result(10)
    for batch in range(5):  # 500 common rows arrive in batches
        common = [entry(waiting=0, kv=0.1, ttft=float(batch * 100 + i + 1)) for i in range(100)]
        store.submit(entries_to_rows(common)).result(10)
        assert len(db_rows(store)) <= 200  # never over the cap on disk
    rows = db_rows(store)
    assert len(rows) == 200 == store.rows
    per = Counter(s for _, s, _ in rows)
    rare_stratum = int(sampling.strata(np.array([rare[0].raw]))[0])
    assert per[rare_stratum] == 20  # the rare regime survived untouched
    common_ttft = sorted(t for _, s, t in rows if s != rare_stratum)
    assert common_ttft == [float(x) for x in range(321, 501)]  # the newest 180 of the common stratum
    assert store.evicted_total == 320
    # counts survive a restart (recomputed from the file)
    store.close()
    again = store_factory(max_rows=200)
    assert again.rows == 200 and again.strata_counts() == dict(per)


def test_flush_train_and_test_sides(store_factory):
    store = store_factory(test_ratio=0.2)
    store.submit(entries_to_rows([entry(ttft=float(i + 1)) for i in range(500)])).result(10)
    ids = np.array([r[0] for r in db_rows(store)])
    n_test = int(sampling.is_test(ids, 0.2).sum())
    assert 50 < n_test < 150
    assert store.flush(train=True, test=False).result(10) == n_test
    remaining = np.array([r[0] for r in db_rows(store)])
    assert sampling.is_test(remaining, 0.2).all() and store.rows == n_test
    assert store.flush(train=False, test=True).result(10) == 0


def test_training_set_is_stratified_newest_first_and_split_is_stable(store_factory):
    store = store_factory(max_rows=100_000, test_ratio=0.1)
    # stratum A: 3000 TTFT rows, stratum B (queued, high KV): 40 rows with both targets
    a = [entry(waiting=0, kv=0.05, ttft=float(i + 1)) for i in range(3000)]
    b = [entry(waiting=6, kv=0.9, ttft=1000.0 + i, tpot=20.0) for i in range(40)]
    store.submit(entries_to_rows(a + b)).result(10)
    ts = store.read_training_set(max_per_bucket=500)
    assert ts.max_id == 3040
    train_strata = Counter(sampling.strata(ts.train.raw).tolist())
    sa = int(sampling.strata(np.array([a[0].raw]))[0])
    sb = int(sampling.strata(np.array([b[0].raw]))[0])
    assert train_strata[sa] == 500  # capped per bucket
    assert train_strata[sb] == int((~sampling.is_test(np.arange(3001, 3041), 0.1)).sum())  # all of the rare one
    # newest preferred: the train rows of A are the latest non-test ones
    a_ids = ts.train.ids[sampling.strata(ts.train.raw) == sa]
    non_test = np.arange(1, 3001)[~sampling.is_test(np.arange(1, 3001), 0.1)]
    assert sorted(a_ids.tolist()) == sorted(non_test[-500:].tolist())
    assert ts.train.counts()["tpot"] == train_strata[sb]
    assert not set(ts.train.ids) & set(ts.test.ids)
    assert sampling.is_test(ts.test.ids, 0.1).all() and 0 < len(ts.test) <= 56 + 40
    # more data later: no row ever changes side
    store.submit(entries_to_rows([entry(ttft=7.0)] * 300)).result(10)
    ts2 = store.read_training_set(max_per_bucket=500)
    assert not set(ts2.train.ids) & set(ts.test.ids)
    assert not set(ts2.test.ids) & set(ts.train.ids)
