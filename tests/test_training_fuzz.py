"""Fuzz every operation of the training server's OpenAPI schema (bounded): never a 5xx.

A real server (uvicorn on loopback, real SQLite store) with a bundle already trained from
the recorded H200 trace, so model endpoints have something to serve. /flush is left out:
it would wipe the data other examples rely on (it is covered by the API tests).

Deeply nested JSON goes to every operation that takes a body (found in the schema, so a
new endpoint is covered without editing this file): always a 422 naming the nesting.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from conftest import SHAREGPT, load_jsonl, training_entry
from support.servers import run_app
from training_server.app import create_app
from training_server.settings import Settings


def _settings(data_dir: str) -> Settings:
    return Settings.from_env({}, data_dir=data_dir, max_body_bytes=512 * 1024, retraining_interval_sec=0.5)


with tempfile.TemporaryDirectory() as _d:
    schema = schemathesis.openapi.from_dict(create_app(_settings(_d), run_worker=False).openapi())


@pytest.fixture(scope="module")
def base_url():
    with tempfile.TemporaryDirectory() as d:
        with run_app(create_app(_settings(d))) as url:
            entries = load_jsonl(SHAREGPT)
            with httpx.Client(timeout=30) as c:
                for i in range(0, len(entries), 500):
                    assert c.post(url + "/add_training_data_bulk", json={"entries": entries[i:i + 500]}).status_code == 202
                import time
                deadline = time.monotonic() + 60
                while c.get(url + "/readyz").status_code != 200:
                    assert time.monotonic() < deadline, "no learned bundle was published"
                    time.sleep(0.3)
            yield url


@schema.exclude(path="/flush").parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_error(case, base_url):
    response = case.call(base_url=base_url)
    case.validate_response(response, checks=[not_a_server_error])


# ---- deep nesting on every endpoint that takes a body ------------------------------------

BODY_PATHS = sorted(path for path, ops in schema.raw_schema["paths"].items()
                    for op in ops.values() if isinstance(op, dict) and "requestBody" in op)
DEPTHS = (252, 1025, 10_000)


def _deep_bodies(depth: int) -> dict[str, bytes]:
    arr = b"[" * depth + b"]" * depth
    obj = b'{"a":' * depth + b"1" + b"}" * depth
    one = orjson.dumps(training_entry(0))[:-1]  # a valid entry, still open
    return {
        "array": arr, "object": obj,
        "entries_item": b'{"entries": [' + arr + b"]}",
        "entry_field": b'{"entries": [' + one + b', "num_request_waiting": ' + arr + b"}]}",
        "entry_extra": b'{"entries": [' + one + b', "extra": ' + obj + b"}]}",
        "top_extra": b'{"entries": [], "flush_metrics": false, "x": ' + arr + b"}",
        "row_extra": one + b', "x": ' + obj + b"}",
    }


@pytest.fixture(scope="module")
def deep_server():
    with tempfile.TemporaryDirectory() as d:
        app = create_app(Settings.from_env({}, data_dir=d, max_body_bytes=8 << 20), run_worker=False)
        with run_app(app) as url, httpx.Client(base_url=url, timeout=30) as c:
            assert c.post("/add_training_data_bulk", json={"entries": [training_entry(i) for i in range(30)]}
                          ).status_code == 202
            yield c, app.state.service


def test_the_schema_lists_the_body_endpoints():
    assert {"/add_training_data_bulk", "/flush", "/predict"} <= set(BODY_PATHS)


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("path", BODY_PATHS)
def test_deep_nesting_is_a_clear_422_on_every_body_endpoint(deep_server, path, depth):
    c, svc = deep_server
    for shape, body in _deep_bodies(depth).items():
        r = c.post(path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (shape, r.status_code, r.text[:300])
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["body"] and "nested deeper than" in detail["msg"], (shape, detail)
    assert svc.store.rows == 30  # nothing stored, nothing flushed


def test_deep_nesting_inside_a_large_bulk_body_is_a_422(deep_server):
    """A body big enough to be parsed slice by slice, one deep entry among valid ones."""
    c, svc = deep_server
    entries = [orjson.dumps(training_entry(i)) for i in range(20_000)]
    entries[12_345] = entries[12_345][:-1] + b', "extra": ' + b"[" * 300 + b"]" * 300 + b"}"
    body = b'{"entries": [' + b",".join(entries) + b"]}"
    assert len(body) > 4 << 20
    r = c.post("/add_training_data_bulk", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "nested deeper than" in r.json()["detail"][0]["msg"], r.text[:300]
    assert svc.store.rows == 30
