"""Fuzz every operation of the training server's OpenAPI schema (bounded): never a 5xx.

A real server (uvicorn on loopback, real SQLite store) with a bundle already trained from
the recorded H200 trace, so model endpoints have something to serve. /flush is left out:
it would wipe the data other examples rely on (it is covered by the API tests).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from conftest import SHAREGPT, load_jsonl
from prediction_server.testing import run_app
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
