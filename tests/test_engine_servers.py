"""The engine twin's step model learned end to end through real servers on loopback: training
entries with the engine fields go to a real training server, its retrain worker fits the step
coefficients and per-endpoint speeds and publishes them in the bundle's engine section, a real
prediction server syncs the bundle and serves the section at GET /v1/engine, and the EPP's
predictor client fetches it for the decode-harm twin's step models. Bad engine fields get a
4xx naming the field; llm-d's entries (none of the fields) are stored as before."""
from __future__ import annotations

import time

import httpx
import pytest

from epp_client.engine.learned import StepModels
from epp_client.engine.twin import StepModel
from epp_client.predictor import PredictorClient
from features.manifest import Manifest
from features.schema import ENGINE_COEFFICIENTS, ENGINE_FEATURE_FIELDS
from load.data import load_entries
from prediction_server.app import create_app as prediction_app
from prediction_server.settings import Settings as PredictionSettings
from support.engine import SPEEDS, with_engine_fields
from support.servers import run_app
from training_server.app import create_app as training_app
from training_server.settings import Settings as TrainingSettings


def test_the_engine_step_model_travels_from_the_entries_to_the_epp(tmp_path):
    entries = with_engine_fields(load_entries())
    ts = TrainingSettings.from_env({}, data_dir=str(tmp_path / "data"), retraining_interval_sec=0.2,
                                   min_samples_for_retrain=len(entries))
    with run_app(training_app(ts)) as train_url, httpx.Client(base_url=train_url, timeout=30) as t:
        ps = PredictionSettings.from_env({}, training_server_url=train_url, sync_interval_sec=0.2)
        with run_app(prediction_app(ps)) as pred_url, httpx.Client(base_url=pred_url, timeout=30) as p:
            for c in (t, p):   # nothing learned yet: 404 with the reason
                r = c.get("/v1/engine")
                assert r.status_code == 404 and "no engine step model learned" in r.json()["detail"]
            # a bad engine field: the entry is refused naming the field, the others are stored
            bad = dict(entries[0], engine_endpoint="pod-0", **{f.name: 1.0 for f in ENGINE_FEATURE_FIELDS})
            bad["engine_prefill_pairs"] = -1.0
            r = t.post("/add_training_data_bulk", json={"entries": [bad]})
            assert r.status_code == 422
            assert r.json()["detail"][0]["loc"] == ["body", "entries", 0, "engine_prefill_pairs"]
            for i in range(0, len(entries), 500):
                assert t.post("/add_training_data_bulk", json={"entries": entries[i:i + 500]}).status_code == 202
            # the worker refits as rows arrive: wait for the section fitted on all of them
            n_ttft = sum(1 for e in entries if e["actual_ttft_ms"] > 0)
            end = time.monotonic() + 120
            while True:
                r = p.get("/v1/engine")
                if r.status_code == 200 and r.json()["engine"]["rows"] == n_ttft:
                    break
                assert time.monotonic() < end, (
                    f"no engine section of every row ({n_ttft}) reached the prediction server: it answers "
                    f"{r.status_code} {r.text[:200]}; the training server's section "
                    f"{t.get('/v1/engine').text[:200]}; its data {t.get('/data/status').text[:400]}")
                time.sleep(0.1)
            served = r.json()
            manifest = Manifest.from_json(t.get("/v1/bundles/latest").json())
            assert manifest.to_json()["engine"] == served["engine"] == t.get("/v1/engine").json()["engine"]
            assert served["model_version"] == manifest.version == p.get("/status").json()["model_version"]
            cls = served["engine"]["classes"]["llama|a100"]
            assert cls["n_train"] + cls["n_heldout"] == n_ttft and cls["heldout_error"] < 0.05
            learned = {e: v["speed"] for e, v in cls["endpoints"].items()}
            assert set(learned) == set(SPEEDS)
            for e, s in SPEEDS.items():   # relative to pod-0, as the truth
                assert learned[e] / learned["pod-0"] == pytest.approx(s, rel=0.03), e

            # the EPP: the predictor client fetches the section; the twin's step models use it
            client = PredictorClient([pred_url], engine_refresh_s=0.1)
            try:
                models = StepModels(StepModel(), client.engine_section)
                end = time.monotonic() + 20
                while models.learned is None:
                    assert time.monotonic() < end, "the EPP never fetched the engine section"
                    models.refresh()
                    time.sleep(0.05)
                slow = models.for_endpoint("llama|a100", "pod-2")
                assert slow.speed == pytest.approx(learned["pod-2"])
                assert [getattr(slow, k) for k in ENGINE_COEFFICIENTS] == [cls["coefficients"][k]
                                                                          for k in ENGINE_COEFFICIENTS]
                assert models.for_endpoint("default", "pod-2") is models.prior   # another class: the prior
            finally:
                client.close()
