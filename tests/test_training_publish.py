"""Retrain worker, publish gate and bundle distribution, on the recorded sharegpt-h200
entries: real store, real models, real HTTP server on loopback."""
import hashlib
import threading
import time

import httpx
import numpy as np
import pytest

from features.bundle import list_bundles, validate_manifest, verify_file
from training_server.app import create_app
from training_server.metrics import TrainingMetrics
from training_server.registry import Registry, write_export_dir
from training_server.settings import Settings
from training_server.store import SampleStore, entries_to_rows
from load.data import load_entries
from support.servers import run_app
from training_server.trainer import TrainConfig
from training_server import trainer as trainer_mod
from training_server.worker import RetrainWorker, publish_gate, target_verdicts
from features.schema import parse_training_entry

ENTRIES = load_entries()


def rows(entries):
    return entries_to_rows([parse_training_entry(e) for e in entries])


def retrain_skips(c: httpx.Client) -> float:
    """The worker's checks that found too few new samples (/metrics): it is alive and idle."""
    text = c.get("/metrics").text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("latency_training_retrain_skips_total ")]
    return float(line.split()[1])


@pytest.fixture
def parts(tmp_path):
    store = SampleStore(tmp_path / "s.sqlite3", max_rows=100_000, queue_size=100_000, test_ratio=0.1).open()
    registry = Registry(tmp_path / "bundles", keep=3)
    metrics = TrainingMetrics()
    worker = RetrainWorker(store, registry, metrics, config=TrainConfig(), interval=0.1, min_new=100,
                           max_per_bucket=5000, tolerance=0.02)
    yield store, registry, worker
    worker.stop()
    store.close()


def test_publish_gate_rules():
    served = {"ttft": {"pinball": 10.0, "n": 50}, "tpot": {"pinball": 1.0, "n": 50}}
    assert publish_gate({"ttft": {"pinball": 10.1}}, served, served_is_prior=False, tolerance=0.02)[0]
    assert not publish_gate({"ttft": {"pinball": 10.3}}, served, served_is_prior=False, tolerance=0.02)[0]
    assert not publish_gate({"ttft": {"pinball": 10.1}}, served, served_is_prior=True, tolerance=0.02)[0]
    assert not publish_gate({"ttft": {"pinball": 1.0}}, {}, served_is_prior=True, tolerance=0.02)[0]
    # one target good enough: publish, the other keeps the served one
    both = {"ttft": {"pinball": 12.0}, "tpot": {"pinball": 0.5}}
    assert publish_gate(both, served, served_is_prior=False, tolerance=0.02)[0]
    v = target_verdicts(both, served, served_is_prior=False, tolerance=0.02)
    assert v["ttft"][0] is False and v["tpot"][0] is True
    # a target the candidate did not learn (it answers with its prior) is no reason to publish:
    # otherwise the worse learned target is kept, and nothing learned is left to publish
    assert not publish_gate(both, served, served_is_prior=False, tolerance=0.02, learned=("ttft",))[0]
    v = target_verdicts(both, served, served_is_prior=False, tolerance=0.02, learned=("ttft",))
    assert v["ttft"][0] is False and v["tpot"][0] is None


def test_a_target_whose_model_is_worse_keeps_the_served_model(parts, monkeypatch):
    store, registry, worker = parts
    store.submit(rows(ENTRIES[:3000])).result(10)
    assert worker.run_once().outcome == "published"
    before = registry.served.manifest.to_json()
    real = trainer_mod.train_models

    def sabotaged(*args, **kw):  # failure injection: a broken TTFT model, a good TPOT one
        good = real(*args, **kw)
        bad = real(*args, **{**kw, "config": TrainConfig(params={"n_estimators": 1, "max_depth": 1},
                                                         calibrate=False)})
        good.models["ttft"] = bad.models["ttft"]
        good.calibration.pop("ttft")
        return good

    monkeypatch.setattr(trainer_mod, "train_models", sabotaged)
    store.submit(rows(ENTRIES[3000:])).result(10)
    worker.tolerance = 0.5  # let the retrained TPOT model through whatever the split noise
    report = worker.run_once()
    assert report.outcome == "published" and "kept served ttft" in report.reason, report.reason
    after = registry.served.manifest.to_json()
    assert after["version"] != before["version"]
    assert after["models"]["ttft"]["sha256"] == before["models"]["ttft"]["sha256"]  # carried over
    assert after["calibration"]["ttft"] == before["calibration"]["ttft"]
    assert after["models"]["tpot"]["sha256"] != before["models"]["tpot"]["sha256"]  # the new one


def test_a_candidate_that_cannot_be_served_is_rejected_with_its_reason(parts, monkeypatch):
    """Trees that answer an idle server with a latency <= 0 (seen with the upstream recipe on
    overload-only data) fail the bundle's smoke test: the cycle is a rejection naming the
    target, not a failure with a traceback, and the served bundle stays."""
    store, registry, worker = parts
    store.submit(rows(ENTRIES[:3000])).result(10)
    assert worker.run_once().outcome == "published"
    before = registry.served.version
    real = trainer_mod.train_models

    def negative(*args, **kw):  # failure injection: TTFT trees shifted far below zero
        import xgboost as xgb

        good = real(*args, **kw)
        booster = xgb.Booster()
        booster.load_model(bytearray(good.models["ttft"]))
        booster.set_param({"base_score": -1e7})
        good.models["ttft"] = bytes(booster.save_raw("ubj"))
        return good

    monkeypatch.setattr(trainer_mod, "train_models", negative)
    store.submit(rows(ENTRIES[3000:])).result(10)
    report = worker.run_once()
    assert report.outcome == "rejected" and "not servable" in report.reason and "ttft" in report.reason, report.reason
    assert worker.failures == 0 and registry.served.version == before


def test_base_links_are_chosen_every_few_trainings_and_reused_between(parts, monkeypatch):
    """A full choice among TrainConfig.auto_links (one tree fit per link) every
    LINK_CHOICE_EVERY trainings; in between each target fits only the link chosen last."""
    from training_server.worker import LINK_CHOICE_EVERY

    store, registry, worker = parts
    real = trainer_mod.train_models
    seen: list[tuple[dict, dict]] = []

    def observed(*args, **kw):  # records what each training was asked to fit, and what it chose
        result = real(*args, **kw)
        seen.append(({t: tuple(v) for t, v in kw["config"].auto_links.items()},
                     {t: b["link"] for t, b in result.base.items() if t in result.models}))
        return result

    monkeypatch.setattr(trainer_mod, "train_models", observed)
    worker.tolerance = 10.0  # every candidate is published: this test is about what gets fitted
    full = {t: tuple(v) for t, v in worker.config.auto_links.items()}
    chunk = 400
    for i in range(LINK_CHOICE_EVERY + 1):
        store.submit(rows(ENTRIES[i * chunk:(i + 1) * chunk])).result(10)
        assert worker.run_once().outcome in ("published", "rejected")
    assert len(seen) == LINK_CHOICE_EVERY + 1
    asked, chosen = seen[0]
    assert asked == full and chosen  # the first training chooses among every link
    for asked_next, _ in seen[1:LINK_CHOICE_EVERY]:
        for t, link in chosen.items():  # then reuses its choice
            assert asked_next[t] == (link,)
    assert seen[LINK_CHOICE_EVERY][0] == full  # and chooses again


def test_worse_candidate_is_not_published_and_no_retrain_without_data(parts, tmp_path):
    store, registry, worker = parts
    assert worker.run_once().outcome == "skipped"  # empty store
    store.submit(rows(ENTRIES[:3000])).result(10)
    first = worker.run_once()
    assert first.outcome == "published", first.reason
    v1 = registry.served.version
    assert registry.is_learned and registry.served.manifest.to_json()["trained_on"]["max_row_id"] == 3000
    # no new data: nothing is trained, nothing republished
    cycles = worker.cycles
    assert worker.run_once().outcome == "skipped" and worker.cycles == cycles
    # new data, but a crippled candidate (one stump of the mean, no calibration: a p90 constant
    # would be a fair TPOT model on this steady trace): refused
    store.submit(rows(ENTRIES[3000:])).result(10)
    worker.config = TrainConfig(params={"n_estimators": 1, "max_depth": 1}, calibrate=False, objective="mean")
    bad = worker.run_once()
    assert bad.outcome == "rejected" and "ttft" in bad.reason and "tpot" in bad.reason
    assert registry.served.version == v1 and len(list_bundles(registry.root)) == 1
    assert bad.candidate["ttft"]["pinball"] > bad.served["ttft"]["pinball"]
    # a restarted worker remembers what the served bundle was trained on
    fresh = RetrainWorker(store, registry, TrainingMetrics(), config=TrainConfig(), interval=1, min_new=1000,
                          max_per_bucket=5000, tolerance=0.02)
    assert fresh.new_samples == 400 and fresh.run_once().outcome == "skipped"
    # a replaced (empty) store under the same bundles: its ids start again, so does the count
    other = SampleStore(tmp_path / "other.sqlite3", max_rows=1000, queue_size=1000, test_ratio=0.1).open()
    try:
        other.submit(rows(ENTRIES[:10])).result(10)
        again = RetrainWorker(other, registry, TrainingMetrics(), config=TrainConfig(), interval=1, min_new=5,
                              max_per_bucket=5000, tolerance=0.02)
        assert again.trained_max_id == 0 and again.new_samples == 10
    finally:
        other.close()


def test_live_drift_lowers_the_retrain_threshold(parts):
    store, registry, worker = parts
    store.submit(rows(ENTRIES[:3000])).result(10)
    assert worker.run_once().outcome == "published"
    store.submit(rows(ENTRIES[3000:3030])).result(10)  # 30 new rows < min_new 100
    assert worker.run_once().outcome == "skipped"
    worker.feedback.observe({"ttft": [(100.0, 120.0)] * 150})  # covered: no drift
    assert worker.run_once().outcome == "skipped"
    worker.feedback.observe({"ttft": [(100.0, 50.0)] * 150})  # 50% live coverage at p90: drift
    assert worker.threshold() == (25, "live drift on ttft")
    assert worker.run_once().outcome in ("published", "rejected")
    assert worker.run_once().outcome == "skipped"  # still never without new data


def test_failures_are_counted_and_the_loop_survives(parts):
    store, registry, worker = parts
    store.submit(rows(ENTRIES[:3000])).result(10)

    def boom(phase):
        if phase == "train":
            raise RuntimeError("injected")

    worker.on_phase = boom
    report = worker.run_once()
    assert report.outcome == "failed" and worker.failures == 1 and "injected" in report.reason
    worker.on_phase = None
    assert worker.run_once().outcome == "skipped"  # a failed cycle does not retry without new data
    store.submit(rows(ENTRIES[3000:])).result(10)
    worker.start()  # the background loop picks up the new data
    deadline = time.monotonic() + 30
    while not registry.is_learned and time.monotonic() < deadline:
        time.sleep(0.05)
    assert registry.is_learned


def test_shutdown_does_not_wait_for_a_long_training(parts):
    store, registry, worker = parts
    store.submit(rows(ENTRIES)).result(10)
    worker.config = TrainConfig(params={"n_estimators": 200_000})
    started = threading.Event()
    worker.on_phase = lambda phase: started.set() if phase == "train" else None
    worker.interval = 0.01
    worker.start()
    assert started.wait(10)
    time.sleep(0.3)
    # 200,000 rounds take many minutes: the worker ending at all, with the outcome "stopped",
    # witnesses that the fit was interrupted (60 s is a hang guard, not a speed bound)
    assert worker.stop(timeout=60.0)
    assert worker.last.outcome == "stopped" and not registry.is_learned


def test_bundle_endpoints_end_to_end(tmp_path):
    settings = Settings.from_env({}, data_dir=str(tmp_path / "a"), retraining_interval_sec=0.2,
                                 bundles_keep=2)
    with run_app(create_app(settings)) as url, httpx.Client(base_url=url, timeout=30) as c:
        assert c.get("/readyz").status_code == 503  # never ready on the prior
        assert c.get("/v1/bundles/latest").status_code == 404
        assert c.get("/model/export").status_code == 404
        r = c.post("/add_training_data_bulk", json={"entries": ENTRIES})  # one commit: one training
        assert r.status_code == 202 and r.json()["accepted"] == len(ENTRIES)
        deadline = time.monotonic() + 60
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, c.get("/data/status").json()
            time.sleep(0.1)
        r = c.get("/v1/bundles/latest")
        assert r.status_code == 200
        manifest = validate_manifest(r.json())
        version = manifest["version"]
        assert r.headers["etag"] == f'"{version}"'
        assert manifest["model_kind"] == "xgboost" and set(manifest["models"]) == {"ttft", "tpot"}
        assert manifest["metrics"]["ttft"]["n"] > 100 and 0 < manifest["metrics"]["tpot"]["coverage"] <= 100
        # conditional GET
        assert c.get("/v1/bundles/latest", headers={"If-None-Match": f'"{version}"'}).status_code == 304
        assert c.get("/v1/bundles/latest", headers={"If-None-Match": '"v000000-20200101T000000Z"'}).status_code == 200
        # files verify against the manifest
        for spec in manifest["models"].values():
            f = c.get(f"/v1/bundles/{version}/{spec['file']}")
            assert f.status_code == 200
            verify_file(f.content, spec)
            assert hashlib.sha256(f.content).hexdigest() == spec["sha256"]
        # wrong names and traversal attempts
        for path in (f"/v1/bundles/{version}/nope.ubj", f"/v1/bundles/{version}/manifest.json",
                     "/v1/bundles/v999999-20261202T000000Z/ttft.ubj", f"/v1/bundles/{version}/..%2F..%2Fsamples.sqlite3",
                     "/v1/bundles/..%2F..%2F/samples.sqlite3", f"/v1/bundles/{version}/%2Fetc%2Fpasswd",
                     "/v1/bundles/latest/ttft.ubj", f"/v1/bundles/{version}/TTFT.UBJ"):
            assert c.get(path).status_code == 404, path
        # other views of the same model
        assert c.get("/model/ttft/xgb/json").json()["learner"]["feature_names"]
        info = c.get("/model/download/info").json()
        assert info["model_status"] == {"ttft": True, "tpot": True} and info["model_type"] == "xgboost"
        assert c.get("/model/tpot/info").json()["file"]["sha256"] == manifest["models"]["tpot"]["sha256"]
        assert c.get("/model/nope/info").status_code == 404
        p = c.post("/predict", json=ENTRIES[0]).json()
        assert p["model_version"] == version and p["model_source"] == "learned" and p["ttft_ms"] > 0
        metrics = c.get("/metrics").text
        assert 'latency_training_heldout_pinball_ms{regime="all",target="ttft"}' in metrics
        assert 'latency_training_heldout_coverage_percent{regime="all",target="tpot"}' in metrics
        assert f'latency_training_served_bundle{{source="learned",version="{version}"}} 1.0' in metrics
        # no new data: no retrain, no new bundle, while the worker keeps checking
        cycles = c.get("/data/status").json()["retrain_cycles"]
        skips = retrain_skips(c)
        deadline = time.monotonic() + 30
        while retrain_skips(c) < skips + 3:
            assert time.monotonic() < deadline, "the retrain worker stopped checking"
            time.sleep(0.1)
        status = c.get("/data/status").json()
        assert status["retrain_cycles"] == cycles and status["served_version"] == version
        export = c.get("/model/export").json()
    # the export seeds a new deployment, which is ready at once
    seed = write_export_dir(export, tmp_path / "seed")
    s2 = Settings.from_env({}, data_dir=str(tmp_path / "b"), seed_bundle=str(seed))
    with run_app(create_app(s2)) as url, httpx.Client(base_url=url) as c:
        assert c.get("/readyz").status_code == 200
        m2 = c.get("/v1/bundles/latest").json()
        assert m2["models"] == manifest["models"] and m2["metrics"] == manifest["metrics"]
        assert "trained_on" not in m2 and m2["seeded_from"]["version"] == version
        # its own (empty) store's data will retrain it: 100 new samples are enough
        assert c.get("/data/status").json()["new_samples_since_last_training"] == 0
        assert c.post("/add_training_data_bulk", json={"entries": ENTRIES[:150]}).json()["accepted"] == 150
        assert c.get("/data/status").json()["new_samples_since_last_training"] == 150
        assert c.post("/predict", json=ENTRIES[0]).json()["ttft_ms"] == pytest.approx(p["ttft_ms"])


def test_a_losing_target_without_a_served_model_keeps_the_served_prior(parts):
    from features.prior import DEFAULT_PRIOR
    from features.loaded import LoadedBundle

    _, _, worker = parts
    raw = np.array([parse_training_entry(e).raw for e in ENTRIES])
    y = {t: np.array([e[f"actual_{t}_ms"] for e in ENTRIES], dtype=float) for t in ("ttft", "tpot")}
    result = trainer_mod.train_models(raw, y["ttft"], y["tpot"], config=TrainConfig(params={"n_estimators": 20}))
    assert worker._compose(result, ["ttft"], LoadedBundle.builtin_prior()) == ["ttft"]
    composed = result
    assert set(composed.models) == {"tpot"} and "ttft" not in composed.calibration
    assert composed.prior["ttft"] == DEFAULT_PRIOR["ttft"]
    bundle = trainer_mod.loaded_bundle(composed)
    assert bundle.source == "learned" and not bundle.has_model("ttft")
    np.testing.assert_allclose(bundle.predict(raw[:50])[0], LoadedBundle.builtin_prior().predict(raw[:50])[0])


def test_the_first_learned_bundle_publishes_the_targets_that_beat_the_prior(parts):
    """TTFT learned from the recorded trace beats the built-in prior; TPOT is set to exactly
    what the built-in prior predicts, so no learned model can beat it on held-out rows. The
    first bundle goes out with the learned TTFT and keeps serving the prior for TPOT."""
    from features.loaded import LoadedBundle
    from features.prior import DEFAULT_PRIOR

    store, registry, worker = parts
    prior = LoadedBundle.builtin_prior()
    entries = [dict(e) for e in ENTRIES[:3000]]
    raw = np.array([parse_training_entry(e).raw for e in entries])
    for e, tpot in zip(entries, prior.predict(raw)[1]):
        e["actual_tpot_ms"] = float(tpot)
    store.submit(rows(entries)).result(10)
    report = worker.run_once()
    assert report.outcome == "published", report.reason
    assert "kept served tpot" in report.reason, report.reason
    assert report.candidate["ttft"]["pinball"] < report.served["ttft"]["pinball"]
    assert report.served["tpot"]["pinball"] == 0.0
    served = registry.served
    assert served.source == "learned" and served.has_model("ttft") and not served.has_model("tpot")
    m = served.manifest.to_json()
    assert set(m["models"]) == {"ttft"} and set(m.get("calibration", {})) <= {"ttft"}
    assert m["prior"]["tpot"] == DEFAULT_PRIOR["tpot"] and m["mode"] == "streaming"
    ttft, tpot = served.predict(raw[:200])
    np.testing.assert_allclose(tpot, prior.predict(raw[:200])[1])  # TPOT: still the prior
    assert not np.allclose(ttft, prior.predict(raw[:200])[0])  # TTFT: the learned model


def test_a_losing_target_keeps_a_served_base_alone(parts):
    """The served TTFT is a base alone (no model file); a candidate whose TTFT loses keeps it,
    base and calibration, in the new bundle."""
    import json

    from features.manifest import Manifest

    _, registry, worker = parts
    raw = np.array([parse_training_entry(e).raw for e in ENTRIES])
    y = {t: np.array([e[f"actual_{t}_ms"] for e in ENTRIES], dtype=float) for t in ("ttft", "tpot")}
    cfg = TrainConfig(params={"n_estimators": 20}, base_alone={})
    first = trainer_mod.train_models(raw[:1500], y["ttft"][:1500], y["tpot"][:1500], config=cfg)
    manifest, files = trainer_mod.build_bundle(first, registry.next_version())
    obj = json.loads(json.dumps(manifest.to_json()))
    obj["models"].pop("ttft")
    obj["base"]["ttft"]["link"] = "add"
    served = registry.publish(Manifest.from_json(obj), {k: v for k, v in files.items() if k.startswith("tpot")})
    assert served.source == "learned" and served.manifest.base_only("ttft")
    result = trainer_mod.train_models(raw, y["ttft"], y["tpot"], config=cfg)
    assert worker._compose(result, ["ttft"], registry.served) == ["ttft"]
    composed = result
    assert "ttft" not in composed.models and composed.targets == ("ttft", "tpot")
    assert composed.base["ttft"] == obj["base"]["ttft"] and composed.calibration["ttft"] == obj["calibration"]["ttft"]
    bundle = trainer_mod.loaded_bundle(composed)
    np.testing.assert_allclose(bundle.predict(raw[:50])[0], served.predict(raw[:50])[0])


def test_a_losing_target_whose_served_model_cannot_travel_keeps_the_candidates_model(parts):
    """The served bundle was trained for another quantile (the configuration changed across a
    restart): its TTFT model cannot go into a bundle of this configuration, so a losing TTFT
    keeps the candidate's model instead of falling back to the prior."""
    from features.loaded import LoadedBundle

    _, registry, worker = parts
    raw = np.array([parse_training_entry(e).raw for e in ENTRIES])
    y = {t: np.array([e[f"actual_{t}_ms"] for e in ENTRIES], dtype=float) for t in ("ttft", "tpot")}
    old = trainer_mod.train_models(raw[:1500], y["ttft"][:1500], y["tpot"][:1500],
                                   config=TrainConfig(params={"n_estimators": 20}, quantile=0.5))
    registry.publish(*trainer_mod.build_bundle(old, registry.next_version()))
    assert registry.served.source == "learned" and registry.served.quantile == 0.5
    result = trainer_mod.train_models(raw, y["ttft"], y["tpot"], config=TrainConfig(params={"n_estimators": 20}))
    ttft_model = result.models["ttft"]
    assert worker._compose(result, ["ttft"], registry.served) == []
    assert result.models["ttft"] is ttft_model and set(result.models) == {"ttft", "tpot"}
    bundle = trainer_mod.loaded_bundle(result)
    assert bundle.has_model("ttft") and bundle.quantile == 0.9
    assert not np.allclose(bundle.predict(raw[:50])[0], LoadedBundle.builtin_prior().predict(raw[:50])[0])


def test_seed_from_an_export_document_file_and_tampering_refused(parts, tmp_path):
    import base64
    import json

    from features.bundle import BundleError

    store, registry, worker = parts
    store.submit(rows(ENTRIES)).result(10)
    assert worker.run_once().outcome == "published"
    doc = registry.export()
    path = tmp_path / "export.json"
    path.write_text(json.dumps(doc))
    seeded = Registry(tmp_path / "seeded", keep=2)
    bundle = seeded.load(path)
    assert bundle.source == "learned" and seeded.versions() == [bundle.version]
    np.testing.assert_allclose(bundle.predict(np.zeros((1, 11)))[1], registry.served.predict(np.zeros((1, 11)))[1])
    name = next(iter(doc["files"]))
    bad = {**doc, "files": {**doc["files"], name: base64.b64encode(b"not a model").decode()}}
    path.write_text(json.dumps(bad))
    with pytest.raises(BundleError):
        Registry(tmp_path / "refused", keep=2).load(path)


def test_e2e_data_whose_ttft_is_answered_by_the_base_alone_is_published(tmp_path):
    """E2E traffic (TTFT only) whose newest rows the line answers best: the candidate has no
    model file at all, only TTFT's base; the worker publishes it (it is a learned target), not
    "no target had rows"."""
    from features.schema import TrainingEntry

    rng = np.random.default_rng(5)
    n = 1500
    wait = rng.poisson(1 + 20 * np.linspace(0, 1, n))
    prompt = rng.integers(100, 4000, n)
    ttft = 40 + 0.2 * prompt + 150 * wait + rng.exponential(30, n)
    base = np.zeros(11)
    entries = []
    for i in range(n):
        raw = base.copy()
        raw[1], raw[2], raw[3] = prompt[i], wait[i], 4
        entries.append(TrainingEntry(tuple(raw), float(ttft[i]), 0.0, 1e9 + i))
    store = SampleStore(tmp_path / "s.sqlite3", max_rows=100_000, queue_size=100_000, test_ratio=0.1).open()
    cfg = TrainConfig(params={"n_estimators": 20}, auto_links={"ttft": ("beyond", "add"), "tpot": ("add",)})
    worker = RetrainWorker(store, Registry(tmp_path / "bundles", keep=3), TrainingMetrics(), config=cfg,
                           interval=0.1, min_new=100, max_per_bucket=5000, tolerance=0.02)
    try:
        store.submit(entries_to_rows(entries)).result(10)
        report = worker.run_once()
        assert report.outcome == "published", report.reason
        served = worker.registry.served
        assert served.source == "learned" and served.manifest.base_only("ttft") and not served.has_model("tpot")
    finally:
        worker.stop()
        store.close()
