"""Bundle sync: polling with ETag, atomic swaps, rejection of bad bundles, no downgrade,
the last good bundle kept when the bundle server dies, local-directory mode, /reload token.

The bundle source is tests/support/servers.BundleServer, a real HTTP server on loopback
speaking docs/wire-api.md §2 over a directory of real XGBoost bundles.
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from features.bundle import MANIFEST, list_bundles, make_version, read_bundle
from features.schema import parse_row, row_from_raw
from prediction_server.app import create_app
from load.demo_bundle import build_bundle, load_trace
from features.loaded import LoadedBundle
from prediction_server.service import PredictionService
from prediction_server.settings import Settings
from prediction_server.sync import BundleSync
from support.servers import BundleServer, run_app


def rows(n: int) -> list[dict]:
    raw, _, _ = load_trace()
    return [row_from_raw(raw[(i * 97) % len(raw)]) for i in range(n)]


def version_of(c: httpx.Client) -> str:
    return c.get("/status").json()["model_version"]


def wait_version(c: httpx.Client, prefix: str, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while not version_of(c).startswith(prefix):
        assert time.monotonic() < end, f"never served {prefix}; serving {version_of(c)}"
        time.sleep(0.05)


def sync_attempts(c: httpx.Client, result: str) -> float:
    """Syncs that ended with ``result`` (the poller's and /reload's), from /metrics."""
    prefix = f'latency_prediction_sync_attempts_total{{result="{result}"}} '
    found = [ln for ln in c.get("/metrics").text.splitlines() if ln.startswith(prefix)]
    return float(found[0].split()[-1]) if found else 0.0


def wait_polls(c: httpx.Client, result: str, n: int, timeout: float = 15.0) -> None:
    """Wait until the poller has ended ``n`` more syncs with ``result``: the witness that it
    ran, before a test asserts that nothing changed."""
    target = sync_attempts(c, result) + n
    end = time.monotonic() + timeout
    while sync_attempts(c, result) < target:
        assert time.monotonic() < end, f"the poller did not sync {n} more times ({result})"
        time.sleep(0.05)


def offline(path: Path) -> LoadedBundle:
    return LoadedBundle.from_files(*read_bundle(path))


@pytest.fixture
def remote(tmp_path):
    """(bundle root, BundleServer, client of a prediction server polling it every 0.2 s)."""
    root = tmp_path / "registry"
    build_bundle(root, 1, "xgboost", rounds=40)
    bs = BundleServer(root)
    settings = Settings.from_env({}, training_server_url=bs.url, sync_interval_sec=0.2, sync_timeout_sec=2)
    try:
        with run_app(create_app(settings)) as url, httpx.Client(base_url=url, timeout=10) as c:
            wait_version(c, "v000001-")
            yield root, bs, c
    finally:
        bs.stop()


def test_poll_picks_up_new_bundle_with_etag(remote):
    root, bs, c = remote
    before = c.post("/predict/bulk/strict", json={"requests": rows(8)}).json()["predictions"]
    wait_polls(c, "unchanged", 2)  # several polls of an unchanged registry: 304s, no file downloads
    assert sum(p.startswith("/v1/bundles/v000001-") for p in bs.requests) == 2  # ttft + tpot, once
    path2 = build_bundle(root, 2, "xgboost", rounds=41)
    wait_version(c, "v000002-")
    after = c.post("/predict/bulk/strict", json={"requests": rows(8)}).json()["predictions"]
    assert {p["model_version"] for p in after} == {path2.name}
    expected, _ = offline(path2).predict(np.array([parse_row(r) for r in rows(8)]))
    assert [p["ttft_ms"] for p in after] == expected.tolist()
    assert [p["ttft_ms"] for p in after] != [p["ttft_ms"] for p in before]
    assert 'latency_prediction_bundle_swaps_total 2.0' in c.get("/metrics").text  # v1 then v2


def test_swap_is_atomic_under_load(remote):
    """Requests racing with swaps: each response comes from exactly one bundle, and its
    numbers are that bundle's numbers."""
    root, bs, c = remote
    batch = rows(64)
    raw = np.array([parse_row(r) for r in batch])
    seen: dict[str, set] = {}
    failures: list = []
    stop = threading.Event()

    def hammer() -> None:
        with httpx.Client(base_url=str(c.base_url), timeout=10) as h:
            while not stop.is_set():
                r = h.post("/predict/bulk/strict", json={"requests": batch})
                if r.status_code != 200:
                    failures.append(r.status_code)
                    continue
                preds = r.json()["predictions"]
                versions = {p["model_version"] for p in preds}
                if len(versions) != 1:
                    failures.append(versions)
                seen.setdefault(versions.pop(), set()).add(tuple(p["ttft_ms"] for p in preds))

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for seq in range(2, 6):
            build_bundle(root, seq, "xgboost", rounds=40 + seq % 2)
            wait_version(c, f"v{seq:06d}-")
            end = time.monotonic() + 10
            while not any(v.startswith(f"v{seq:06d}-") for v in list(seen)) and time.monotonic() < end:
                time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    assert len(seen) >= 4
    for version, answers in seen.items():
        expected = tuple(offline(root / version).predict(raw)[0].tolist())
        assert answers == {expected}, version


@pytest.mark.parametrize("fault,reason", [("corrupt", "checksum"), ("truncate", "truncated"),
                                          ("error500", "http_status"), ("bad_json", "bad_json")])
def test_bad_bundle_rejected_old_kept(remote, fault, reason):
    root, bs, c = remote
    v1 = version_of(c)
    bs.fault = fault
    build_bundle(root, 2, "xgboost", rounds=41)
    r = c.post("/reload")
    assert r.status_code == 502
    body = r.json()
    assert body["result"] == "failed" and body["reason"] == reason and body["served_version"] == v1
    assert c.post("/reload").json()["reason"] == reason  # retried, fails again
    assert version_of(c) == v1
    p = c.post("/predict/bulk/strict", json={"requests": rows(2)}).json()["predictions"]
    assert {x["model_version"] for x in p} == {v1} and c.get("/readyz").status_code == 200
    assert f'latency_prediction_sync_failures_total{{reason="{reason}"}}' in c.get("/metrics").text
    failed = [ln for ln in c.get("/metrics").text.splitlines()
              if ln.startswith(f'latency_prediction_sync_failures_total{{reason="{reason}"}}')]
    assert float(failed[0].split()[-1]) >= 2
    bs.fault = None  # publisher fixed: retried and accepted
    wait_version(c, "v000002-")


def test_hung_download_times_out_without_blocking_predictions(remote):
    root, bs, c = remote
    v1 = version_of(c)
    bs.stall_files = True  # the publisher hangs until released: only LATENCY_SYNC_TIMEOUT_SEC=2 ends the sync
    build_bundle(root, 2, "xgboost", rounds=41)
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(c.post("/reload", timeout=30).json()))
    t.start()
    answered = 0
    while t.is_alive():  # the event loop keeps serving while the sync waits on the network
        r = c.post("/predict/bulk/strict", json={"requests": rows(2)}, timeout=1.0)
        assert r.status_code == 200 and r.json()["model_version"] == v1
        answered += 1
        time.sleep(0.05)
    t.join()
    assert answered >= 5 and result["reason"] == "timeout" and result["served_version"] == v1
    assert bs.stalled >= 1  # the sync gave up while the publisher was still stalled, not after it answered
    bs.release_files()


def test_unknown_schema_rejected(remote):
    root, bs, c = remote
    src = list_bundles(root)[-1]
    dst = root / make_version(2)
    shutil.copytree(src, dst)
    m = json.loads((dst / MANIFEST).read_text())
    m.update(version=dst.name, schema_version=99)
    (dst / MANIFEST).write_text(json.dumps(m))
    r = c.post("/reload").json()
    assert r["result"] == "failed" and r["reason"] == "unknown_schema" and "schema_version" in r["error"]
    assert version_of(c).startswith("v000001-")


def test_bundle_server_killed_keeps_serving(remote):
    root, bs, c = remote
    v1 = version_of(c)
    bs.stop()
    r = c.post("/reload")
    assert r.status_code == 502 and r.json()["reason"] == "network"
    wait_polls(c, "failed", 1)  # the poller failed too (it backs off)
    for _ in range(5):
        d = c.post("/predict/bulk/strict", json={"requests": rows(4)})
        assert d.status_code == 200 and d.json()["model_version"] == v1
    assert c.get("/readyz").status_code == 200 and c.get("/status").json()["is_ready"] is True


def test_never_downgrade(remote):
    root, bs, c = remote
    v1 = version_of(c)
    v2 = build_bundle(root, 2, "xgboost", rounds=41).name
    wait_version(c, "v000002-")
    bs.latest = v1  # the registry rolls back (or a stale replica answers)
    r = c.post("/reload").json()
    assert r["result"] == "unchanged" and r["served_version"] == v2
    wait_polls(c, "unchanged", 2)
    assert version_of(c) == v2


def test_local_directory_mode(tmp_path):
    root = tmp_path / "shared-volume"
    root.mkdir()
    settings = Settings.from_env({"LATENCY_BUNDLE_DIR": str(root), "TRAINING_SERVER_URL": "",
                                  "MODEL_SYNC_INTERVAL_SEC": "0.2"})
    with run_app(create_app(settings)) as url, httpx.Client(base_url=url, timeout=10) as c:
        assert version_of(c) == "prior-default" and c.get("/readyz").status_code == 503
        build_bundle(root, 1, "xgboost")
        wait_version(c, "v000001-")
        # a newer bundle with a corrupted file is skipped; the old one is kept
        bad = build_bundle(root, 2, "xgboost", rounds=41)
        f = bad / "ttft.ubj"
        f.write_bytes(b"\0" + f.read_bytes()[1:])
        r = c.post("/reload").json()
        assert r["result"] == "failed" and r["reason"] == "local_dir" and "sha256" in r["error"]
        assert version_of(c).startswith("v000001-")
        # a yet newer good bundle wins; an older one appearing later is ignored
        build_bundle(root, 3, "xgboost", rounds=41)
        wait_version(c, "v000003-")
        shutil.rmtree(bad)
        build_bundle(root, 2, "xgboost", rounds=40)
        assert c.post("/reload").json()["result"] == "unchanged"
        assert version_of(c).startswith("v000003-")


def test_reload_token(tmp_path):
    build_bundle(tmp_path, 1, "xgboost")
    settings = Settings.from_env({"LATENCY_API_TOKEN": "s3cret-token"}, training_server_url="", bundle_dir=str(tmp_path))
    with run_app(create_app(settings)) as url, httpx.Client(base_url=url) as c:
        assert c.post("/reload").status_code == 401
        r = c.post("/reload", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = c.post("/reload", headers={"Authorization": "Bearer s3cret-token"})
        assert r.status_code == 200 and r.json()["result"] in ("updated", "unchanged")
        assert r.json()["served_version"].startswith("v000001-")
        # predictions never need the token
        assert c.post("/predict", json=rows(1)[0]).status_code == 200


def test_reload_without_sources_reports_disabled():
    with run_app(create_app(Settings.from_env({}, training_server_url=""))) as url, httpx.Client(base_url=url) as c:
        r = c.post("/reload")
        assert r.status_code == 200 and r.json()["result"] == "disabled"


def test_backoff_is_bounded(tmp_path):
    settings = Settings.from_env({}, training_server_url="http://127.0.0.1:9", sync_interval_sec=2,
                                 sync_timeout_sec=0.5)
    sync = BundleSync(settings, PredictionService(settings))
    delays = []
    for _ in range(8):
        assert sync.sync_once()["reason"] == "network"  # nothing listens on port 9
        delays.append(sync.next_delay())
    assert delays[:4] == [2, 4, 8, 16] and max(delays) == 16  # doubles, capped at 8 intervals (<= 60 s)
    sync.stop()
