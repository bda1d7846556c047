"""A P/D config, pool, scheduler and request for the disaggregation tests."""
from __future__ import annotations

import random

from epp_client import Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.framework.loader import build_scheduler
from epp_client.framework.scheduler import Scheduler

ROLE = "llm-d.ai/role"


def pd_config(decider: str | None = "prefix-based-pd-decider", decider_params: dict | None = None,
              stage_order: str | None = None, producer: bool = False) -> dict:
    plugins = [{"type": "decode-filter"}, {"type": "prefill-filter"}, {"type": "queue-scorer"},
               {"type": "max-score-picker"}]
    handler: dict = {"type": "disagg-profile-handler", "parameters": {}}
    if decider is not None:
        plugins.append({"type": decider, "parameters": decider_params or {}})
        handler["parameters"]["deciders"] = {"prefill": decider}
    if stage_order is not None:
        handler["parameters"]["stageOrder"] = stage_order
    plugins.append(handler)
    if producer:
        plugins.insert(0, {"type": "predicted-latency-producer",
                           "parameters": {"endpointRoleLabel": ROLE, "streamingMode": True}})
    return {"plugins": plugins, "schedulingProfiles": [
        {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}, {"pluginRef": "queue-scorer"}]},
        {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"}, {"pluginRef": "queue-scorer"}]}]}


def pool(decode_cached_blocks: int = 0, prefill_roles=("prefill",), decode_queue=(0, 3)) -> list[Endpoint]:
    eps = [Endpoint(name=f"d{i}", address=f"10.0.1.{i}", port=8000, labels={ROLE: "decode"},
                    metrics=EndpointMetrics(waiting_queue_size=q, running_requests_size=q),
                    prefix_match=PrefixMatch(decode_cached_blocks, 100, 16)) for i, q in enumerate(decode_queue)]
    eps += [Endpoint(name=f"p{i}", address=f"10.0.2.{i}", port=8200, labels={ROLE: r},
                     metrics=EndpointMetrics(waiting_queue_size=i), prefix_match=PrefixMatch(0, 100, 16))
            for i, r in enumerate(prefill_roles)]
    return eps


def sched(config: dict, **kw) -> Scheduler:
    return build_scheduler(config, rng=random.Random(3), **kw)


def req(tokens: int, **headers) -> InferenceRequest:
    return InferenceRequest(input_tokens=tokens, headers=dict(headers))


# -- role filters -----------------------------------------------------------------------
ROLES = ["decode", "prefill", "encode", "prefill-decode", "encode-prefill", "encode-prefill-decode", "both", None]
