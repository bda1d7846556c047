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
from load.demo_bundle import build_bundle
from prediction_server.settings import Settings
from support.servers import run_app


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


# ------------------------------------------------------------------ deep nesting

ROW = {"kv_cache_percentage": 0.5, "input_token_length": 100, "num_request_waiting": 0, "num_request_running": 1,
       "num_tokens_generated": 0, "prefix_cache_score": 0.0}
DEEP = "<deep>"  # placeholder replaced by a nested list of the tested depth


def _cases() -> dict[str, list[tuple[object, list]]]:
    """Per POST endpoint: (body with DEEP somewhere, loc the answer must name). The loc of
    a row-level problem in /predict/bulk is in its errors entry, elsewhere in a 422."""
    return {
        "/predict/bulk": [(DEEP, ["body"]), ({"requests": DEEP}, ["body", "requests", 0]),
                          ({"requests": [ROW, DEEP]}, ["body", "requests", 1]),
                          ({"requests": [{**ROW, "kv_cache_percentage": DEEP}]},
                           ["body", "requests", 0, "kv_cache_percentage"])],
        "/predict/bulk/strict": [(DEEP, ["body"]), ({"requests": DEEP}, ["body", "requests", 0]),
                                 ({"requests": [ROW, DEEP]}, ["body", "requests", 1]),
                                 ({"requests": [{**ROW, "input_token_length": DEEP}]},
                                  ["body", "requests", 0, "input_token_length"])],
        "/predict": [(DEEP, ["body"]), ({**ROW, "num_request_waiting": DEEP}, ["body", "num_request_waiting"])],
        "/v1/whatif": [(DEEP, ["body"]), ({"request": DEEP}, ["body", "request"]),
                       ({"request": ROW, "grid": {"kv_cache_percentage": DEEP}},
                        ["body", "grid", "kv_cache_percentage", 0]),
                       ({"request": ROW, "max_points": DEEP}, ["body", "max_points"])],
        "/reload": [(DEEP, [])],  # takes no body: whatever is sent is not read
    }


def _body(template: object, depth: int) -> bytes:
    import json

    text = json.dumps(template).replace(json.dumps(DEEP), "[" * depth + "]" * depth)
    return text.encode()


def _depth(obj: object) -> int:
    if isinstance(obj, dict):
        return 1 + max(map(_depth, obj.values()), default=0)
    if isinstance(obj, list):
        return 1 + max(map(_depth, obj), default=0)
    return 0


def test_deep_nesting_cases_cover_every_post_endpoint():
    posts = {path for path, ops in schema.raw_schema["paths"].items() if "post" in ops}
    assert posts == set(_cases())


@pytest.mark.parametrize("depth", [252, 1000, 100_000])
def test_deep_nesting_never_a_server_error(base_url, depth):
    """Nested lists 252 (past the JSON encoder's depth), 1000 and 100000 (past the parser's)
    levels deep, in every place of every POST body: a 4xx naming the field, or for a bad
    row of /predict/bulk a per-row error naming it, never a 500 and never an echo of the
    nesting."""
    import httpx

    with httpx.Client(base_url=base_url, timeout=30) as c:
        for path, cases in _cases().items():
            for template, loc in cases:
                r = c.post(path, content=_body(template, depth), headers={"Content-Type": "application/json"})
                where = f"{path} {str(template)[:80]} depth {depth}"
                assert r.status_code < 500, where
                if path == "/reload":
                    assert r.status_code == 200 and r.json()["result"] in ("unchanged", "updated"), where
                    continue
                body = r.json()
                assert _depth(body) < 12, where  # the nesting is never echoed
                if depth > 1024:  # beyond the parser's depth limit: the body as a whole is refused
                    assert r.status_code == 422 and body["detail"][0]["loc"] == ["body"], where
                    assert body["detail"][0]["type"] == "json_invalid", where
                elif r.status_code == 200:
                    assert path == "/predict/bulk" and len(loc) >= 3, where
                    (err,) = body["errors"]
                    assert err["loc"] == loc and err["index"] == loc[2] and body["predictions"][loc[2]] is None, where
                else:
                    assert r.status_code == 422 and body["detail"][0]["loc"] == loc, where
