"""Live error and drift in the retrain worker: live pairs move a multiplicative live factor
(adaptive conformal inference) and the served models are republished with it at once; a
large move is a drift, and the following retrain weights the rows after it more and takes
the correction over by level. Real store, real models, real bundles on disk; live pairs are
the served bundle's own predictions on real rows, in arrival order."""
from __future__ import annotations

import numpy as np
import pytest

from features.schema import parse_training_entry
from training_server import calibration, trainer as trainer_mod
from training_server.store import entries_to_rows
from load.data import load_entries
from training_server.correction import LEVEL_ROWS
from training_server.service import TrainingService
from training_server.settings import Settings
from training_server.worker import RECENT_WEIGHT

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


def _replay(worker, registry, entries, factor, chunk=25):
    """Serve ``entries`` in arrival order: each chunk is predicted by the bundle served at the
    time, its live pairs (actuals x ``factor``) reach the metrics, then one correction step
    runs. Returns the (actual, predicted) pairs per target."""
    seen = {"ttft": [], "tpot": []}
    for i in range(0, len(entries), chunk):
        pairs = _live(registry.served, entries[i:i + chunk], factor)
        worker.feedback.observe(pairs, pairs)
        for t in seen:
            seen[t] += pairs[t]
        worker.recalibrate()
    return seen


def _coverage(pairs):
    return float(np.mean([a <= p for a, p in pairs]) * 100)


def test_slower_servers_are_corrected_live_then_handed_over_to_a_recency_weighted_retrain(parts, monkeypatch):
    store, registry, worker = parts
    store.submit(entries_to_rows(PARSED[:2500])).result(10)
    assert worker.run_once().outcome == "published"
    first, first_files = registry.served, registry.served_files()
    # the servers became 1.5x slower: 800 requests, each predicted by whatever was served then
    live_entries = PARSED[2500:3300]
    before = {t: _coverage(v) for t, v in _live(first, live_entries, 1.5).items()}
    assert before["ttft"] < 80 and before["tpot"] < 80  # the departure is real
    seen = _replay(worker, registry, live_entries, 1.5)
    # 1) corrected live: recalibrated versions with the same model files, a live factor near 1.5
    assert worker.recalibrations >= 2
    assert registry.served.version != first.version and registry.served_files() == first_files
    for t in ("ttft", "tpot"):
        assert 1.2 < worker.live_factor[t] < 2.0, (t, worker.live_factor)
        assert registry.served.manifest.to_json()["calibration"][t]["live_factor"] == pytest.approx(worker.live_factor[t])
        half = len(seen[t]) // 2  # the second half of the slow traffic is covered again
        assert 85.0 <= _coverage(seen[t][half:]) <= 95.0, (t, _coverage(seen[t][half:]))
    assert worker.drift_retrain_pending and worker.drift_from_id is not None

    # 2) the slow rows are stored; the retrain weights them more and starts at the served level
    seen_weights = []
    real = trainer_mod.train_models

    def spy(*a, **kw):
        seen_weights.append(kw.get("weights"))
        return real(*a, **kw)

    monkeypatch.setattr(trainer_mod, "train_models", spy)
    slow = [e.__class__(e.raw, e.actual_ttft_ms * 1.5, e.actual_tpot_ms * 1.5, None) for e in live_entries]
    store.submit(entries_to_rows(slow)).result(10)
    served = registry.served
    report = worker.run_once()
    assert report.outcome in ("published", "rejected")
    w = seen_weights[-1]
    assert w is not None and set(np.unique(w)) == {1.0, RECENT_WEIGHT}
    if report.outcome == "published":
        new = registry.served
        raw = np.array([e.raw for e in slow[-LEVEL_ROWS:]])
        for i, t in enumerate(("ttft", "tpot")):
            ratio = np.median(new.predict(raw)[i] / served.predict(raw)[i])
            assert 0.85 < ratio < 1.15, (t, ratio)  # no jump in level at the hand-over
            assert worker.live_factor[t] == pytest.approx(new.manifest.to_json()["calibration"][t].get("live_factor", 1.0))


def test_live_pairs_of_recent_learned_versions_feed_the_correction(tmp_path):
    svc = TrainingService(Settings(data_dir=tmp_path))
    svc.start(run_worker=False)
    try:
        svc.store.submit(entries_to_rows(PARSED[:2500])).result(10)
        assert svc.worker.run_once().outcome == "published"
        v = svc.registry.served.version
        base = {k: ENTRIES[0][k] for k in ("kv_cache_percentage", "input_token_length", "num_request_waiting",
                                           "num_request_running", "num_tokens_generated", "prefix_cache_score")}
        entries = [dict(base, actual_ttft_ms=100.0, actual_tpot_ms=0, predicted_ttft_ms=80.0, model_version=ver)
                   for ver in (v, v, "prior-default", "v999999-20990101T000000Z", "")]
        assert svc.ingest(entries).result(10).accepted == 5
        a, p, versions = svc.feedback.take("ttft")
        assert len(a) == 2  # the served learned version only: not the prior, unknown or absent ones
        assert versions == [v, v]  # each pair with the version that predicted it
        assert svc.feedback.take("ttft")[0].size == 0  # drained
        assert svc.feedback.live_scores()["ttft"]["n"] == 3  # live error: served or unversioned entries
    finally:
        svc.stop()


def test_adaptive_correction_settles_at_the_quantile():
    rng = np.random.default_rng(0)
    pred = rng.uniform(50, 150, 20_000)
    ratio = rng.lognormal(0.0, 0.2, 20_000)  # actual = ratio x raw prediction
    target = float(np.quantile(ratio, 0.9))
    lf = 0.0
    hits = []
    for i in range(0, 20_000, 25):  # chunks predicted with the factor of the time
        p = pred[i:i + 25] * np.exp(lf)
        a = pred[i:i + 25] * ratio[i:i + 25]
        hits.append(a <= p)
        lf = calibration.aci_update(lf, a, p, 0.9, 0.02)
    assert np.exp(lf) == pytest.approx(target, rel=0.1)
    assert 88.0 <= np.mean(np.concatenate(hits[len(hits) // 2:])) * 100 <= 92.0
    # bounded, and hits alone shrink it only slowly (a miss weighs 9 hits at q = 0.9)
    assert calibration.aci_update(0.0, np.full(10_000, 1e9), np.ones(10_000), 0.9, 0.02) == pytest.approx(
        np.log(calibration.MAX_FACTOR))
    assert calibration.aci_update(0.0, np.zeros(10), np.ones(10), 0.9, 0.02) == pytest.approx(-0.02)
    # one batch of pairs, all predicted with an older factor, moves it by at most max_move
    assert calibration.aci_update(0.0, np.full(100, 9.0), np.ones(100), 0.9, 0.02, 0.2) == pytest.approx(0.2)


def _delayed_loop(use_levels: bool, delay: int = 3, cycles: int = 120) -> np.ndarray:
    """The correction's factor per cycle when each cycle's 100 pairs were predicted with the
    factor of ``delay`` cycles before (a retrain between correction and prediction servers)."""
    rng = np.random.default_rng(0)
    history, lf, out = [0.0] * (delay + 1), 0.0, []
    for _ in range(cycles):
        used = history[-1 - delay]
        raw = rng.uniform(50, 150, 100)
        actual = raw * 1.5 * rng.lognormal(0.0, 0.2, 100)
        lf = calibration.aci_update(lf, actual, raw * np.exp(used), 0.9, 0.02, 0.2,
                                    levels=np.full(100, used) if use_levels else None)
        history.append(lf)
        out.append(np.exp(lf))
    return np.array(out)


def test_pairs_judged_at_the_factor_of_the_moment_do_not_oscillate_through_a_slow_loop():
    target = 1.5 * np.exp(0.2 * 1.2816)  # the p90 of actual / raw prediction
    judged_as_predicted = _delayed_loop(False)[-40:]
    rebased = _delayed_loop(True)[-40:]
    # stale pairs keep asking for a correction already made: the factor swings far past the target
    assert judged_as_predicted.max() > 1.4 * target and judged_as_predicted.min() < 0.7 * target
    # each pair rescaled to the factor of the moment: it settles at the target
    assert rebased.min() > 0.9 * target and rebased.max() < 1.1 * target


def test_recalibration_scales_every_part_of_the_map():
    spec = {"offset_ms": 10.0, "scale": 1.0, "by_regime": {"idle_lowkv": {"offset_ms": 5.0, "scale": 1.0},
                                                           "queued_lowkv": {"offset_ms": 20.0, "scale": 1.0}}}
    out = calibration.scale_spec(spec, 1.5)
    assert out["offset_ms"] == 15.0 and out["scale"] == 1.5 and out["live_factor"] == 1.5
    assert out["by_regime"]["queued_lowkv"] == {"offset_ms": 30.0, "scale": 1.5}
    a = np.arange(1, 101, dtype=float)
    assert calibration.level_factor(a * 2, a) == pytest.approx(2.0)
    assert calibration.level_factor(a * 100, a) == calibration.MAX_FACTOR
    assert calibration.level_factor(np.zeros(3), a[:3]) == 1.0


def test_without_live_pairs_a_retrain_keeps_its_own_conformal_calibration(parts, monkeypatch):
    """An EPP that reports no predictions: the level is never frozen at an earlier model's."""
    store, registry, worker = parts
    store.submit(entries_to_rows(PARSED[:1500])).result(10)
    assert worker.run_once().outcome == "published"
    results = []
    real = trainer_mod.train_models

    def spy(*a, **kw):
        results.append(real(*a, **kw))
        return results[-1]

    monkeypatch.setattr(trainer_mod, "train_models", spy)
    store.submit(entries_to_rows(PARSED[1500:3000])).result(10)
    assert worker.run_once().outcome == "published"
    m, files = registry.served.manifest.to_json(), registry.served_files()
    fresh = [t for t in m["models"] if files[m["models"][t]["file"]] == results[-1].models.get(t)]
    assert fresh  # at least one target took the new model
    for t in fresh:
        assert "live_factor" not in m["calibration"][t]
        assert m["calibration"][t]["offset_ms"] == pytest.approx(results[-1].calibration[t]["offset_ms"])


def _first_model_and_its_predictions(parts):
    """Publish the first learned model on 2,500 rows; (its version, its predictions per target
    on the next 200 rows)."""
    store, registry, worker = parts
    store.submit(entries_to_rows(PARSED[:2500])).result(10)
    assert worker.run_once().outcome == "published"
    raw = np.array([e.raw for e in PARSED[2500:2700]])
    return registry.served.version, dict(zip(("ttft", "tpot"), registry.served.predict(raw)))


def test_pairs_predicted_before_a_correction_are_judged_with_it(parts):
    """A pair reaches the correction seconds after its prediction; if the factor was raised in
    between, the pair is judged as the raised factor would have predicted it, not as a second
    request for the same raise."""
    store, registry, worker = parts
    v1, pred = _first_model_and_its_predictions(parts)

    def pairs(version):  # every actual 10% above what v1 predicted: misses at v1's factor
        return {t: [(1.1 * p, p, version) for p in pred[t].tolist() if p > 0] for t in pred}

    worker.feedback.observe({}, pairs(v1))
    worker.recalibrate()
    raised = dict(worker.live_factor)
    assert registry.served.version != v1 and all(f > 1.1 for f in raised.values())  # covers them now
    # the same kind of pairs, still predicted by v1 (in flight while the raise was served)
    worker.feedback.observe({}, pairs(v1))
    worker.recalibrate()
    for t in ("ttft", "tpot"):
        assert worker.live_factor[t] <= raised[t]  # hits at the raised factor: no second raise
    # pairs of a version the correction never served are judged as they were predicted
    worker.feedback.observe({}, pairs("v999999-20990101T000000Z"))
    worker.recalibrate()
    assert all(worker.live_factor[t] > raised[t] for t in ("ttft", "tpot"))


def test_the_live_correction_keeps_running_while_a_retrain_trains(parts):
    """A retrain takes seconds; live pairs that arrive meanwhile are corrected for during it,
    not after it (the level would lag a steady drift by a whole retrain)."""
    store, registry, worker = parts
    first, pred = _first_model_and_its_predictions(parts)
    served_after_training = []

    def phase(name):
        if name == "train":  # live pairs arrive as the training starts: all misses
            worker.feedback.observe({}, {t: [(1.5 * p, p, first) for p in pred[t].tolist() if p > 0] for t in pred})
        elif name == "evaluate":
            served_after_training.append(registry.served)

    worker.on_phase = phase
    store.submit(entries_to_rows(PARSED[2500:2800])).result(10)
    worker.run_once()
    served = served_after_training[0]
    assert served.version != first and served.manifest.recalibrated["from"] == first  # corrected mid-training
    assert all(f > 1.1 for f in worker.correction.live_factor.values())
