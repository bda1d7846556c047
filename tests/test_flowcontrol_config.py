"""epp_client.flowcontrol.config: the flowControl config section, the detector by type, errors naming the field."""
from __future__ import annotations

import pytest

from epp_client import ConfigError
from epp_client.flowcontrol.config import build_flow_control, make_detector
from epp_client.flowcontrol.policies import GlobalStrictFairness, RoundRobinFairness
from epp_client.flowcontrol.program_aware import ProgramAwareFairness
from epp_client.flowcontrol.saturation import ConcurrencyDetector, UtilizationDetector
from epp_client.framework.loader import build_scheduler
from support.flow import Clock


def test_make_detector_picks_the_type_and_validates():
    assert isinstance(make_detector(None), UtilizationDetector)
    d = make_detector({"type": "concurrency-detector", "maxConcurrency": 16})
    assert isinstance(d, ConcurrencyDetector) and d.max_concurrency == 16
    assert make_detector({"queueDepthThreshold": 2}).queue_depth_threshold == 2
    with pytest.raises(ConfigError, match="type"):
        make_detector({"type": "nope"})
    with pytest.raises(ConfigError, match="maxConcurrency"):
        make_detector({"maxConcurrency": 4})            # not a utilization-detector parameter


# ---- the flowControl config section ------------------------------------------------------------
CONFIG = """
plugins:
- type: program-aware-fairness
  parameters: {strategy: turn-priority, turnPriorityTimeWeight: 0.25}
- name: sat
  type: utilization-detector
  parameters: {queueDepthThreshold: 3, metricsStalenessThreshold: 1s}
- type: queue-scorer
flowControl:
  maxRequests: 1k
  defaultRequestTTL: 45s
  defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness, maxRequests: 100}
  priorityBands:
  - {priority: 10, fairnessPolicyRef: round-robin-fairness-policy, orderingPolicyRef: fcfs-ordering-policy}
  saturationDetector: {pluginRef: sat}
"""


def test_flow_control_config_section():
    c = Clock()
    fc = build_flow_control(CONFIG, clock=c)
    ctl = fc.controller
    assert ctl.request_ttl_s == 45.0 and ctl.max_requests == 1000
    assert fc.detector.queue_depth_threshold == 3 and fc.detector.metrics_staleness_s == 1.0
    pol = ctl.default_band.policy
    assert isinstance(pol, ProgramAwareFairness) and pol.turn_priority_time_weight == 0.25 and pol.clock is c
    assert ctl.default_band.max_requests == 100
    assert isinstance(ctl.bands[10].policy, RoundRobinFairness) and ctl.bands[10].max_requests == 5000
    build_scheduler(CONFIG)                           # the scheduler builder skips the flow-control plugins
    assert build_flow_control("plugins: []") is None  # off when absent
    plain = build_flow_control("flowControl: {}")
    assert isinstance(plain.controller.default_band.policy, type(None)) and plain.controller.request_ttl_s == 60.0
    assert isinstance(plain.controller._band(0).policy, GlobalStrictFairness)
    assert isinstance(plain.detector, UtilizationDetector)
    conc = build_flow_control("plugins: [{type: concurrency-detector, parameters: {maxConcurrency: 8}}]\n"
                              "flowControl: {}")
    assert isinstance(conc.detector, ConcurrencyDetector) and conc.detector.max_concurrency == 8
    ref = build_flow_control("flowControl: {saturationDetector: {pluginRef: concurrency-detector}}")
    assert isinstance(ref.detector, ConcurrencyDetector) and ref.detector.max_concurrency == 100


@pytest.mark.parametrize("text,where", [
    ("flowControl: {maxBytes: 1Gi}", "flowControl.maxBytes"),
    ("flowControl: {defaultRequestTTL: soon}", "flowControl.defaultRequestTTL"),
    ("flowControl: {defaultPriorityBand: {fairnessPolicyRef: nope}}",
     "flowControl.defaultPriorityBand.fairnessPolicyRef"),
    ("flowControl: {priorityBands: [{fairnessPolicyRef: round-robin-fairness-policy}]}",
     "flowControl.priorityBands[0].priority"),
    ("flowControl: {defaultPriorityBand: {orderingPolicyRef: edf-ordering-policy}}",
     "flowControl.defaultPriorityBand.orderingPolicyRef"),
    ("flowControl: {defaultPriorityBand: {maxRequests: -3}}", "flowControl.defaultPriorityBand.maxRequests"),
    ("plugins: [{type: program-aware-fairness, parameters: {lasHalfLifeSeconds: -1}}]\nflowControl: {}",
     "plugins[0].parameters.lasHalfLifeSeconds"),
    ("plugins: [{type: utilization-detector}]\n"
     "flowControl: {defaultPriorityBand: {fairnessPolicyRef: utilization-detector}}",
     "flowControl.defaultPriorityBand.fairnessPolicyRef"),
    ("plugins: [{type: concurrency-detector, parameters: {concurrencyMode: bytes}}]\nflowControl: {}",
     "plugins[0].parameters.concurrencyMode"),
    ("flowControl: {saturationDetector: {pluginRef: global-strict-fairness-policy}}",
     "flowControl.saturationDetector.pluginRef"),
])
def test_flow_control_config_errors_name_the_field(text, where):
    with pytest.raises(ConfigError) as e:
        build_flow_control(text)
    assert e.value.param == where
