"""Request bodies of the training server: who may send one (bearer token, loopback),
parsing with a depth limit and slice by slice for large bulk bodies, the in-flight byte budget."""
from __future__ import annotations

import json

import pytest

from training_server import bodies
from training_server.bodies import HTTPProblem, from_loopback


class _Peer:
    def __init__(self, host):
        self.client = None if host is None else type("Addr", (), {"host": host})()


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.5", False), ("203.0.113.7", False), ("::ffff:10.0.0.5", False), ("2001:db8::1", False),
    ("testclient", False), ("", False), (None, False),
])
def test_loopback_is_127_0_0_0_8_or_ipv6_loopback(host, loopback):
    assert from_loopback(_Peer(host)) is loopback


def test_parse_json_names_the_body_for_invalid_or_too_deep_json():
    assert bodies.parse_json(b'{"entries": [{"a": [1, {"b": 2}]}]}') == {"entries": [{"a": [1, {"b": 2}]}]}
    for body, kind in ((b"{nope", "json_invalid"),
                       (b"[" * (bodies.MAX_JSON_DEPTH + 1) + b"]" * (bodies.MAX_JSON_DEPTH + 1), "json_depth")):
        with pytest.raises(HTTPProblem) as e:
            bodies.parse_json(body)
        assert e.value.status == 422 and e.value.detail[0]["loc"] == ["body"] and e.value.detail[0]["type"] == kind


def test_a_large_bulk_body_is_parsed_in_slices_that_give_every_entry_once(monkeypatch):
    monkeypatch.setattr(bodies, "SLICE_BYTES", 64)      # small slices for a small body
    entries = [{"i": i, "s": "},{" * (i % 3), "n": {"x": [i]}} for i in range(40)]
    body = json.dumps({"entries": entries}).encode()
    slices = list(bodies.array_slices(body, "entries"))
    assert len(slices) > 3 and [e for part in slices for e in part] == entries
    assert bodies.parse_bulk(body, lambda parts: [e for part in parts for e in part]) == entries
    with pytest.raises(bodies.NotSplittable):
        list(bodies.array_slices(b'{"other": [1]}', "entries"))


@pytest.mark.parametrize("body, loc, kind", [
    (b"[1, 2]", ["body"], "type_error"),
    (b'{"x": 1}', ["body", "entries"], "missing"),
    (b'{"entries": {}}', ["body", "entries"], "type_error"),
])
def test_a_bulk_body_that_is_not_an_entries_list_is_422_naming_the_field(body, loc, kind):
    with pytest.raises(HTTPProblem) as e:
        bodies.parse_bulk(body, list)
    assert e.value.status == 422 and e.value.detail == [{"loc": loc, "msg": e.value.detail[0]["msg"], "type": kind}]


def test_the_token_is_checked_when_configured_and_flush_is_loopback_only_without_one():
    bodies.check_token(None, None)
    bodies.check_token("s3cret", "Bearer s3cret")
    bodies.check_token("s3cret", "bearer  s3cret ")
    for auth in (None, "Bearer wrong", "s3cret", "Basic s3cret"):
        with pytest.raises(HTTPProblem) as e:
            bodies.check_token("s3cret", auth)
        assert e.value.status == 401 and e.value.headers == {"WWW-Authenticate": "Bearer"}
    bodies.check_flush_access(None, None, loopback=True)
    with pytest.raises(HTTPProblem) as e:
        bodies.check_flush_access(None, None, loopback=False)
    assert e.value.status == 403
    with pytest.raises(HTTPProblem):
        bodies.check_flush_access("s3cret", None, loopback=True)


def test_the_inflight_budget_refuses_what_does_not_fit_and_counts_the_refusal():
    refused = []
    budget = bodies.InflightBytes(100, on_refuse=lambda: refused.append(1))
    assert budget.take(60) and not budget.take(41) and budget.take(40)
    assert budget.used == 100 and refused == [1]
    budget.give(60)
    assert budget.take(50) and budget.used == 90
