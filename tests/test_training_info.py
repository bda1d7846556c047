"""What the training server says about its models and data (/model/download/info,
/model/{name}/info, /models/list, /model/{name}/xgb/json, /data/status), from a real service."""
from __future__ import annotations

import json

import pytest

from conftest import training_entry
from load.demo_bundle import build_bundle
from training_server import info
from training_server.bodies import HTTPProblem
from training_server.service import TrainingService
from training_server.settings import Settings


def _svc(data_dir, **kw):
    return TrainingService(Settings.from_env({}, data_dir=str(data_dir), retraining_interval_sec=60, **kw)
                           ).start(run_worker=False)


def test_the_prior_is_described_without_model_files(tmp_path):
    svc = _svc(tmp_path)
    try:
        d = info.download_info(svc)
        assert d["model_source"] == "prior" and d["model_status"] == {"ttft": False, "tpot": False}
        m = info.model_info(svc, "ttft")
        assert (m["exists"], m["file"], m["model_source"]) == (False, None, "prior")
        with pytest.raises(HTTPProblem) as e:
            info.model_info(svc, "e2e")
        assert e.value.status == 404
        with pytest.raises(HTTPProblem):
            info.xgb_json(svc, "ttft")
        svc.ingest([training_entry(i) for i in range(30)]).result(30)
        s = info.data_status(svc)
        assert (s["stored_rows"], s["last_row_id"], s["retrain_cycles"], s["last_retrain"]) == (30, 30, 0, None)
        assert s["strata"] >= 1 and s["inserted_since_start"] == 30 and s["model_source"] == "prior"
        assert s["rows_with_target"]["ttft"] + s["rows_with_target"]["tpot"] >= 30
    finally:
        svc.stop()


def test_a_learned_xgboost_bundle_is_described_and_dumped_as_json(tmp_path):
    svc = _svc(tmp_path / "data", seed_bundle=str(build_bundle(tmp_path / "seed", 2, rounds=10)))
    try:
        version = svc.registry.served.version
        listed = info.models_list(svc)
        assert listed["served_version"] == version and [m["name"] for m in listed["models"]] == ["ttft", "tpot"]
        m = info.model_info(svc, "tpot")
        assert m["exists"] and m["model_type"] == "xgboost" and len(m["file"]["sha256"]) == 64
        assert m["features"]
        dump = info.xgb_json(svc, "ttft")
        assert json.loads(dump)["learner"]["gradient_booster"]["model"]["trees"]
        assert info.xgb_json(svc, "ttft") is dump and (version, "ttft") in svc.xgb_json_cache
    finally:
        svc.stop()
