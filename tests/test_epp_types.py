"""The public data types of epp_client (A.1): SLO headers, defaults, data-parallel ranks."""
from __future__ import annotations

from epp_client import (
    Admission,
    Endpoint,
    EndpointMetrics,
    InferenceRequest,
    LatencyPrediction,
    PrefixMatch,
    rank_endpoints,
)


# ---------------------------------------------------------------------------- types
def test_slo_headers_new_name_wins_even_if_invalid_then_alias_then_zero():
    assert InferenceRequest(headers={"x-llm-d-slo-ttft-ms": "250", "x-slo-ttft-ms": "900"}).ttft_slo_ms == 250
    assert InferenceRequest(headers={"x-slo-ttft-ms": "900"}).ttft_slo_ms == 900
    assert InferenceRequest(headers={"x-llm-d-slo-ttft-ms": "abc", "x-slo-ttft-ms": "900"}).ttft_slo_ms == 0
    assert InferenceRequest(headers={"x-llm-d-slo-ttft-ms": ""}).ttft_slo_ms == 0
    assert InferenceRequest(headers={"x-llm-d-slo-tpot-ms": "1e3"}).tpot_slo_ms == 1000
    assert InferenceRequest(headers={"x-slo-tpot-ms": "-5"}).tpot_slo_ms == -5
    assert InferenceRequest().ttft_slo_ms == 0 and InferenceRequest().tpot_slo_ms == 0
    assert InferenceRequest(priority=-1).sheddable and not InferenceRequest(priority=0).sheddable


def test_data_type_defaults_and_prefix_score():
    e = Endpoint()
    assert e.metrics == EndpointMetrics() and e.prediction is None and e.prefix_match is None
    assert EndpointMetrics().max_active_lora == 0 and EndpointMetrics().active_lora_adapters == frozenset()
    assert PrefixMatch(3, 4).score == 0.75 and PrefixMatch(3, 4).block_size_tokens == 16
    assert PrefixMatch(5, 0).score == 0.0  # A.2.7: never +Inf
    assert PrefixMatch(0, 0).score == 0.0
    p = LatencyPrediction(1, 2, 3, 4, True, False)
    assert not p.is_valid and LatencyPrediction(ttft_valid=True, tpot_valid=True).is_valid
    assert p.dispatched_request_count == 0 and p.model_version == ""
    assert Admission(False, "x", 429) != Admission()


def test_data_parallel_rank_endpoints():
    eps = rank_endpoints("vllm-0", "10.0.0.5", [8000, 8001, 8002], labels={"role": "decode"})
    assert [(e.name, e.port, e.rank) for e in eps] == [("vllm-0-rank-0", 8000, 0), ("vllm-0-rank-1", 8001, 1),
                                                         ("vllm-0-rank-2", 8002, 2)]
    assert eps[0].labels == {"role": "decode"} and eps[0].metrics is not eps[1].metrics
    # active-ports annotation: only listed ports that are also target ports
    act = rank_endpoints("p", "h", [8000, 8001, 8002], {"llm-d.ai/active-ports": "8002, 8000,9999"})
    assert [(e.name, e.port) for e in act] == [("p-rank-0", 8000), ("p-rank-2", 8002)]
    legacy = rank_endpoints("p", "h", [8000, 8001], {"inference.networking.k8s.io/active-ports": "8001"})
    assert [e.name for e in legacy] == ["p-rank-1"]
    assert rank_endpoints("p", "h", [8000], {"llm-d.ai/active-ports": ""}) == []
