"""Run the gateway with one of the harness's routing policies (a subprocess of the harness).

    python -m load.real_engine.gateway_policy --policy llmd-default|llmd-token-load|predicted|predicted-llmd \\
        --endpoints URL,URL --port P --prediction-urls URL --training-url URL

Every policy runs a streaming predicted-latency producer, so every request is predicted
(for the accuracy report) and trains the predictor; only ``predicted`` (the recommended
profile, well-known config ``predicted-latency-recommended``) and ``predicted-llmd`` (llm-d's
``predicted-latency-slo``) route on the predictions. The schedulers are built here, in code
or from YAML, and served by the same Gateway object as ``latency-predictor gateway``.
"""
from __future__ import annotations

import argparse
import logging
import os

from epp_client.framework.loader import build_scheduler
from epp_client.framework.profile import SchedulingProfile
from epp_client.framework.scheduler import Scheduler
from epp_client.plugins import InFlightTokenScorer, MaxScorePicker, PredictedLatencyProducer, PrefixCacheAffinityFilter
from epp_client.plugins.producer.inflight_load import InFlightTracker
from epp_client.predictor import PredictorClient
from epp_client.training import TrainingReporter
from gateway.app import build_app
from gateway.core import Gateway
from gateway.settings import GatewaySettings

POLICIES = ("llmd-default", "llmd-token-load", "predicted", "predicted-llmd")
#: what the harness runs unless told otherwise
DEFAULT_POLICIES = POLICIES[:3]
#: policy -> well-known config (epp_client.profiles)
PREDICTED_CONFIGS = {"predicted": "predicted-latency-recommended", "predicted-llmd": "predicted-latency-slo"}

#: llm-d's default profile (queue 2, KV 2, prefix 3, max-score picker) plus a streaming
#: producer that only predicts and records (no plugin of the profile reads predictions).
LLMD_DEFAULT_CONFIG = """\
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: max-score-picker}
"""


def build_router(policy: str, prediction_urls: list[str], training_url: str) -> Scheduler:
    predictor = PredictorClient(prediction_urls)
    reporter = TrainingReporter(training_url)
    if policy == "llmd-default":
        sched = build_scheduler(LLMD_DEFAULT_CONFIG, predictor=predictor, sink=reporter)
    elif policy == "llmd-token-load":
        producer = PredictedLatencyProducer(predictor, reporter, streaming_mode=True)
        profile = SchedulingProfile("default", [PrefixCacheAffinityFilter(affinity_threshold=0.8)],
                                    [(InFlightTokenScorer(), 1.0)], MaxScorePicker())
        sched = Scheduler(producer, [], [profile], InFlightTracker())
    elif policy in PREDICTED_CONFIGS:
        sched = build_scheduler(PREDICTED_CONFIGS[policy], predictor=predictor, sink=reporter)
    else:
        raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
    return sched


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m load.real_engine.gateway_policy")
    ap.add_argument("--policy", required=True, choices=POLICIES)
    ap.add_argument("--endpoints", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prediction-urls", required=True)
    ap.add_argument("--training-url", required=True)
    a = ap.parse_args(argv)
    settings = GatewaySettings(endpoints=a.endpoints.split(","), port=a.port,
                               prediction_urls=a.prediction_urls.split(","), training_url=a.training_url,
                               scrape_interval_s=0.1, admin_token=os.environ.get("LATENCY_GATEWAY_ADMIN_TOKEN"))
    logging.basicConfig(level="WARNING")
    import uvicorn

    gw = Gateway(settings, build_router(a.policy, settings.prediction_urls, a.training_url))
    uvicorn.run(build_app(gw), host="127.0.0.1", port=a.port, log_level="warning", timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
