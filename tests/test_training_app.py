"""Training-server HTTP API on a real loopback server: per-entry validation, 422/413/429/401,
flush, /predict with the prior, OpenAPI schema."""
import json
import threading
import time

import httpx
import numpy as np
import pytest

from load.data import load_entries
from support.servers import run_app
from training_server.app import create_app
from training_server.settings import Settings

GOOD = load_entries()[:20]
TOKEN = "test-token-123"


@pytest.fixture
def server(tmp_path):
    settings = Settings.from_env({}, data_dir=str(tmp_path), max_body_bytes=4096, ingest_queue_size=5,
                                 api_token=TOKEN, retraining_interval_sec=60)
    app = create_app(settings)
    # every body here is declared JSON (anything else is 415: test_training_write_safety.py)
    with run_app(app) as url, httpx.Client(base_url=url, timeout=20, headers={
            "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}) as c:
        yield c, app.state.service


def test_mixed_batch_keeps_valid_entries_and_names_fields(server):
    c, svc = server
    bad_kv = {**GOOD[0], "kv_cache_percentage": 1.5}
    missing = {k: v for k, v in GOOD[1].items() if k != "input_token_length"}
    huge = {**GOOD[2], "actual_ttft_ms": 1e12}  # over one day: a client bug, not data
    wrong_type = {**GOOD[3], "num_request_waiting": "3"}
    body = {"entries": [GOOD[4], bad_kv, GOOD[5], missing, huge, wrong_type, "nope", {**GOOD[6], "extra": 1}]}
    r = c.post("/add_training_data_bulk", json=body)
    assert r.status_code == 202, r.text
    j = r.json()
    assert (j["accepted"], j["rejected"]) == (3, 5)
    errs = {e["index"]: e for e in j["errors"]}
    assert errs[1]["loc"] == ["body", "entries", 1, "kv_cache_percentage"]
    assert errs[3]["loc"][-1] == "input_token_length" and "required" in errs[3]["msg"]
    assert errs[4]["loc"][-1] == "actual_ttft_ms"
    assert errs[5]["loc"][-1] == "num_request_waiting"
    assert errs[6]["loc"] == ["body", "entries", 6]
    assert svc.store.rows == 3  # committed before the 202
    assert c.post("/add_training_data_bulk", json={"entries": []}).json()["accepted"] == 0
    # Infinity (1e400 overflows a double) never reaches the store: the JSON parser refuses it
    r = c.post("/add_training_data_bulk", content=json.dumps({"entries": [GOOD[7], "__INF__"]}).replace(
        '"__INF__"', '{"actual_ttft_ms": 1e400}'))
    assert r.status_code == 422 and svc.store.rows == 3
    # nothing valid at all: 422 naming the fields (first 10)
    r = c.post("/add_training_data_bulk", json={"entries": [{"x": i} for i in range(30)]})
    assert r.status_code == 422 and len(r.json()["detail"]) == 10
    assert r.json()["detail"][3]["loc"] == ["body", "entries", 3, "kv_cache_percentage"]
    m = c.get("/metrics").text
    assert "latency_training_entries_accepted_total 3.0" in m
    assert 'latency_training_entries_rejected_total{reason="range_error"}' in m


@pytest.mark.parametrize("content,field", [
    (b"not json", ["body"]), (b"[1, 2]", ["body"]), (b'{"entrys": []}', ["body", "entries"]),
    (b'{"entries": {"a": 1}}', ["body", "entries"]), (b"", ["body"]),
])
def test_malformed_bodies_are_422_naming_the_field(server, content, field):
    c, _ = server
    r = c.post("/add_training_data_bulk", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == field


def test_oversized_bodies_are_413(server):
    c, svc = server
    big = b'{"entries": [' + b" " * 5000 + b"]}"
    assert c.post("/add_training_data_bulk", content=big).status_code == 413  # by Content-Length

    def chunks():  # no Content-Length: counted while streaming
        yield b'{"entries": ['
        for _ in range(10):
            yield b" " * 1000
        yield b"]}"

    assert c.post("/add_training_data_bulk", content=chunks()).status_code == 413
    assert svc.store.rows == 0


def test_saturated_queue_is_429_with_retry_after(server):
    c, svc = server
    gate = threading.Event()
    svc.store.before_commit = gate.wait  # failure injection: a stalled disk
    first: dict = {}
    t = threading.Thread(target=lambda: first.setdefault("r", c.post("/add_training_data_bulk",
                                                                      json={"entries": GOOD[:4]})))
    t.start()
    deadline = time.monotonic() + 10
    while svc.store.queue_depth < 4:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    r = c.post("/add_training_data_bulk", json={"entries": GOOD[4:6]})  # 4 + 2 > 5
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert not t.is_alive() or "r" not in first  # the first request is not acknowledged yet
    gate.set()
    t.join(10)
    assert first["r"].status_code == 202 and svc.store.rows == 4


def test_token_required_on_write_endpoints(server):
    c, svc = server
    body = {"entries": GOOD[:2]}
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong-token"}, {"Authorization": TOKEN}):
        r = c.post("/add_training_data_bulk", json=body, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.post("/flush", json={"flush_training_data": True}, headers=headers).status_code == 401
    assert svc.store.rows == 0
    assert c.post("/add_training_data_bulk", json=body).status_code == 202
    # read endpoints stay open
    assert c.get("/data/status", headers={"Authorization": ""}).status_code == 200


def test_flush_deletes_the_requested_side(server):
    c, svc = server
    entries = load_entries()[:400]
    for i in range(0, 400, 4):
        assert c.post("/add_training_data_bulk", json={"entries": entries[i:i + 4]}).status_code == 202
    assert c.post("/flush", json={"flush_training_data": "yes"}).status_code == 422
    r = c.post("/flush", json={"flush_training_data": True, "reason": "test"})
    assert r.status_code == 200
    left = r.json()["stored_rows"]
    assert 10 < left < 80 and svc.store.rows == left  # only the held-out share remains
    r = c.post("/flush", json={"flush_test_data": True, "flush_metrics": True})
    assert r.json()["stored_rows"] == 0


def test_predict_answers_with_the_prior_and_validates(server):
    c, _ = server
    p = c.post("/predict", json=GOOD[0]).json()
    assert p["model_source"] == "prior" and p["model_version"] == "prior-default"
    assert p["ttft_ms"] > 0 and p["tpot_ms"] > 0 and len(p["ttft_prediction_bounds"]) == 2
    for key in ("ttft_uncertainty", "predicted_at", "model_type", "objective_type", "quantile", "last_model_load"):
        assert key in p
    r = c.post("/predict", json={**GOOD[0], "prefix_cache_score": -1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "prefix_cache_score"]
    assert c.post("/predict", content=b"{").status_code == 422
    assert c.get("/readyz").status_code == 503 and c.get("/healthz").status_code == 200
    assert c.get("/model/ttft/xgb/json").status_code == 404  # no model yet
    assert c.get("/model/download/info").json()["model_status"] == {"ttft": False, "tpot": False}


def test_openapi_describes_request_bodies(server):
    c, _ = server
    spec = c.get("/openapi.json").json()
    bulk = spec["paths"]["/add_training_data_bulk"]["post"]
    schema = bulk["requestBody"]["content"]["application/json"]["schema"]
    item = schema["properties"]["entries"]["items"]
    assert {"actual_ttft_ms", "actual_tpot_ms", "kv_cache_percentage"} <= set(item["required"])
    assert item["properties"]["kv_cache_percentage"]["maximum"] == 1.0
    assert {"202", "413", "422", "429"} <= set(bulk["responses"])
    assert "requestBody" in spec["paths"]["/predict"]["post"]
    assert "requestBody" in spec["paths"]["/flush"]["post"]
    assert "/v1/bundles/{version}/{file}" in spec["paths"]


def test_live_error_from_entries_carrying_predictions(server):
    c, _ = server
    ttft_rows = [e for e in load_entries() if e["actual_ttft_ms"] > 0][:40]
    entries = [{**e, "predicted_ttft_ms": e["actual_ttft_ms"] * (2.0 if i % 4 else 0.5),
                "model_version": "prior-default"} for i, e in enumerate(ttft_rows)]
    other = [{**e, "predicted_ttft_ms": 1.0, "model_version": "v000009-20260101T000000Z"} for e in ttft_rows[:10]]
    both = entries + other
    for i in range(0, len(both), 4):  # small body limit and queue in this fixture
        assert c.post("/add_training_data_bulk", json={"entries": both[i:i + 4]}).status_code == 202
    m = {line.split(" ")[0]: float(line.split(" ")[1]) for line in c.get("/metrics").text.splitlines()
         if line.startswith("latency_training_live_")}
    # 3 of 4 predictions cover the actual; another bundle's predictions are not counted
    assert m['latency_training_live_coverage_percent{target="ttft"}'] == 75.0
    assert m['latency_training_live_samples{target="ttft"}'] == 40
    expected = np.mean([0.1 * e["actual_ttft_ms"] if i % 4 else 0.9 * 0.5 * e["actual_ttft_ms"]
                        for i, e in enumerate(ttft_rows)])
    assert m['latency_training_live_pinball_ms{target="ttft"}'] == pytest.approx(expected)
    assert m['latency_training_live_samples{target="tpot"}'] == 0


def test_a_failing_disk_is_503_and_nothing_is_acknowledged(server):
    import sqlite3

    c, svc = server

    def disk_full():
        raise sqlite3.OperationalError("database or disk is full")

    svc.store.before_commit = disk_full  # failure injection
    r = c.post("/add_training_data_bulk", json={"entries": GOOD[:3]})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert svc.store.rows == 0 and svc.store.queue_depth == 0
    svc.store.before_commit = None  # the disk recovers: the writer is still alive
    assert c.post("/add_training_data_bulk", json={"entries": GOOD[:3]}).status_code == 202
    assert svc.store.rows == 3
