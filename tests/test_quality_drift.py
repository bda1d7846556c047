"""Live error and drift in the retrain worker: a served bundle whose live coverage departs
from the quantile is republished at once with a live-corrected calibration (same models),
and the following retrain weights the rows after the drift more. Real store, real models,
real bundles on disk; live pairs are the served bundle's own predictions on real rows."""
from __future__ import annotations

import numpy as np
import pytest

from features.bundle import read_bundle
from features.schema import parse_training_entry
from prediction_server.model import LoadedBundle
from training_server import calibration, trainer as trainer_mod
from training_server.store import entries_to_rows
from training_server.testing import load_entries
from training_server.worker import RECAL_MIN_PAIRS, RECAL_WINDOW, RECENT_WEIGHT

from test_training_publish import parts  # noqa: F401 (the worker fixture: real store, registry, worker)

ENTRIES = load_entries()
PARSED = [parse_training_entry(e) for e in ENTRIES]


def _live(bundle, entries, factor):
    """(actual x factor, predicted by ``bundle``) pairs per target for ``entries``."""
    raw = np.array([e.raw for e in entries])
    pred = dict(zip(("ttft", "tpot"), bundle.predict(raw)))
    out = {}
    for t, key in (("ttft", "actual_ttft_ms"), ("tpot", "actual_tpot_ms")):
        y = np.array([getattr(e, key) for e in entries])
        m = y > 0
        out[t] = list(zip((y[m] * factor).tolist(), pred[t][m].tolist()))
    return out


def test_slower_servers_trigger_a_live_recalibration_then_a_recency_weighted_retrain(parts, monkeypatch):
    store, registry, worker = parts
    metrics = worker.metrics
    store.submit(entries_to_rows(PARSED[:2500])).result(10)
    assert worker.run_once().outcome == "published"
    first = registry.served
    first_files = registry.served_files()
    # the servers became 1.5x slower: live actuals of the next requests, scored by the served bundle
    live_entries = PARSED[2500:3300]
    live = _live(first, live_entries, 1.5)
    assert min(len(v) for v in live.values()) >= RECAL_MIN_PAIRS
    before = {t: np.mean([a <= p for a, p in v]) * 100 for t, v in live.items()}
    assert before["ttft"] < 86 and before["tpot"] < 86  # the departure is real
    metrics.observe_live(live)

    seen_weights = []
    real = trainer_mod.train_models

    def spy(*a, **kw):
        seen_weights.append(kw.get("weights"))
        return real(*a, **kw)

    monkeypatch.setattr(trainer_mod, "train_models", spy)
    slow = [e.__class__(e.raw, e.actual_ttft_ms * 1.5, e.actual_tpot_ms * 1.5, None) for e in live_entries]
    store.submit(entries_to_rows(slow)).result(10)
    report = worker.run_once()
    # 1) live recalibration: a new version with the same model files, calibration x live factor
    assert worker.recalibrations == 1
    found = [read_bundle(p) for p in sorted(registry.root.iterdir())]
    rec_manifest, rec_files = next((m, f) for m, f in found if (m.get("recalibrated") or {}).get("from")
                                   == first.version)
    assert rec_files == first_files
    for t in ("ttft", "tpot"):
        assert 1.2 < rec_manifest["recalibrated"]["factors"][t] < 2.0
        assert rec_manifest["calibration"][t]["live_factor"] == rec_manifest["recalibrated"]["factors"][t]
    rec = LoadedBundle.from_files(rec_manifest, rec_files)
    after = _live(rec, live_entries, 1.5)
    for t in ("ttft", "tpot"):  # the corrected predictions cover the quantile on the pairs it used
        cov = np.mean([a <= p for a, p in after[t][-RECAL_WINDOW:]]) * 100
        assert 88.0 <= cov <= 92.0, (t, cov)
    # 2) the retrain that followed weighted the rows after the drift, and its models carry the live factor
    assert report.outcome in ("published", "rejected")
    for t in ("ttft", "tpot"):
        assert worker.live_factor[t] == pytest.approx(rec_manifest["recalibrated"]["factors"][t])
        assert registry.served.manifest["calibration"][t]["live_factor"] == pytest.approx(worker.live_factor[t])
    w = seen_weights[-1]
    assert w is not None and set(np.unique(w)) == {1.0, RECENT_WEIGHT}


def test_recalibration_scales_every_part_of_the_map():
    spec = {"offset_ms": 10.0, "scale": 1.0, "by_regime": {"idle_lowkv": {"offset_ms": 5.0, "scale": 1.0},
                                                           "queued_lowkv": {"offset_ms": 20.0, "scale": 1.0}}}
    out = calibration.scale_spec(spec, 1.5)
    assert out["offset_ms"] == 15.0 and out["scale"] == 1.5 and out["live_factor"] == 1.5
    assert out["by_regime"]["queued_lowkv"] == {"offset_ms": 30.0, "scale": 1.5}
    a = np.arange(1, 101, dtype=float)
    assert calibration.recalibration_factor(a * 2, a, 0.9) == pytest.approx(2.0)
    assert calibration.recalibration_factor(a * 100, a, 0.9) == calibration.MAX_FACTOR
