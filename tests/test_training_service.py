"""The training service without HTTP: validation naming each bad entry, durable ingestion
(the answer only after the commit), predictions from the served bundle, flush, metrics."""
from __future__ import annotations

import pytest

from conftest import training_entry
from features.schema import FieldError
from training_server.service import MAX_ERRORS_REPORTED, TrainingService
from training_server.settings import Settings


@pytest.fixture
def svc(tmp_path):
    service = TrainingService(Settings.from_env({}, data_dir=str(tmp_path), retraining_interval_sec=60))
    service.start(run_worker=False)
    yield service
    service.stop()


def test_a_service_must_be_started_before_it_takes_entries(tmp_path):
    service = TrainingService(Settings.from_env({}, data_dir=str(tmp_path)))
    with pytest.raises(RuntimeError, match="start"):
        service.ingest([training_entry(0)])


def test_valid_entries_are_stored_before_the_answer_and_bad_ones_named(svc):
    bad = [{**training_entry(i), "kv_cache_percentage": 2.0} for i in range(MAX_ERRORS_REPORTED + 2)]
    result = svc.ingest([training_entry(0), *bad, training_entry(1)]).result(30)
    assert (result.accepted, result.total, result.rejected) == (2, MAX_ERRORS_REPORTED + 4, MAX_ERRORS_REPORTED + 2)
    assert svc.store.rows == 2                              # committed when the future resolves
    assert len(result.errors) == MAX_ERRORS_REPORTED
    assert result.errors[0] == {"index": 1, "loc": ["body", "entries", 1, "kv_cache_percentage"],
                                "msg": result.errors[0]["msg"], "type": result.errors[0]["type"]}
    assert result.to_json()["message"] == f"accepted 2 of {MAX_ERRORS_REPORTED + 4} entries"
    text = svc.render_metrics().decode()
    assert "latency_training_entries_accepted_total 2.0" in text and "latency_training_store_rows 2.0" in text


def test_predict_answers_from_the_served_bundle_and_names_a_bad_field(svc):
    row = {k: v for k, v in training_entry(3).items() if not k.startswith("actual_")}
    p = svc.predict(row)
    assert p["model_source"] == "prior" and p["ttft_ms"] > 0 and p["tpot_ms"] > 0
    assert p["model_version"] == svc.registry.served.version
    with pytest.raises(FieldError) as e:
        svc.predict({**row, "num_request_waiting": -1})
    assert e.value.loc[-1] == "num_request_waiting"


def test_flush_deletes_the_asked_side_only(svc):
    svc.ingest([training_entry(i) for i in range(200)]).result(30)
    assert svc.flush(training=False, test=False).result(30) == 200
    left = svc.flush(training=False, test=True).result(30)
    assert 0 < left < 200 and svc.flush(training=True, test=False).result(30) == 0
