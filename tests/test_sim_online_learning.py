"""The simulator learns through the training server's own service (issue #13): a short run of
the predicted policy feeds the live pairs of its predictions to the service's live
correction, which moves the live factor and republishes the served models. Real simulator,
real store, real training; assertions on the service's state."""
from __future__ import annotations

import math

import pytest

from load.sim import bench
from load.sim.driver import EPOCH
from load.sim.scenarios import get_scenario

pytest.importorskip("xgboost")

KEYS = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p90_ms", "slo_attainment", "live_pairs", "recalibrations",
        "live_factor_ttft", "live_factor_tpot")


def _run(seed=0):
    sc = get_scenario("standard-small")
    opts = bench.RunOptions(seed=seed, limit=400, retrain_interval_s=20.0)
    arr, cap = bench.prepare(sc, opts)
    return bench.run_one(sc, arr, cap, 0.9, "predicted", opts)


@pytest.fixture(scope="module")
def first_run():
    return _run(seed=0)


def test_the_predicted_policy_feeds_the_live_correction_of_the_training_service(first_run):
    from training_server.service import TrainingService

    m, _, router = first_run
    svc = router.learner.service
    assert isinstance(svc, TrainingService)  # the product's object, not a re-assembly
    worker = svc.worker
    # live pairs: the predictions made for the chosen endpoints, paired with what happened
    assert worker.feedback.added["ttft"] > 100 and worker.feedback.added["tpot"] > 100
    assert m["live_pairs"] == sum(worker.feedback.added.values())
    # they moved the live factor, and the served models were republished with it
    assert worker.recalibrations >= 1 and m["recalibrations"] == worker.recalibrations
    moved = {t: f for t, f in worker.live_factor.items() if not math.isclose(f, 1.0, abs_tol=0.01)}
    assert moved, worker.live_factor
    served = svc.registry.served
    assert served.source == "learned" and m["served_version"] == served.version
    for t, f in moved.items():
        assert served.manifest.calibration_of(t).live == pytest.approx(f)
    # the service runs on simulated time (row timestamps, freshness of the live pairs)
    assert svc.clock() == EPOCH + router.sim.now and router.sim.now > 60.0


def test_online_learning_with_the_live_correction_is_deterministic(first_run):
    a = first_run[0]
    b, _, _ = _run(seed=0)
    assert a["recalibrations"] >= 1  # the correction was part of the run
    assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}
