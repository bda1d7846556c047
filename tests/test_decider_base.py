"""epp_client.plugins.decider.base: every P/D decider counts its answers in ``decisions``."""
from __future__ import annotations

from epp_client import Endpoint, InferenceRequest
from epp_client.plugins.decider.base import DeciderBase


def test_answers_are_counted_and_candidates_default_to_empty():
    seen = []

    class Long(DeciderBase):
        def _decide(self, request, endpoint, candidates):
            seen.append(candidates)
            return request.input_tokens > 100

    d = Long()
    assert d.disaggregate(InferenceRequest(input_tokens=500), Endpoint(name="a"))
    assert not d.disaggregate(InferenceRequest(input_tokens=5), None, [Endpoint(name="b")])
    assert d.disaggregate(InferenceRequest(input_tokens=101), None)
    assert d.decisions == {"yes": 2, "no": 1} and seen[0] == [] and seen[1][0].name == "b"
