"""Endpoints with running requests, a request with SLOs and a flat step model for the decode-harm tests."""
from __future__ import annotations

from epp_client import Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.types import LatencyPrediction

#: a 10 ms step plus 0.01 ms a token (tests/test_twin.py): a full 2,048-token chunk takes 30.48 ms
FLAT = {"stepFixedMs": 10.0, "stepPerTokenMs": 0.01, "stepPerContextTokenMs": 0.0, "stepDecodeMs": 0.0,
        "stepPerPrefillPairMs": 0.0}


def running_endpoint(name, running, matched_blocks=0):
    return Endpoint(name=name, metrics=EndpointMetrics(0.3, 0, len(running)),
                    prefix_match=PrefixMatch(matched_blocks, 64, block_size_tokens=64),
                    prediction=LatencyPrediction(900.0, 40.0, 4_100.0, 60.0, True, True, len(running),
                                                 decoding=lambda: tuple(running)))


def harm_request(tokens=4096, ttft_slo=5000, tpot_slo=100):
    return InferenceRequest(request_id="q", input_tokens=tokens,
                            headers={"x-llm-d-slo-ttft-ms": str(ttft_slo), "x-llm-d-slo-tpot-ms": str(tpot_slo)})
