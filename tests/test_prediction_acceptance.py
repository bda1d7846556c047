"""What a prediction server agrees to serve: forged manifest numbers refused, the smoke
test in every load regime, never a prior-only bundle over a learned model, lineages
(a restarted training server's new lineage is taken, a downgrade within one never), and
no credentials in /status.

Bundles are real XGBoost bundles served by tests/support/servers.BundleServer (a real
HTTP server on loopback) or read from a real local directory; the prediction server is
the real app on loopback, driven with POST /reload.
"""
from __future__ import annotations

import json
import math
import shutil
import time
import uuid
from pathlib import Path

import httpx
import pytest

from features.bundle import MANIFEST, BundleError, list_bundles, make_version, validate_manifest
from features.matrix import REGIME_NAMES
from prediction_server.app import create_app
from load.demo_bundle import build_bundle
from prediction_server.settings import Settings
from support.servers import BundleServer, run_app

ROWS = [{"kv_cache_percentage": kv, "input_token_length": 300, "num_request_waiting": w, "num_request_running": 3,
         "num_tokens_generated": 5, "prefix_cache_score": 0.1} for kv in (0.2, 0.95) for w in (0, 4)]


def lineage(created_at: float | None = None) -> dict:
    return {"id": uuid.uuid4().hex, "created_at": time.time() if created_at is None else created_at}


def next_second() -> None:
    """Versions name their second of creation (and are the ETag): two stores' v000001
    built in the same second would be the same ETag, which a real restart never gives."""
    time.sleep(1.0 - time.time() % 1.0 + 0.01)


def forge(root: Path, seq: int, edit) -> str:
    """Copy the newest bundle of ``root`` as version ``seq`` and let ``edit`` change its
    manifest (written as Python's json writes it: NaN and Infinity literals included)."""
    src = list_bundles(root)[-1]
    dst = root / make_version(seq)
    shutil.copytree(src, dst)
    m = json.loads((dst / MANIFEST).read_text())
    m["version"] = dst.name
    edit(m)
    (dst / MANIFEST).write_text(json.dumps(m))
    return dst.name


def status(c: httpx.Client) -> dict:
    return c.get("/status").json()


def predictions_are_finite(c: httpx.Client, version: str) -> None:
    r = c.post("/predict/bulk/strict", json={"requests": ROWS})
    assert r.status_code == 200
    for p in r.json()["predictions"]:
        assert p["model_version"] == version
        for k in ("ttft_ms", "tpot_ms", "ttft_uncertainty", "tpot_uncertainty"):
            assert isinstance(p[k], float) and math.isfinite(p[k]), (k, p)
        assert all(isinstance(b, float) for b in p["ttft_prediction_bounds"] + p["tpot_prediction_bounds"])


@pytest.fixture
def served(tmp_path):
    """(registry root, BundleServer, client) of a prediction server driven by /reload,
    serving v000001 (no lineage) from the registry."""
    root = tmp_path / "registry"
    build_bundle(root, 1, "xgboost", rounds=40)
    bs = BundleServer(root)
    settings = Settings.from_env({}, training_server_url=bs.url, sync_interval_sec=3600, sync_timeout_sec=5)
    try:
        with run_app(create_app(settings)) as url, httpx.Client(base_url=url, timeout=30) as c:
            r = c.post("/reload").json()
            assert r["served_version"].startswith("v000001-")
            yield root, bs, c
    finally:
        bs.stop()


def _cal(target: str, **regime_values) -> callable:
    def edit(m: dict) -> None:
        m.setdefault("calibration", {})[target] = {"offset_ms": 0.0, "scale": 1.0,
                                                   "by_regime": {r: {"offset_ms": 0.0, "scale": 1.0}
                                                                 for r in REGIME_NAMES}}
        for regime, (key, value) in regime_values.items():
            m["calibration"][target]["by_regime"][regime][key] = value
    return edit


FORGED_OVER_HTTP = {
    "scale 1e308": (lambda m: m.setdefault("calibration", {}).update(ttft={"offset_ms": 0.0, "scale": 1e308}),
                    "calibration.ttft.scale"),
    "regime scale 1e308": (_cal("tpot", queued_highkv=("scale", 1e308)), "calibration.tpot.by_regime.queued_highkv.scale"),
    "regime offset 1e300": (_cal("ttft", idle_highkv=("offset_ms", 1e300)),
                            "calibration.ttft.by_regime.idle_highkv.offset_ms"),
    "residual spread 1e308": (lambda m: m["metrics"]["tpot"].update(residual_std=1e308), "metrics.tpot.residual_std"),
    "negative residual spread": (lambda m: m["metrics"]["ttft"].update(residual_std=-1.0), "metrics.ttft.residual_std"),
    "prior coefficient 1e300": (lambda m: m["prior"]["ttft"]["coef"].update(num_request_waiting=1e300),
                                "prior.ttft.coef.num_request_waiting"),
    "unknown regime": (lambda m: m.setdefault("calibration", {}).update(
        ttft={"offset_ms": 0.0, "scale": 1.0, "by_regime": {"busy": {"offset_ms": 1.0, "scale": 1.0}}}),
        "calibration.ttft.by_regime.busy"),
}


@pytest.mark.parametrize("name", list(FORGED_OVER_HTTP))
def test_forged_manifest_number_refused_last_good_kept(served, name):
    root, bs, c = served
    v1 = status(c)["model_version"]
    edit, key = FORGED_OVER_HTTP[name]
    forge(root, 2, edit)
    r = c.post("/reload")
    assert r.status_code == 502
    body = r.json()
    assert body["reason"] == "bad_manifest" and key in body["error"] and body["served_version"] == v1
    assert not any(p.startswith("/v1/bundles/v000002-") for p in bs.requests)  # refused unread
    predictions_are_finite(c, v1)
    assert 'latency_prediction_sync_failures_total{reason="bad_manifest"} 1.0' in c.get("/metrics").text


@pytest.mark.parametrize("edit,key", [
    (_cal("ttft", queued_lowkv=("offset_ms", float("nan"))), "calibration.ttft.by_regime.queued_lowkv.offset_ms"),
    (lambda m: m["metrics"]["ttft"].update(residual_std=float("inf")), "metrics.ttft.residual_std"),
    (lambda m: m["training"]["tpot"].update(n_train=float("-inf")), "training.tpot.n_train"),
], ids=["nan regime offset", "infinite residual spread", "infinite number anywhere"])
def test_non_finite_manifest_numbers_refused_from_a_directory(tmp_path, edit, key):
    """NaN and Infinity cannot cross HTTP (the JSON parser refuses them) but a manifest
    file on a shared volume can hold them."""
    root = tmp_path / "volume"
    build_bundle(root, 1, "xgboost")
    settings = Settings.from_env({}, training_server_url="", bundle_dir=str(root), sync_interval_sec=3600)
    with run_app(create_app(settings)) as url, httpx.Client(base_url=url, timeout=30) as c:
        v1 = status(c)["model_version"]
        assert v1.startswith("v000001-")
        forge(root, 2, edit)
        body = c.post("/reload").json()
        assert body["result"] == "failed" and body["reason"] == "local_dir" and key in body["error"]
        assert body["served_version"] == v1
        predictions_are_finite(c, v1)


@pytest.mark.parametrize("regime", REGIME_NAMES)
def test_smoke_test_covers_every_load_regime(served, regime):
    """In-range numbers that zero out the predictions of one regime only: the bundle is
    refused whichever regime it is (a probe row of idle_lowkv alone would pass 3 of 4)."""
    root, bs, c = served
    v1 = status(c)["model_version"]
    forge(root, 2, _cal("tpot", **{regime: ("offset_ms", -1e6)}))
    body = c.post("/reload").json()
    assert body["reason"] == "load_error" and f"tpot prediction 0.0 in regime {regime}" in body["error"]
    predictions_are_finite(c, v1)


def test_prior_only_bundle_never_replaces_a_learned_model(served):
    root, bs, c = served
    v1 = status(c)["model_version"]
    build_bundle(root, 7, "prior", lineage=lineage())  # higher version AND a lineage
    body = c.post("/reload").json()
    assert body["result"] == "unchanged" and body["served_version"] == v1
    assert c.get("/readyz").status_code == 200 and status(c)["model_source"] == "learned"
    assert c.post("/reload").json()["result"] == "unchanged"
    build_bundle(root, 8, "xgboost", rounds=41)  # a learned bundle after it is still taken
    assert c.post("/reload").json()["version"].startswith("v000008-")


def test_prior_only_bundle_replaces_the_built_in_prior(tmp_path):
    root = tmp_path / "registry"
    build_bundle(root, 1, "prior")
    bs = BundleServer(root)
    settings = Settings.from_env({}, training_server_url=bs.url, sync_interval_sec=3600)
    try:
        with run_app(create_app(settings)) as url, httpx.Client(base_url=url, timeout=30) as c:
            assert c.post("/reload").json()["served_version"].startswith("v000001-")
            assert status(c)["model_source"] == "prior" and c.get("/readyz").status_code == 503
    finally:
        bs.stop()


def test_lineages(served, tmp_path):
    """No lineage -> a lineage; within a lineage only upward; a newer lineage wins whatever
    its version (a training server restarted on an empty data dir); an older one never."""
    root, bs, c = served
    old = lineage(time.time() - 3600)
    # served v000001 has no lineage: a bundle with one is taken even at the same version
    next_second()
    a = build_bundle(tmp_path / "a", 1, "xgboost", rounds=41, lineage=old).name
    bs.root = tmp_path / "a"
    assert c.post("/reload").json()["version"] == a
    # same lineage: a huge version is taken, then nothing lower
    big = build_bundle(tmp_path / "a", 999_999, "xgboost", rounds=40, lineage=old).name
    assert c.post("/reload").json()["version"] == big
    bs.latest = a
    assert c.post("/reload").json()["result"] == "unchanged"
    bs.latest = None
    # a legacy bundle without lineage never replaces one with a lineage
    bs.root = root
    build_bundle(root, 1_000_000, "xgboost", rounds=41)
    assert c.post("/reload").json()["result"] == "unchanged" and status(c)["model_version"] == big
    # the training server restarts on an empty store: v000001 of a newer lineage is taken
    new = lineage()
    next_second()
    fresh = build_bundle(tmp_path / "b", 1, "xgboost", rounds=41, lineage=new).name
    bs.root = tmp_path / "b"
    assert c.post("/reload").json()["version"] == fresh
    predictions_are_finite(c, fresh)
    # the old lineage's store comes back with its huge versions: refused
    bs.root = tmp_path / "a"
    build_bundle(tmp_path / "a", 1_000_000, "xgboost", rounds=40, lineage=old)
    assert c.post("/reload").json()["result"] == "unchanged" and status(c)["model_version"] == fresh
    # same lineage id, next version: taken
    bs.root = tmp_path / "b"
    v2 = build_bundle(tmp_path / "b", 2, "xgboost", rounds=40, lineage=new).name
    assert c.post("/reload").json()["version"] == v2


def test_newer_lineage_taken_from_a_directory(tmp_path):
    root = tmp_path / "volume"
    old, new = lineage(time.time() - 60), lineage()
    build_bundle(root, 5, "xgboost", lineage=old)
    settings = Settings.from_env({}, training_server_url="", bundle_dir=str(root), sync_interval_sec=3600)
    with run_app(create_app(settings)) as url, httpx.Client(base_url=url, timeout=30) as c:
        assert status(c)["model_version"].startswith("v000005-")
        fresh = build_bundle(root, 1, "xgboost", rounds=41, lineage=new).name  # beside the old one
        assert c.post("/reload").json()["version"] == fresh
        build_bundle(root, 6, "xgboost", rounds=40, lineage=old)  # the old lineage goes on: ignored
        assert c.post("/reload").json()["result"] == "unchanged" and status(c)["model_version"] == fresh


@pytest.mark.parametrize("bad,msg", [
    ({"id": "not-hex!", "created_at": 1.8e9}, "lineage.id"),
    ({"id": "ab" * 40, "created_at": 1.8e9}, "lineage.id"),
    ({"id": "abcdef12", "created_at": "yesterday"}, "lineage.created_at"),
    ({"id": "abcdef12", "created_at": time.time() + 10 * 86_400}, "lineage.created_at"),
    ({"id": "abcdef12"}, "lineage.created_at"),
    ("abcdef12", "lineage must be an object"),
])
def test_lineage_fields_validated(served, bad, msg):
    root, bs, c = served
    v1 = status(c)["model_version"]
    forge(root, 2, lambda m: m.update(lineage=bad))
    body = c.post("/reload").json()
    assert body["reason"] == "bad_manifest" and msg in body["error"] and body["served_version"] == v1
    with pytest.raises(BundleError, match=msg.split()[0]):
        validate_manifest({**bs.manifest(list_bundles(root)[0].name), "lineage": bad})


def test_status_redacts_training_url_credentials():
    settings = Settings.from_env({}, training_server_url="http://bob:s3cret-pw@127.0.0.1:9", sync_interval_sec=3600,
                                 sync_timeout_sec=0.5)
    with run_app(create_app(settings)) as url, httpx.Client(base_url=url, timeout=30) as c:
        r = c.get("/status")
        assert r.json()["training_server_url"] == "http://***@127.0.0.1:9"
        assert "s3cret" not in r.text and "bob" not in r.text
