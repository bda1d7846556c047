"""The sample store's engine columns (training_server.engine_store): a store created before them
opens, keeps its rows and gets them; entries with the engine fields are read back for the fit."""
from __future__ import annotations

import sqlite3

from features.schema import COL, RAW_COLUMNS, TrainingEntry, parse_training_entry
from training_server.store import SampleStore, entries_to_rows

ENGINE = {"engine_endpoint": "pod-a", "engine_class": "llama|a100", "engine_steps": 3, "engine_step_tokens": 900,
          "engine_step_context": 4000.0, "engine_decode_steps": 3, "engine_prefill_pairs": 1.2e5,
          "engine_ttft_ms": 95.5}


def store_entry(i: int, engine: dict | None, ttft_ms: float | None = None, tpot_ms: float = 0.0) -> TrainingEntry:
    raw = [0.0] * len(RAW_COLUMNS)
    raw[COL["input_token_length"]] = 100 + i
    return parse_training_entry({**{k: raw[COL[k]] for k in ("kv_cache_percentage", "input_token_length",
                                                             "num_request_waiting", "num_request_running",
                                                             "num_tokens_generated", "prefix_cache_score")},
                                 "actual_ttft_ms": 50.0 + i if ttft_ms is None else ttft_ms,
                                 "actual_tpot_ms": tpot_ms, **(engine or {})})


def test_a_store_from_before_the_engine_columns_opens_keeps_its_rows_and_stores_them(tmp_path):
    path = tmp_path / "samples.sqlite3"
    cols = ", ".join(f"{c} REAL NOT NULL" for c in RAW_COLUMNS)
    with sqlite3.connect(path) as c:   # the table as stores were created before the engine columns
        c.executescript(f"""CREATE TABLE samples (id INTEGER PRIMARY KEY AUTOINCREMENT, {cols},
            actual_ttft_ms REAL NOT NULL, actual_tpot_ms REAL NOT NULL, ts REAL NOT NULL,
            predicted_ttft_ms REAL NOT NULL DEFAULT 0, predicted_tpot_ms REAL NOT NULL DEFAULT 0,
            model_version TEXT NOT NULL DEFAULT '', stratum INTEGER NOT NULL);
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);""")
        c.execute(f"INSERT INTO samples ({', '.join(RAW_COLUMNS)}, actual_ttft_ms, actual_tpot_ms, ts, stratum) "
                  f"VALUES ({', '.join('0' for _ in RAW_COLUMNS)}, 42, 0, 1e9, 0)")
    store = SampleStore(path, max_rows=1000, queue_size=1000, test_ratio=0.1).open()
    try:
        assert store.rows == 1
        store.submit(entries_to_rows([store_entry(i, ENGINE if i % 2 else None) for i in range(6)])).result(10)
        rows = store.read_engine_rows(100)
        assert rows.endpoints == ["pod-a"] * 3 and rows.classes == ["llama|a100"] * 3
        assert rows.features.tolist() == [[3.0, 900.0, 4000.0, 3.0, 1.2e5]] * 3
        assert rows.ttft_ms.tolist() == [51.0, 53.0, 55.0] and list(rows.ids) == sorted(rows.ids)
        assert store.engine_rows_after(int(rows.ids[0])) == 2
        assert store.rows == 7
    finally:
        store.close()
    reopened = SampleStore(path, max_rows=1000, queue_size=1000, test_ratio=0.1).open()   # migrated once
    try:
        assert reopened.rows == 7 and len(reopened.read_engine_rows(2).ids) == 2
    finally:
        reopened.close()



def test_sums_sent_with_a_tpot_entry_are_fitted_against_the_ttft_sent_with_them(tmp_path):
    """The EPP sends the engine sums with the TPOT entry (at the request's end, with the prompt's
    true length) and the measured TTFT they go with: the engine rows read that TTFT; a TPOT entry
    with sums but no TTFT is no engine row; the latency targets stay the entry's own."""
    store = SampleStore(tmp_path / "s.sqlite3", max_rows=1000, queue_size=1000, test_ratio=0.1).open()
    try:
        entries = [store_entry(0, ENGINE),                                                 # a TTFT entry
                   store_entry(1, {**ENGINE, "engine_actual_ttft_ms": 700.0}, 0.0, 20.0),  # a TPOT entry
                   store_entry(2, ENGINE, 0.0, 21.0),                                      # no TTFT to fit
                   store_entry(3, None, 0.0, 22.0)]
        assert entries[1].engine.actual_ttft_ms == 700.0 and entries[1].actual_ttft_ms == 0.0
        store.submit(entries_to_rows(entries)).result(10)
        rows = store.read_engine_rows(100)
        assert rows.ttft_ms.tolist() == [50.0, 700.0]
        assert store.rows == 4
    finally:
        store.close()
