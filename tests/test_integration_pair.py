"""The service pair as an unmodified llm-d EPP sees it: real processes on loopback.

The JSON below is what the llm-d Go client (latencypredictorclient) sends: every field of
docs/wire-api.md §1.1, 16-row bulk-strict predictions, training entries with RFC 3339
timestamps (nanosecond precision), and the start-up calls to /status and
/model/download/info. Then the whole sharegpt-h200 trace is fed and the prediction
server must end up serving the learned bundle the training server published.
"""
from __future__ import annotations

import re
import time

import httpx
import pytest

from load.ports import free_port, free_ports
from conftest import SHAREGPT, load_jsonl, start_server, stop_server, wait_http

PRED_KEYS = {"ttft_ms": float, "tpot_ms": float, "ttft_uncertainty": float, "tpot_uncertainty": float,
             "ttft_prediction_bounds": list, "tpot_prediction_bounds": list, "predicted_at": str,
             "model_type": str, "objective_type": str, "quantile": float, "last_model_load": str,
             "model_version": str, "model_source": str}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def go_row(i: int) -> dict:
    """One prediction row exactly as the Go client marshals it (pod_type omitted when empty)."""
    row = {"kv_cache_percentage": round(0.05 * (i % 20), 4), "input_token_length": 200 + 97 * i,
           "num_request_waiting": i % 4, "num_request_running": 1 + i % 7, "num_tokens_generated": 1,
           "prefix_cache_score": round((i % 5) / 4, 4), "prefill_tokens_in_flight": 64 * (i % 3),
           "decode_tokens_in_flight": 0, "encoder_input_size": 0, "encoder_matched_size": 0}
    if i % 3 == 1:
        row["pod_type"] = "decode"
    if i % 8 == 5:
        row.update(encoder_input_size=576, encoder_matched_size=288)
    return row


def go_entry(i: int) -> dict:
    e = go_row(i)
    e.update(num_tokens_generated=0, actual_ttft_ms=float(300 + 11 * i), actual_tpot_ms=0.0,
             timestamp=f"2026-08-01T10:00:{i % 60:02d}.123456789Z")
    return e


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    data = tmp_path_factory.mktemp("pair")
    tport = free_ports(2)
    pport = tport + 1
    turl, purl = f"http://127.0.0.1:{tport}", f"http://127.0.0.1:{pport}"
    env = {"LATENCY_RETRAINING_INTERVAL_SEC": "1", "LATENCY_MIN_SAMPLES_FOR_RETRAIN": "100",
           "MODEL_SYNC_INTERVAL_SEC": "1"}
    train = start_server("training_server", ["--port", str(tport), "--data-dir", str(data / "d")], env,
                         log=data / "training.log")
    pred = start_server("prediction_server", ["--port", str(pport), "--training-server-url", turl], env,
                        log=data / "prediction.log")
    try:
        wait_http(turl + "/healthz", proc=train)
        wait_http(purl + "/healthz", proc=pred)
        yield turl, purl, train, pred
    finally:
        stop_server(pred)
        stop_server(train)


def check_prediction(p: dict) -> None:
    for key, typ in PRED_KEYS.items():
        assert key in p, key
        assert isinstance(p[key], typ), (key, p[key])
    assert p["ttft_ms"] >= 0 and p["tpot_ms"] >= 0
    for b in (p["ttft_prediction_bounds"], p["tpot_prediction_bounds"]):
        assert len(b) == 2 and b[0] <= b[1]
    assert RFC3339.match(p["predicted_at"]) and RFC3339.match(p["last_model_load"])
    assert p["objective_type"] in ("quantile", "mean") and 0 < p["quantile"] < 1
    assert p["model_source"] in ("prior", "learned")


def test_llmd_go_client_contract(pair):
    turl, purl, _, _ = pair
    with httpx.Client(timeout=10) as c:
        # start-up calls of the Go client
        st = c.get(purl + "/status")
        assert st.status_code == 200
        body = st.json()
        for key in ("is_ready", "model_type", "objective_type", "quantile", "last_model_load",
                    "training_server_url", "models_exist"):
            assert key in body, key
        assert body["training_server_url"] == turl and isinstance(body["models_exist"], dict)
        info = c.get(turl + "/model/download/info")
        assert info.status_code == 200
        info = info.json()
        assert {"model_type", "objective_type", "model_status", "quantile"} <= set(info)
        assert info["model_type"] == "xgboost" and info["quantile"] == 0.9

        # the hot path: 16 rows, one per candidate endpoint, answered before any model (prior)
        rows = [go_row(i) for i in range(16)]
        r = c.post(purl + "/predict/bulk/strict", json={"requests": rows})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["total_requests"] == 16 and out["successful_predictions"] == 16 and out["failed_predictions"] == 0
        assert isinstance(out["processing_time_ms"], (int, float)) and out["processing_time_ms"] >= 0
        assert len(out["predictions"]) == 16
        for p in out["predictions"]:
            check_prediction(p)
        assert len({p["model_version"] for p in out["predictions"]}) == 1
        # row order is kept: more uncached prompt on an otherwise equal row never predicts less
        a = c.post(purl + "/predict/bulk/strict", json={"requests": [dict(rows[0], input_token_length=100),
                                                                      dict(rows[0], input_token_length=8000)]}).json()
        assert a["predictions"][0]["ttft_ms"] <= a["predictions"][1]["ttft_ms"]

        # one invalid row fails the whole strict call with the field named
        bad = [*rows[:3], dict(rows[3], kv_cache_percentage=1.7)]
        r = c.post(purl + "/predict/bulk/strict", json={"requests": bad})
        assert r.status_code == 422 and "kv_cache_percentage" in r.text

        # training entries as the Go client flushes them: any status but 202 is a failure to it
        entries = [go_entry(i) for i in range(40)]
        r = c.post(turl + "/add_training_data_bulk", json={"entries": entries})
        assert r.status_code == 202, r.text
        assert r.json()["accepted"] == 40 and r.json()["rejected"] == 0
        # the training server answers single predictions too, in the same shape
        r = c.post(turl + "/predict", json=go_row(3))
        assert r.status_code == 200, r.text
        check_prediction(r.json())


def test_feeding_sharegpt_serves_a_learned_bundle(pair):
    turl, purl, _, _ = pair
    entries = load_jsonl(SHAREGPT)
    with httpx.Client(timeout=30) as c:
        t0 = time.monotonic()
        for i in range(0, len(entries), 100):  # the EPP flushes at most 100-1000 entries a second
            r = c.post(turl + "/add_training_data_bulk", json={"entries": entries[i:i + 100]})
            assert r.status_code == 202, r.text
        deadline = time.monotonic() + 90
        served = None
        while time.monotonic() < deadline:
            p = c.post(purl + "/predict/bulk/strict", json={"requests": [go_row(i) for i in range(16)]}).json()
            if p["predictions"][0]["model_source"] == "learned":
                served = p["predictions"][0]["model_version"]
                break
            time.sleep(0.5)
        assert served is not None, "prediction server never served a learned bundle"
        elapsed = time.monotonic() - t0
        latest = c.get(turl + "/v1/bundles/latest")
        assert latest.status_code == 200
        manifest = latest.json()
        assert manifest["model_kind"] == "xgboost" and set(manifest["models"]) == {"ttft", "tpot"}
        # the prediction server serves a bundle the training server published (it may already be newer)
        assert int(served[1:7]) <= int(manifest["version"][1:7])
        assert c.get(purl + "/readyz").status_code == 200 and c.get(turl + "/readyz").status_code == 200
        st = c.get(purl + "/status").json()
        assert st["is_ready"] is True and st["models_exist"] == {"ttft": True, "tpot": True}

        metrics = c.get(turl + "/metrics").text
        found = {}
        for target in ("ttft", "tpot"):
            for kind in ("pinball", "coverage"):
                m = re.search(rf'^\w*heldout\w*{kind}\w*\{{[^}}]*target="{target}"[^}}]*\}} ([0-9.e+-]+)$', metrics, re.M)
                assert m, f"held-out {kind} for {target} missing from /metrics"
                found[(target, kind)] = float(m.group(1))
        print(f"\nlearned bundle {served} served {elapsed:.1f}s after feeding started; held-out: "
              + ", ".join(f"{t} {k}={v:.3f}" for (t, k), v in found.items()))
        assert 0 < found[("ttft", "pinball")] < 200 and 50 <= found[("ttft", "coverage")] <= 100
