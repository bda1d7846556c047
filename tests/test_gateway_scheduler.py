"""Gateway + epp_client scheduler + the real prediction and training servers (subprocesses
on loopback) + the fake engine: training samples, admission denials, prediction fallback."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from epp_client.profiles import PREDICTED_LATENCY_SLO_CONFIG
from fake_engine import ADMIN_TOKEN, FakeEngine, ServerThread, admin_get, engines, free_port  # noqa: F401 (fixture)
from gateway.app import build_app
from gateway.core import Gateway
from gateway.routing import build_scheduler
from gateway.settings import GatewaySettings
from load.ports import free_ports

ADMITTER_CONFIG = PREDICTED_LATENCY_SLO_CONFIG  # includes latency-slo-admitter


def _spawn(args: list[str], port: int, tmp: Path, name: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", LATENCY_LOG_LEVEL="warning")
    log = open(tmp / f"{name}.log", "wb")
    p = subprocess.Popen([sys.executable, "-m", *args], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited: {(tmp / f'{name}.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return p
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    p.kill()
    raise RuntimeError(f"{name} did not start")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("servers")
    tport = free_ports(2)
    pport = tport + 1
    train = _spawn(["training_server", "--port", str(tport), "--data-dir", str(tmp / "data")], tport, tmp, "training")
    # no bundle source: the prediction server answers with the built-in prior at once
    pred = _spawn(["prediction_server", "--port", str(pport), "--training-server-url", ""], pport, tmp, "prediction")
    yield {"training": f"http://127.0.0.1:{tport}", "prediction": f"http://127.0.0.1:{pport}",
           "db": tmp / "data" / "samples.sqlite3", "tmp": tmp}
    for p in (pred, train):
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def start(tmp: Path, urls, config: str, prediction_urls, training_url, **kw):
    cfg = tmp / f"epp-{free_port()}.yaml"
    cfg.write_text(config)
    kw.setdefault("scrape_interval_s", 0.05)
    kw.setdefault("admin_token", ADMIN_TOKEN)
    s = GatewaySettings(endpoints=urls, port=free_port(), config=str(cfg),
                        prediction_urls=prediction_urls, training_url=training_url, **kw)
    router = build_scheduler(s)
    gw = Gateway(s, router)
    return gw, ServerThread(build_app(gw), s.port).start()


def db_rows(db: Path, since_id: int = 0) -> list[dict]:
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM samples WHERE id > ? ORDER BY id", (since_id,))]
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def wait_rows(db: Path, since_id: int, n_ttft: int, n_tpot: int, timeout: float = 15) -> list[dict]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        rows = db_rows(db, since_id)
        if (sum(r["actual_ttft_ms"] > 0 for r in rows) >= n_ttft
                and sum(r["actual_tpot_ms"] > 0 for r in rows) >= n_tpot):
            return rows
        time.sleep(0.2)
    return db_rows(db, since_id)


def max_id(db: Path) -> int:
    rows = db_rows(db)
    return rows[-1]["id"] if rows else 0


def test_ttft_tpot_samples_reach_training_server_with_right_values(servers, engines):
    eng = engines[0]
    eng.state.first_token_delay, eng.state.token_delay = 0.25, 0.05
    eng.state.kv_cache_usage, eng.state.waiting = 0.3, 2
    start_id = max_id(servers["db"])
    gw, srv = start(servers["tmp"], [eng.url], PREDICTED_LATENCY_SLO_CONFIG, [servers["prediction"]],
                    servers["training"])
    try:
        prompt = "a question about routing " * 20
        for _ in range(3):
            r = httpx.post(srv.url + "/v1/completions", timeout=10,
                           json={"prompt": prompt, "max_tokens": 6, "stream": True},
                           headers={"x-llm-d-slo-ttft-ms": "5000", "x-llm-d-slo-tpot-ms": "500"})
            assert r.status_code == 200
        recs = list(gw.records)
        assert len(recs) == 3 and all(r.ok and not r.fallback for r in recs)
        rows = wait_rows(servers["db"], start_id, 3, 3)
        ttft_rows = [r for r in rows if r["actual_ttft_ms"] > 0]
        tpot_rows = [r for r in rows if r["actual_tpot_ms"] > 0]
        assert len(ttft_rows) == 3 and len(tpot_rows) == 3
        for row, rec in zip(ttft_rows, recs):
            assert row["actual_tpot_ms"] == 0
            assert abs(row["actual_ttft_ms"] - rec.ttft_ms) <= 1.0  # truncated to whole ms
            assert 240 <= row["actual_ttft_ms"] < 600
            assert row["predicted_ttft_ms"] == pytest.approx(rec.predicted_ttft_ms, rel=1e-6)
            assert row["predicted_ttft_ms"] > 0 and row["model_version"] == rec.model_version
            assert row["input_token_length"] == rec.input_tokens
            assert row["kv_cache_percentage"] == pytest.approx(0.3)
            assert row["num_request_waiting"] == 2
            assert row["num_tokens_generated"] == 0
        for row, rec in zip(tpot_rows, recs):
            assert row["actual_ttft_ms"] == 0
            assert abs(row["actual_tpot_ms"] - rec.tpot_ms) <= 1.0
            assert 45 <= row["actual_tpot_ms"] < 150
            assert row["predicted_tpot_ms"] == pytest.approx(rec.predicted_tpot_ms, rel=1e-6)
        # the in-flight accounting was released
        assert gw.router.inflight.tracked_requests() == 0
    finally:
        srv.stop()


def test_denied_admission_is_429_with_the_reason(servers, engines):
    for e in engines:  # neither idle nor cold: the admitter may shed
        e.state.kv_cache_usage, e.state.running = 0.5, 3
    gw, srv = start(servers["tmp"], [e.url for e in engines], ADMITTER_CONFIG, [servers["prediction"]],
                    servers["training"], objectives={"batch": -1})
    try:
        deadline = time.monotonic() + 10  # the gateway scraped the engines' load
        while not all(e["running"] == 3 and e["kv_cache_usage"] == 0.5
                      for e in admin_get(srv.url, "/gateway/endpoints").json()):
            assert time.monotonic() < deadline, admin_get(srv.url, "/gateway/endpoints").json()
            time.sleep(0.05)
        impossible = {"x-llm-d-slo-ttft-ms": "0.001", "x-llm-d-slo-tpot-ms": "0.001"}
        body = {"prompt": "hello", "max_tokens": 2, "stream": True}
        r = httpx.post(srv.url + "/v1/completions", json=body, headers={**impossible, "x-llm-d-priority": "-1"})
        assert r.status_code == 429
        assert "no valid endpoint" in r.json()["error"]["message"]
        assert sum(len(e.state.received) for e in engines) == 0
        # priority from the InferenceObjective named in the header
        r = httpx.post(srv.url + "/v1/completions", json=body,
                       headers={**impossible, "x-llm-d-inference-objective": "batch"})
        assert r.status_code == 429
        # the same SLO on a non-sheddable request is served
        assert httpx.post(srv.url + "/v1/completions", json=body, headers=impossible).status_code == 200
        m = httpx.get(srv.url + "/metrics").text
        assert "latency_gateway_admission_denied_total" in m
        assert 'no valid endpoint available to serve the request"} 2.0' in m
    finally:
        srv.stop()


def test_fallback_when_prediction_servers_are_down(servers, engines):
    for e in engines:  # > 1 ms: the producer truncates TTFT to whole ms and skips 0
        e.state.first_token_delay = 0.05
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    start_id = max_id(servers["db"])
    gw, srv = start(servers["tmp"], [e.url for e in engines], ADMITTER_CONFIG, dead, servers["training"])
    try:
        for i in range(4):
            r = httpx.post(srv.url + "/v1/completions", timeout=10,
                           json={"prompt": f"q{i}", "max_tokens": 3, "stream": True},
                           headers={"x-llm-d-slo-ttft-ms": "100", "x-llm-d-slo-tpot-ms": "50",
                                    "x-llm-d-priority": "-1"})  # fail-open admission too
            assert r.status_code == 200
        # the dead servers refused at once: no prediction call waited out its deadline
        failures = gw.router.producer.predictor.metrics.failures
        assert failures and "timeout" not in failures, failures
        assert all(rec.fallback and rec.predicted_ttft_ms is None for rec in gw.records)
        m = httpx.get(srv.url + "/metrics").text
        assert 'latency_gateway_fallbacks_total{reason="no-predictions"} 4.0' in m
        # training goes on without predictions
        rows = wait_rows(servers["db"], start_id, 4, 0)
        assert len([r for r in rows if r["actual_ttft_ms"] > 0]) >= 4
        assert all(r["predicted_ttft_ms"] == 0 for r in rows)
    finally:
        srv.stop()


def test_retry_with_scheduler_moves_the_accounting(servers, engines):
    bad, good = engines
    bad.state.mode = "error503"
    bad.state.kv_cache_usage = 0.0  # make the broken one attractive
    good.state.kv_cache_usage = 0.9
    gw, srv = start(servers["tmp"], [bad.url, good.url], "", [servers["prediction"]], servers["training"],
                    scrape_interval_s=30)  # default llm-d profile, no producer
    try:
        for i in range(4):
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": f"p{i}", "max_tokens": 2})
            assert r.status_code == 200 and r.headers["x-engine"] == "b"
        assert len(bad.state.received) >= 1  # it was picked and failed before the first byte
        assert gw.router.inflight.tracked_requests() == 0
        assert all(ld.requests == 0 for ld in gw.router.inflight._loads.values())
    finally:
        srv.stop()


LORA_HISTORY_CONFIG = """
plugins:
- type: lora-affinity-scorer
  parameters: {requestHistory: true}
- type: kv-cache-utilization-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: lora-affinity-scorer
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: max-score-picker
"""


def test_lora_request_history_through_the_gateway_lifecycle(servers, engines):
    """The gateway drives the scorer's history: a failed first attempt moves the count to the
    retried endpoint, the count is there while the request runs, and completion releases it."""
    import threading

    bad, good = engines
    bad.state.mode = "error503"
    bad.state.kv_cache_usage = 0.0  # the broken one looks best to the KV scorer
    good.state.kv_cache_usage = 0.9
    good.state.first_token_delay = 1.0
    gw, srv = start(servers["tmp"], [bad.url, good.url], LORA_HISTORY_CONFIG, [servers["prediction"]],
                    servers["training"], scrape_interval_s=30)
    try:
        scorer = gw.router.lifecycle_plugins[0]
        bad_name, good_name = (e.name for e in gw.endpoints)
        out = {}
        body = {"model": "sql-lora", "prompt": "p", "max_tokens": 2}
        t = threading.Thread(target=lambda: out.setdefault("r", httpx.post(srv.url + "/v1/completions", json=body,
                                                                            timeout=30)))
        t.start()
        seen = 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not seen:
            seen = scorer.history.count(good_name, "sql-lora")
            time.sleep(0.01)
        assert seen == 1 and scorer.history.count(bad_name, "sql-lora") == 0  # moved by the retry
        t.join(30)
        assert out["r"].status_code == 200 and out["r"].headers["x-engine"] == "b" and len(bad.state.received) >= 1
        assert scorer.history.count(good_name, "sql-lora") == 0 and scorer.history.adapters(bad_name) == frozenset()
    finally:
        srv.stop()
