"""The router's queue fields of a row (``features.schema.QUEUE_FIELDS``): validated and
optional (absent = unknown, never 0), filled by the producer from what it dispatched, used by
a model trained on them, left out of one trained on rows without them; schema-1 bundles and
stores keep working."""
from __future__ import annotations

import json
import math
import sqlite3

import numpy as np
import pytest

from epp_client import Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.plugins import PredictedLatencyProducer
from epp_client.training import ListSink
from features.bundle import BundleError, read_bundle, validate_manifest, write_bundle
from features.loaded import LoadedBundle
from features.matrix import FEATURES, FEATURES_V1, QUEUE_FEATURES
from features.schema import COL, QUEUE_FIELDS, RAW_COLUMNS, RAW_COLUMNS_V1, FieldError, parse_row, row_from_raw
from features.scoring import pinball_loss
from prediction_server.service import PredictionService
from support.prediction import ROW, settings_for
from training_server import trainer
from training_server.store import SampleStore, entries_to_rows
from training_server.trainer import TrainConfig, train_models

QUEUE = {"prefill_requests_in_flight": 3, "queue_head_wait_ms": 12.5, "decode_context_tokens": 40_000}


def test_the_fields_are_optional_unknown_when_absent_and_bad_values_name_the_field():
    raw = parse_row({**ROW, **QUEUE})
    assert [raw[COL[n]] for n in QUEUE_FIELDS] == [3.0, 12.5, 40_000.0]
    for row in (ROW, {**ROW, **dict.fromkeys(QUEUE_FIELDS)}):          # absent or null: unknown, not 0
        assert all(math.isnan(parse_row(row)[COL[n]]) for n in QUEUE_FIELDS)
    assert set(row_from_raw(parse_row(ROW))) == set(RAW_COLUMNS) - set(QUEUE_FIELDS)   # unknown: not sent
    for name, bad in (("prefill_requests_in_flight", -1), ("prefill_requests_in_flight", 1.5),
                      ("queue_head_wait_ms", "soon"), ("decode_context_tokens", True)):
        with pytest.raises(FieldError) as e:
            parse_row({**ROW, name: bad}, ("requests", 0))
        assert e.value.loc == ("requests", 0, name)
    svc = PredictionService(settings_for(None))
    status, body = svc.predict_strict(json.dumps({"requests": [ROW, {**ROW, "queue_head_wait_ms": -3}]}).encode())
    assert status == 422 and json.loads(body)["detail"][0]["loc"] == ["body", "requests", 1, "queue_head_wait_ms"]
    status, body = svc.predict_strict(json.dumps({"requests": [ROW, {**ROW, **QUEUE}]}).encode())
    assert status == 200 and all(p["ttft_ms"] > 0 for p in json.loads(body)["predictions"])


def _endpoint(name):
    return Endpoint(name=name, metrics=EndpointMetrics(0.3, 0, 2), prefix_match=PrefixMatch(0, 4))


def test_the_producer_fills_them_from_what_it_dispatched():
    """Endpoint a: r1 (600-token prompt) dispatched at t=0, r2 at t=1, r3 at t=1.5; r1's first
    token at t=2 and 4 more tokens by t=3. At t=3.5 a has r1 decoding (605 tokens of context),
    r2 at the head of the queue since r1's first token (1.5 s) and r3 behind it; b has nothing.
    Each entry carries the row of the endpoint that served it, as it was at scheduling time."""
    sink = ListSink()
    prod = PredictedLatencyProducer(None, sink, streaming_mode=True, predict_in_produce=False)
    a, b = _endpoint("a"), _endpoint("b")

    def dispatch(rid, tokens, endpoint, now):
        req = InferenceRequest(request_id=rid, input_tokens=tokens, streaming=True)
        prod.produce(req, [a, b], now=now)
        prod.pre_request(req, endpoint, now=now)

    def fields(rid, now):   # the TTFT entry of ``rid``, emitted at its first chunk
        prod.on_first_chunk(rid, now=now, tokens=1)
        return tuple(sink.entries[-1][n] for n in QUEUE_FIELDS)

    dispatch("r1", 600, a, 0.0)
    dispatch("r2", 800, a, 1.0)
    dispatch("r3", 900, a, 1.5)
    assert fields("r1", 2.0) == (0, 0.0, 0)          # a was empty at t=0
    prod.on_chunk("r1", now=3.0, tokens=4)
    dispatch("r4", 100, a, 3.5)
    dispatch("r5", 100, b, 3.5)
    assert fields("r4", 4.0) == (2, 1500.0, 605)
    assert fields("r5", 4.5) == (0, 0.0, 0)          # known to be empty: 0, not unknown
    assert fields("r2", 5.0) == (1, 1000.0, 0)       # at t=1: r1 waiting at the head for 1 s
    # end-to-end mode never sees a first token: the fields are not sent (unknown)
    e2e = ListSink()
    prod = PredictedLatencyProducer(None, e2e, streaming_mode=False, predict_in_produce=False)
    req = InferenceRequest(request_id="q", input_tokens=10)
    prod.produce(req, [a], now=0.0)
    prod.pre_request(req, a, now=0.0)
    prod.on_complete("q", now=1.0)
    assert e2e.entries and not set(QUEUE_FIELDS) & set(e2e.entries[0])


def _queue_data(n, seed=4):
    """TTFT set by the queue ahead as only the queue fields tell it: a head that has waited
    longer is nearer its end; requests behind it each cost 120 ms."""
    rng = np.random.default_rng(seed)
    raw = np.zeros((n, len(RAW_COLUMNS)))
    raw[:, COL["kv_cache_percentage"]] = rng.uniform(0.1, 0.6, n)
    raw[:, COL["input_token_length"]] = rng.integers(200, 1200, n)
    raw[:, COL["num_request_running"]] = rng.integers(0, 10, n)
    waiting = rng.integers(0, 6, n)
    head = rng.uniform(0, 300, n) * (waiting > 0)
    raw[:, COL["prefill_requests_in_flight"]] = waiting
    raw[:, COL["queue_head_wait_ms"]] = head
    raw[:, COL["decode_context_tokens"]] = rng.integers(0, 50_000, n)
    ttft = 30 + 0.05 * raw[:, COL["input_token_length"]] + 120 * waiting + np.maximum(0, 300 - head) * (waiting > 0) \
        + rng.exponential(5, n)
    tpot = 10 + 0.0002 * raw[:, COL["decode_context_tokens"]] + rng.exponential(1, n)
    return raw, ttft, tpot


def _unknown(raw):
    out = raw.copy()
    out[:, [COL[n] for n in QUEUE_FIELDS]] = np.nan
    return out


def test_a_model_trained_with_them_uses_them_and_one_trained_without_has_no_column_for_them():
    raw, ttft, tpot = _queue_data(1000)
    train, test = slice(0, 800), slice(800, None)
    cfg = TrainConfig(params={"n_estimators": 40})
    mixed = raw[train].copy()
    mixed[::20] = _unknown(mixed[::20])                    # 5% of the rows from a router that sends none
    with_fields = trainer.loaded_bundle(train_models(mixed, ttft[train], tpot[train], config=cfg))
    without = trainer.loaded_bundle(train_models(_unknown(raw[train]), ttft[train], tpot[train], config=cfg))
    assert without.manifest.feature_names("ttft") == FEATURES_V1["ttft"]
    assert with_fields.manifest.feature_names("ttft") == FEATURES["ttft"]
    half = raw[train].copy()
    half[::2] = _unknown(half[::2])                        # too few rows carry them: left out
    assert train_models(half, ttft[train], tpot[train], config=cfg).feature_names["ttft"] == FEATURES_V1["ttft"]
    q = 0.9
    loss_with = pinball_loss(ttft[test], with_fields.predict(raw[test])[0], q)
    loss_without = pinball_loss(ttft[test], without.predict(raw[test])[0], q)
    assert loss_with < 0.5 * loss_without                  # 13.8 vs 34.4 ms
    assert pinball_loss(tpot[test], with_fields.predict(raw[test])[1], q) < \
        0.7 * pinball_loss(tpot[test], without.predict(raw[test])[1], q)   # 0.29 vs 0.52 ms
    # rows without the fields are still answered by the model trained on the mix
    blind = with_fields.predict(_unknown(raw[test]))
    assert all(np.isfinite(y).all() and (y > 0).all() for y in blind)


def test_a_model_without_queue_columns_is_a_schema_1_bundle_and_schema_1_bundles_load(tmp_path):
    """Rows from a router that sends no queue field train a bundle exactly as schema 1 wrote it
    (servers of either schema serve it); it answers rows with or without the fields alike. A
    model with queue columns is schema 2."""
    raw, ttft, tpot = _queue_data(600)
    cfg = TrainConfig(params={"n_estimators": 20})
    manifest, files = trainer.build_bundle(train_models(_unknown(raw), ttft, tpot, config=cfg),
                                           "v000001-20261201T000000Z")
    old = manifest.to_json()
    assert old["schema_version"] == 1 and old["features"]["raw_columns"] == list(RAW_COLUMNS_V1)
    assert old["features"]["features"] == {t: list(FEATURES_V1[t]) for t in FEATURES_V1}
    loaded = LoadedBundle.from_files(*read_bundle(write_bundle(tmp_path, old, files)))
    for a, b in zip(loaded.predict(raw[:50]), loaded.predict(_unknown(raw[:50]))):
        np.testing.assert_array_equal(a, b)
        assert (a > 0).all()
    without_names = dict(old, version="v000002-20261201T000000Z", features=None)   # schema 1's own columns
    assert LoadedBundle.from_files(*read_bundle(write_bundle(tmp_path, without_names, files))).manifest \
        .feature_names("ttft") == FEATURES_V1["ttft"]
    with pytest.raises(BundleError, match="raw_columns"):   # schema 1 naming today's columns: inconsistent
        validate_manifest(dict(old, features={**old["features"], "raw_columns": list(RAW_COLUMNS)}))
    new, _ = trainer.build_bundle(train_models(raw, ttft, tpot, config=cfg), "v000003-20261201T000000Z")
    assert new.schema_version == 2 and set(QUEUE_FEATURES["ttft"]) <= set(new.feature_names("ttft") or ())


def test_a_schema_1_store_gains_the_columns_and_its_rows_read_back_unknown(tmp_path):
    path = tmp_path / "samples.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(f"""
        CREATE TABLE samples (id INTEGER PRIMARY KEY AUTOINCREMENT,
            {", ".join(f"{c} REAL NOT NULL" for c in RAW_COLUMNS_V1)},
            actual_ttft_ms REAL NOT NULL, actual_tpot_ms REAL NOT NULL, ts REAL NOT NULL,
            predicted_ttft_ms REAL NOT NULL DEFAULT 0, predicted_tpot_ms REAL NOT NULL DEFAULT 0,
            model_version TEXT NOT NULL DEFAULT '', stratum INTEGER NOT NULL);""")
    conn.execute(f"INSERT INTO samples ({', '.join(RAW_COLUMNS_V1)}, actual_ttft_ms, actual_tpot_ms, ts, stratum) "
                 f"VALUES ({', '.join('?' * (len(RAW_COLUMNS_V1) + 4))})",
                 (0.5, 100, 0, 1, 0, 0, 0, 0, 0, 0, 0, 80.0, 0.0, 1.0, 0))
    conn.commit()
    conn.close()
    from features.schema import parse_training_entry

    store = SampleStore(path, max_rows=100, queue_size=100, test_ratio=0.1).open()
    try:
        entry = parse_training_entry({**ROW, **QUEUE, "actual_ttft_ms": 90.0, "actual_tpot_ms": 0.0})
        store.submit(entries_to_rows([entry], now=2.0)).result(timeout=10)
        ts = store.read_training_set(max_per_bucket=100)
        raw = np.concatenate([ts.train.raw, ts.test.raw])
        cols = [COL[n] for n in QUEUE_FIELDS]
        known = ~np.isnan(raw[:, cols]).any(axis=1)
        assert len(raw) == 2 and known.sum() == 1 and np.isnan(raw[~known][:, cols]).all()
        assert raw[known][0, cols].tolist() == [3.0, 12.5, 40_000.0]
    finally:
        store.close()
