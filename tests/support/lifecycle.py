"""A config with the approximate prefix producer, endpoints and requests for the lifecycle tests."""
from __future__ import annotations

from epp_client import Endpoint, EndpointMetrics, InferenceRequest

PREFIX_CONFIG = """
plugins:
- type: approx-prefix-cache-producer
  parameters: {blockSizeTokens: 128, maxPrefixBlocksToMatch: 10, lruCapacityPerServer: 3}
- type: inflight-token-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: inflight-token-scorer
"""


def eps(n=3):
    return [Endpoint(name=f"e{i}", metrics=EndpointMetrics()) for i in range(n)]


def req(i, tokens=100, **kw):
    return InferenceRequest(request_id=f"r{i}", input_tokens=tokens, **kw)
