"""Fuzz every operation of the prediction server's OpenAPI schema (positive and negative
examples, bounded): never a 5xx, every status documented, every 200 body conforming to its
declared schema. The server is real (uvicorn on loopback) with a real XGBoost bundle."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                 status_code_conformance)

from prediction_server.app import create_app
from prediction_server.demo_bundle import build_bundle
from prediction_server.settings import Settings
from prediction_server.testing import run_app


def _settings(bundle_dir: str | None) -> Settings:
    return Settings.from_env({}, training_server_url="", bundle_dir=bundle_dir, max_batch_rows=50,
                             max_body_bytes=256 * 1024)


# The schema as the app publishes it (building the app starts nothing).
schema = schemathesis.openapi.from_dict(create_app(_settings(None)).openapi())


@pytest.fixture(scope="module")
def base_url():
    with tempfile.TemporaryDirectory() as d:
        build_bundle(Path(d), 1, "xgboost")
        with run_app(create_app(_settings(d))) as url:
            yield url


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_error(case, base_url):
    response = case.call(base_url=base_url)
    case.validate_response(response, checks=[not_a_server_error, status_code_conformance,
                                              content_type_conformance, response_schema_conformance])
