"""The retrain worker's engine learning (training_server.engine_learn), through the training
service in process: the engine section is fitted as the engine rows arrive, waits for the first
learned bundle, goes out with it, and later refits republish the served models with the new
section without a retrain (the same model files), once a quarter of the rows fitted last have
arrived; entries without the engine fields fit nothing."""
from __future__ import annotations

import pytest

from load.data import load_entries
from support.engine import SPEEDS, with_engine_fields
from training_server.service import TrainingService
from training_server.settings import Settings


@pytest.fixture
def svc(tmp_path):
    service = TrainingService(Settings.from_env({}, data_dir=str(tmp_path), retraining_interval_sec=60,
                                                min_samples_for_retrain=1000))
    service.start(run_worker=False)
    yield service
    service.stop()


def models_of(svc: TrainingService) -> dict:
    return {t: spec.sha256 for t, spec in svc.registry.served.manifest.models.items()}


def test_the_engine_section_waits_for_a_learned_bundle_then_follows_its_rows(svc):
    entries = with_engine_fields(load_entries())
    plain = [{k: v for k, v in e.items() if not k.startswith("engine_")} for e in entries]
    svc.ingest(entries[:300]).result(30)
    report = svc.run_cycle()                  # 300 rows < 1000: no retrain; the engine is fitted
    assert report.outcome == "skipped" and svc.worker.engine.pending
    assert svc.registry.served.source == "prior" and svc.registry.served.manifest.engine is None

    svc.ingest(entries[300:2000]).result(30)
    report = svc.run_cycle()
    assert report.outcome == "published"
    first = svc.registry.served.manifest.engine
    assert first is not None and not svc.worker.engine.pending
    n_first = first["classes"]["llama|a100"]["n_train"]
    models, version = models_of(svc), svc.registry.served.version

    svc.ingest(entries[2000:2200]).result(30)   # about 100 new engine rows: under a quarter of those fitted
    assert svc.run_cycle().outcome == "skipped" and not svc.worker.engine.pending
    svc.ingest(entries[2200:2800]).result(30)   # enough: no retrain (800 < 1000 new rows), a refit
    report = svc.run_cycle()
    assert report.outcome == "engine" and report.version == svc.registry.served.version != version
    assert models_of(svc) == models                  # the served models, republished with the new section
    engine = svc.registry.served.manifest.engine
    assert engine["classes"]["llama|a100"]["n_train"] > n_first
    speeds = {e: v["speed"] for e, v in engine["classes"]["llama|a100"]["endpoints"].items()}
    assert speeds["pod-2"] / speeds["pod-0"] == pytest.approx(SPEEDS["pod-2"], rel=0.05)

    svc.ingest(plain[2800:2950]).result(30)     # llm-d's entries: stored, nothing to refit
    assert svc.store.engine_rows_after(svc.worker.engine.fitted_to) == 0 and svc.store.rows == 2950
    report = svc.run_cycle()
    assert report.outcome == "skipped" and not svc.worker.engine.pending
    assert models_of(svc) == models and svc.registry.served.manifest.engine == engine


def test_a_retrain_publishes_the_section_fitted_on_every_engine_row_stored(svc):
    """The rows after a fit, too few for a refit of their own (under a quarter of those it read),
    still reach the section in the cycle that retrains the latency models: the bundle that cycle
    publishes carries the section fitted on every engine row stored."""
    entries = with_engine_fields(load_entries())
    svc.ingest(entries[:900]).result(30)
    assert svc.run_cycle().outcome == "skipped"           # 900 < 1000 new samples: the engine alone is fitted
    fitted = svc.worker.engine.rows_read
    svc.ingest(entries[900:1000]).result(30)
    new = svc.store.engine_rows_after(svc.worker.engine.fitted_to)
    assert 0 < new < 0.25 * fitted                         # alone, too few for a refit
    assert svc.run_cycle().outcome == "published"
    assert svc.registry.served.manifest.engine["rows"] == fitted + new


def test_rows_left_over_from_a_fit_are_fitted_once_no_more_arrive(svc):
    """Rows too few for a refit of their own are fitted once a cycle finds no more arrived since
    the one before: the served section ends up on every engine row stored."""
    entries = with_engine_fields(load_entries())
    svc.ingest(entries[:2000]).result(30)
    assert svc.run_cycle().outcome == "published"
    svc.ingest(entries[2000:2200]).result(30)             # too few for a refit of their own
    left = svc.store.engine_rows_after(svc.worker.engine.fitted_to)
    assert svc.run_cycle().outcome == "skipped" and left > 0
    report = svc.run_cycle()                                # none arrived since: the rows left over are fitted
    assert report.outcome == "engine"
    assert svc.store.engine_rows_after(svc.worker.engine.fitted_to) == 0
    assert svc.registry.served.manifest.engine["rows"] == svc.worker.engine.rows_read
    assert svc.run_cycle().outcome == "skipped"             # nothing left: no refit
