"""plugins/scorer/decode_harm.py: ``1 / (1 + count)`` of the decode-harm count, 0 without a prediction."""
from __future__ import annotations

import pytest

from epp_client import Endpoint
from epp_client.engine.twin import Running
from epp_client.plugins.scorer.decode_harm import DecodeHarmScorer
from support.harm import FLAT, harm_request, running_endpoint


def test_scorer_is_one_over_one_plus_the_count_and_zero_without_a_prediction():
    # three running requests at 10 ms a token against a 10.2 ms SLO: a 4,096-token prefill pushes all three over
    mixed = [running_endpoint("a", [Running(1_000.0, 101, 10.2, 3_000)] * 3), running_endpoint("b", []),
             Endpoint(name="c")]
    assert DecodeHarmScorer.from_config(FLAT).score(harm_request(tpot_slo=20), mixed) == {
        "a": pytest.approx(0.25), "b": 1.0, "c": 0.0}
