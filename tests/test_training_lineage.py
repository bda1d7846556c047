"""Bundle lineage: the sample store has an identity (uuid4 hex + creation time) created with
it and kept across restarts, and every manifest the training server publishes (learned,
recalibrated, seeded, prior-only) carries it as ``lineage``. A server restarted on an empty
data dir is a new, newer lineage, so prediction servers can tell its ``v000001`` from an
old one. No manifest or export names a local filesystem path (``seeded_from.path``).
Real SQLite store, real XGBoost training, real HTTP server on loopback."""
from __future__ import annotations

import json
import sqlite3

import httpx
import numpy as np
import pytest

from features.bundle import MANIFEST, list_bundles, make_version, make_lineage, read_bundle, write_bundle, BundleError
from features.matrix import TARGETS, schema_description
from features.prior import DEFAULT_PRIOR
from features.schema import SCHEMA_VERSION, parse_training_entry
from load.demo_bundle import build_bundle
from training_server.app import create_app
from training_server.service import TrainingService
from training_server.registry import Registry
from training_server.settings import Settings
from training_server.store import SampleStore, entries_to_rows
from load.data import load_entries
from support.servers import run_app

ENTRIES = load_entries()


def _store(path):
    return SampleStore(path, max_rows=1000, queue_size=1000, test_ratio=0.1).open()


def _service(data_dir, **settings) -> TrainingService:
    svc = TrainingService(Settings.from_env({}, data_dir=str(data_dir), **settings))
    svc.start(run_worker=False)
    return svc


def _disk_manifests(root) -> list[dict]:
    return [json.loads((p / MANIFEST).read_text()) for p in list_bundles(root)]


def test_the_store_identity_is_kept_across_restarts_and_new_for_an_empty_dir(tmp_path):
    a = _store(tmp_path / "a" / "samples.sqlite3")
    first = (a.store_id, a.created_at)
    a.submit(entries_to_rows([parse_training_entry(e) for e in ENTRIES[:10]])).result(10)
    a.close()
    assert len(first[0]) == 32 and int(first[0], 16) >= 0 and first[1] > 1.7e9
    again = _store(tmp_path / "a" / "samples.sqlite3")
    assert (again.store_id, again.created_at) == first and again.rows == 10
    again.flush(train=True, test=True).result(10)  # emptied, but the same store: same lineage
    again.close()
    assert (_store(tmp_path / "a" / "samples.sqlite3").store_id) == first[0]
    with sqlite3.connect(tmp_path / "a" / "samples.sqlite3") as c:
        assert dict(c.execute("SELECT key, value FROM meta")) == {"store_id": first[0], "created_at": repr(first[1])}
    fresh = _store(tmp_path / "b" / "samples.sqlite3")
    assert fresh.store_id != first[0] and fresh.created_at > first[1]
    fresh.close()


def test_make_lineage_checks_its_fields():
    assert make_lineage("ab" * 16, 1.7e9) == {"id": "ab" * 16, "created_at": 1.7e9}
    for bad in (("xyz", 1.7e9), ("AB" * 16, 1.7e9), ("ab" * 16, 4.0e9), ("ab" * 16, float("nan")), ("ab" * 16, float("inf")),
                ("ab" * 16, -1.0), ("ab" * 16, True), ("ab" * 16, "1.7e9")):
        with pytest.raises(BundleError):
            make_lineage(*bad)


def test_learned_and_recalibrated_manifests_carry_the_lineage_across_a_restart(tmp_path):
    svc = _service(tmp_path)
    try:
        lineage = make_lineage(svc.store.store_id, svc.store.created_at)
        svc.store.submit(entries_to_rows([parse_training_entry(e) for e in ENTRIES])).result(30)
        assert svc.worker.run_once().outcome == "published"
        learned = svc.registry.served
        assert learned.manifest.to_json()["lineage"] == lineage
        # the live correction republishes the served models: the same lineage
        raw = np.array([parse_training_entry(e).raw for e in ENTRIES[:400]])
        pred = dict(zip(TARGETS, learned.predict(raw)))
        pairs = {t: [(2.0 * p, p) for p in pred[t].tolist()] for t in TARGETS}  # servers twice as slow
        report = None
        for _ in range(20):
            svc.feedback.observe(pairs, pairs)
            report = svc.worker.recalibrate()
            if report is not None:
                break
        assert report is not None and report.outcome == "recalibrated"
        assert svc.registry.served.manifest.to_json()["recalibrated"]["from"] == learned.version
        assert svc.registry.served.manifest.to_json()["lineage"] == lineage
    finally:
        svc.stop()
    assert [m["lineage"] for m in _disk_manifests(tmp_path / "bundles")] == [lineage, lineage]
    svc = _service(tmp_path)  # restarted on the same data dir: same lineage, served from disk
    try:
        assert svc.registry.lineage == lineage and svc.registry.served.manifest.to_json()["lineage"] == lineage
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def seed_dir(tmp_path_factory):
    """A learned bundle from elsewhere, as an operator would pass it (LATENCY_SEED_BUNDLE)."""
    return build_bundle(tmp_path_factory.mktemp("operator-home-secret"), 7, rounds=10)


def test_a_seeded_manifest_carries_this_store_lineage_and_no_local_path(tmp_path, seed_dir):
    settings = Settings.from_env({}, data_dir=str(tmp_path / "a"), seed_bundle=str(seed_dir))
    app = create_app(settings)
    with run_app(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        svc = app.state.service
        lineage = make_lineage(svc.store.store_id, svc.store.created_at)
        manifest = c.get("/v1/bundles/latest").json()
        assert manifest["lineage"] == lineage
        assert manifest["seeded_from"] == {"version": seed_dir.name, "lineage": None}
        texts = {path: c.get(path).text for path in ("/v1/bundles/latest", "/model/export", "/models/list",
                                                     "/model/ttft/info", "/model/download/info", "/data/status")}
    for path, text in texts.items():
        assert str(seed_dir.parent) not in text and "operator-home-secret" not in text, path
        assert str(tmp_path) not in text, path
    assert json.loads(texts["/model/export"])["manifest"]["lineage"] == lineage
    # the same seed into a new, empty data dir: another lineage, newer, though the version is the same
    s2 = Settings.from_env({}, data_dir=str(tmp_path / "b"), seed_bundle=str(seed_dir))
    with run_app(create_app(s2)) as url:
        other = httpx.get(url + "/v1/bundles/latest", timeout=30).json()
    assert other["version"].startswith("v000001-") and manifest["version"].startswith("v000001-")
    assert other["lineage"]["id"] != lineage["id"] and other["lineage"]["created_at"] > lineage["created_at"]


def test_a_seed_carries_its_source_lineage_into_seeded_from(tmp_path, seed_dir):
    a = _service(tmp_path / "a", seed_bundle=str(seed_dir))
    try:
        export = a.registry.export()
        source = export["manifest"]["lineage"]
    finally:
        a.stop()
    (tmp_path / "export.json").write_text(json.dumps(export))
    b = _service(tmp_path / "b", seed_bundle=str(tmp_path / "export.json"))
    try:
        m = b.registry.served.manifest.to_json()
        assert m["seeded_from"] == {"version": export["manifest"]["version"], "lineage": source}
        assert m["lineage"] == b.registry.lineage != source
    finally:
        b.stop()


def test_a_prior_only_seed_is_published_with_the_lineage(tmp_path):
    manifest = {"version": make_version(3), "schema_version": SCHEMA_VERSION, "features": schema_description(),
                "model_kind": "prior", "objective": "quantile", "quantile": 0.9, "mode": "streaming",
                "models": {}, "prior": DEFAULT_PRIOR}
    seed = write_bundle(tmp_path / "seed", manifest, {})
    svc = _service(tmp_path / "data", seed_bundle=str(seed))
    try:
        (published,) = _disk_manifests(tmp_path / "data" / "bundles")
        assert published["model_kind"] == "prior" and published["lineage"] == svc.registry.lineage
        assert published["lineage"]["id"] == svc.store.store_id
    finally:
        svc.stop()


def test_a_bundle_written_with_a_seed_path_is_served_without_it(tmp_path, seed_dir):
    """Bundles published before the path was dropped are still on disk: the path is not served."""
    manifest, files = read_bundle(seed_dir)
    manifest["seeded_from"] = {"version": "v000001-20261101T000000Z", "path": "/home/someone/seed"}
    write_bundle(tmp_path / "bundles", manifest, files)
    registry = Registry(tmp_path / "bundles", keep=2)
    served = registry.load()
    assert served.manifest.to_json()["seeded_from"] == {"version": "v000001-20261101T000000Z"}
    assert "/home/someone" not in json.dumps(registry.export())
