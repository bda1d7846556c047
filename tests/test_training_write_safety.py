"""Safe defaults of the training server's write endpoints, on a real loopback server:
bodies count only when declared ``application/json`` (a cross-site ``text/plain`` or form
POST must not flush the store), and ``/flush`` needs the token, or, when none is
configured, a caller on loopback."""
from __future__ import annotations

import httpx
import pytest

from conftest import training_entry
from training_server.app import create_app
from training_server.settings import Settings
from support.servers import run_app

TOKEN = "flush-token-123"
FLUSH_ALL = b'{"flush_training_data": true, "flush_test_data": true}'
#: a peer that is not on loopback, as the server sees it behind a trusted local proxy
#: (uvicorn honours X-Forwarded-For from 127.0.0.1 only)
REMOTE = {"X-Forwarded-For": "203.0.113.7"}


def _server(tmp_path, token: str | None):
    settings = Settings.from_env({}, data_dir=str(tmp_path), api_token=token, retraining_interval_sec=60)
    return create_app(settings, run_worker=False)


@pytest.fixture
def open_server(tmp_path):
    """No token configured (the default), 40 rows stored."""
    app = _server(tmp_path, None)
    with run_app(app) as url, httpx.Client(base_url=url, timeout=20) as c:
        assert c.post("/add_training_data_bulk", json={"entries": [training_entry(i) for i in range(40)]}
                      ).status_code == 202
        yield c, app.state.service


@pytest.mark.parametrize("ctype", [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "application/jsonp", "application/json; charset=latin-1"])
def test_a_body_not_declared_json_is_415_and_changes_nothing(open_server, ctype):
    c, svc = open_server
    headers = {} if ctype is None else {"Content-Type": ctype}
    r = c.post("/flush", content=FLUSH_ALL, headers=headers)
    assert r.status_code == 415, r.text
    assert (ctype.split(";")[0] if ctype else "Content-Type missing") in r.json()["detail"]
    assert svc.store.rows == 40
    body = b'{"entries": [%s]}' % httpx.Request("POST", "/", json=training_entry(99)).content
    r = c.post("/add_training_data_bulk", content=body, headers=headers)
    assert r.status_code == 415 and svc.store.rows == 40
    assert c.post("/predict", content=httpx.Request("POST", "/", json=training_entry(1)).content,
                  headers=headers).status_code == 415


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=utf-8",
                                   "Application/JSON;charset=UTF-8"])
def test_a_body_declared_json_is_taken(open_server, ctype):
    c, svc = open_server
    r = c.post("/flush", content=FLUSH_ALL, headers={"Content-Type": ctype})
    assert r.status_code == 200, r.text
    assert r.json()["stored_rows"] == 0 and svc.store.rows == 0


def test_flush_without_a_token_is_refused_off_loopback(open_server):
    c, svc = open_server
    r = c.post("/flush", content=FLUSH_ALL, headers={"Content-Type": "application/json", **REMOTE})
    assert r.status_code == 403, r.text
    assert "loopback" in r.json()["detail"] and "LATENCY_API_TOKEN" in r.json()["detail"]
    assert svc.store.rows == 40
    # ingestion is not a destructive operation: still open without a token
    assert c.post("/add_training_data_bulk", json={"entries": [training_entry(7)]}, headers=REMOTE).status_code == 202
    # the same flush from loopback goes through
    assert c.post("/flush", content=FLUSH_ALL, headers={"Content-Type": "application/json"}).status_code == 200
    assert svc.store.rows == 0


def test_flush_with_a_token_needs_it_from_anywhere(tmp_path):
    app = _server(tmp_path, TOKEN)
    with run_app(app) as url, httpx.Client(base_url=url, timeout=20) as c:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert c.post("/add_training_data_bulk", json={"entries": [training_entry(i) for i in range(5)]},
                      headers=auth).status_code == 202
        json_type = {"Content-Type": "application/json"}
        assert c.post("/flush", content=FLUSH_ALL, headers=json_type).status_code == 401  # loopback, no token
        assert c.post("/flush", content=FLUSH_ALL, headers={**json_type, **REMOTE}).status_code == 401
        assert app.state.service.store.rows == 5
        assert c.post("/flush", content=FLUSH_ALL, headers={**json_type, **REMOTE, **auth}).status_code == 200
        assert app.state.service.store.rows == 0
