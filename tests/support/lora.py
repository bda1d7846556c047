"""Endpoints showing LoRA adapters for the lora-affinity tests."""
from __future__ import annotations

from epp_client import Endpoint, EndpointMetrics


def ep(name, running=(), waiting=(), max_lora=4):
    return Endpoint(name=name, metrics=EndpointMetrics(active_lora_adapters=frozenset(running),
                                                       waiting_lora_adapters=frozenset(waiting),
                                                       max_active_lora=max_lora))
