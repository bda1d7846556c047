"""The request lifecycle's shared parts: the scheduling result's views, the request id the
director ensures, and the per-request candidate clones."""
from __future__ import annotations

from epp_client import Endpoint, InferenceRequest, InFlightLoad, LatencyPrediction
from epp_client.framework.lifecycle import ProfileResult, SchedulingResult, candidates_for, ensure_request_id
from epp_client.plugins.producer.inflight_load import InFlightTracker
from epp_client.types import Admission


def _pred(ttft, tpot, version="v7"):
    return LatencyPrediction(ttft, tpot, 0.0, 0.0, True, True, 0, version)


def test_a_result_is_ok_only_with_status_200_and_a_pick_and_held_only_with_a_retry_delay():
    a, b = Endpoint(name="a"), Endpoint(name="b")
    res = SchedulingResult("r", [a], {"a": 1.0}, Admission())
    assert res.ok and res.endpoint is a and not res.held
    assert not SchedulingResult("r", [], {}, Admission()).ok
    assert SchedulingResult("r", [], {}, Admission()).endpoint is None
    held = SchedulingResult("r", [], {}, Admission(), status=429, reason="held", retry_after_s=0.5)
    assert held.held and not held.ok
    assert not SchedulingResult("r", [a], {}, Admission(), status=503).ok
    res.profiles = {"decode": ProfileResult("decode", [a, b], {}), "prefill": ProfileResult("prefill", [], {})}
    assert res.picks == {"decode": a}


def test_predictions_and_model_version_come_from_the_candidates_that_have_one():
    a, b, c = Endpoint(name="a"), Endpoint(name="b"), Endpoint(name="c")
    a.prediction, c.prediction = _pred(120.0, 9.0), _pred(300.0, 30.0)
    res = SchedulingResult("r", [a], {}, Admission(), candidates=[b, a, c])
    assert res.predictions == {"a": (120.0, 9.0), "c": (300.0, 30.0)}
    assert res.model_version == "v7"
    assert SchedulingResult("r", [a], {}, Admission(), candidates=[b]).model_version == ""


def test_the_request_id_is_kept_taken_from_the_header_or_generated_once():
    assert ensure_request_id(InferenceRequest(request_id="mine")) == "mine"
    r = InferenceRequest(headers={"x-request-id": "from-header"})
    assert ensure_request_id(r) == "from-header" and r.request_id == "from-header"
    r = InferenceRequest()
    rid = ensure_request_id(r)
    assert rid and r.headers["x-request-id"] == rid and ensure_request_id(r) == rid


def test_candidates_are_clones_without_prediction_carrying_the_trackers_load():
    tracker = InFlightTracker()
    busy = Endpoint(name="busy")
    tracker.pre_request(InferenceRequest(request_id="s", input_tokens=100), {"default": busy})
    given = Endpoint(name="given", inflight=InFlightLoad(7, 2))
    given.prediction = _pred(1.0, 1.0)
    clones = candidates_for([busy, given], tracker)
    assert [c.name for c in clones] == ["busy", "given"] and clones[0] is not busy
    assert all(c.prediction is None for c in clones) and given.prediction is not None
    assert (clones[0].inflight.tokens, clones[0].inflight.requests) == (100, 1)
    assert (clones[1].inflight.tokens, clones[1].inflight.requests) == (7, 2)   # the caller's own load kept
    assert busy.inflight is None
    assert candidates_for([busy], None)[0].inflight is None
