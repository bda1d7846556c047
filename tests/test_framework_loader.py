"""epp_client.framework.loader: an EndpointPickerConfig (B2.8) becomes a Scheduler; defaults,
the implicit profile, and errors naming the parameter."""
from __future__ import annotations

import random

import pytest

from epp_client import ConfigError, InferenceRequest
from epp_client.framework.loader import build_scheduler
from epp_client.framework.profile import SchedulingProfile
from epp_client.framework.scheduler import Scheduler
from epp_client.plugins import (
    LatencyScorer,
    LatencySloAdmitter,
    MaxScorePicker,
    PredictedLatencyProducer,
    PrefixCacheAffinityFilter,
    SloHeadroomTierFilter,
    WeightedRandomPicker,
)
from epp_client.plugins.producer.inflight_load import InFlightTracker
from epp_client.profiles import PREDICTED_LATENCY_SLO_CONFIG, REFERENCE_CONFIG
from epp_client.training import ListSink
from support.scheduling import cluster, prior_predictor, ref


def test_reference_wiring_loads_as_it_is():
    s = ref()
    assert isinstance(s.producer, PredictedLatencyProducer) and not s.producer.streaming_mode
    (prof,) = s.profiles
    assert [type(f).__name__ for f in prof.filters] == ["PrefixCacheAffinityFilter", "SloHeadroomTierFilter",
                                                        "PrefixCacheAffinityFilter"]
    strict, _, loose = prof.filters
    assert (strict.affinity_threshold, strict.ttft_source, strict.max_ttft_penalty_ms) == (
        0.99, "latencyPredictor", 5000)
    assert loose.affinity_threshold == 0.80
    assert [(type(sc).__name__, w) for sc, w in prof.scorers] == [("LatencyScorer", 1.0)]
    assert isinstance(prof.picker, WeightedRandomPicker)
    assert [type(a).__name__ for a in s.admitters] == ["LatencySloAdmitter"]
    slo = ref(config=PREDICTED_LATENCY_SLO_CONFIG)
    assert slo.producer.streaming_mode
    assert slo.profiles[0].filters[0].ttft_source == "prefillThroughput"
    assert slo.profiles[0].filters[0].max_ttft_penalty_ms == 18000


def test_default_profile_without_config():
    s = build_scheduler(None)
    (prof,) = s.profiles
    assert [(type(sc).__name__, w) for sc, w in prof.scorers] == [
        ("QueueScorer", 2.0), ("KVCacheUtilizationScorer", 2.0), ("PrefixCacheScorer", 3.0)]
    assert isinstance(prof.picker, MaxScorePicker)
    res = s.schedule(InferenceRequest(), cluster())
    assert res.picked[0].name == "pod0-rank-0"


@pytest.mark.parametrize("config,bad", [
    ("plugins: [{type: no-such-plugin}]", "plugins[0].type"),
    ("plugins: [{type: latency-scorer, parameters: {ttftWeight: fast}}]", "plugins[0].parameters.ttftWeight"),
    ("plugins: [{type: prefix-cache-affinity-filter, parameters: {affinityThreshold: 2}}]",
     "plugins[0].parameters.affinityThreshold"),
    ("plugins: [{type: latency-scorer, color: red}]", "plugins[0].color"),
    ("plugins: [{type: latency-scorer}, {type: latency-scorer}]", "plugins[1].name"),
    ("plugins: [{type: latency-scorer}]\nschedulingProfiles: [{name: p, plugins: [{pluginRef: nope}]}]",
     "schedulingProfiles[0].plugins[0].pluginRef"),
    ("plugins: [{type: latency-scorer}]\nschedulingProfiles: [{name: p, plugins: [{pluginRef: latency-scorer, "
     "weight: heavy}]}]", "schedulingProfiles[0].plugins[0].weight"),
    ("plugins: [{type: max-score-picker}, {type: random-picker}]\nschedulingProfiles: [{name: p, plugins: "
     "[{pluginRef: max-score-picker}, {pluginRef: random-picker}]}]", "schedulingProfiles[0].plugins[1].pluginRef"),
    ("plugins: [{type: predicted-latency-producer, name: a}, {type: predicted-latency-producer, name: b}]", "plugins"),
    ("plugin: []", "plugin"),
    ("plugins: [unclosed", "config"),
    ("[1, 2]", "config"),
])
def test_invalid_configs_name_the_parameter(config, bad):
    with pytest.raises(ConfigError) as ei:
        build_scheduler(config)
    assert ei.value.param == bad


def test_config_defaults_picker_and_implicit_profile():
    cfg = {"plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"},
                       {"name": "wr", "type": "weighted-random-picker", "parameters": {"maxNumOfEndpoints": 2}},
                       {"type": "single-profile-handler"}],
           "schedulingProfiles": [{"name": "a", "plugins": [{"pluginRef": "queue-scorer", "weight": 3}]}]}
    s = build_scheduler(cfg, rng=random.Random(1))
    assert s.profiles[0].picker.max_num_of_endpoints == 2  # first configured picker
    assert len(s.schedule(InferenceRequest(), cluster()).picked) == 2
    implicit = build_scheduler({"plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}]})
    assert [type(sc).__name__ for sc, _ in implicit.profiles[0].scorers] == ["QueueScorer", "KVCacheUtilizationScorer"]
    assert isinstance(implicit.profiles[0].picker, MaxScorePicker)


def test_python_composition_equals_config():
    rng1, rng2 = random.Random(5), random.Random(5)
    pred = prior_predictor()
    by_hand = Scheduler(
        producer=PredictedLatencyProducer(pred, ListSink()), admitters=[LatencySloAdmitter()],
        profiles=SchedulingProfile("default", [
            PrefixCacheAffinityFilter(0.99, ttft_source="latencyPredictor", max_ttft_penalty_ms=5000, rng=rng1),
            SloHeadroomTierFilter(rng=rng1),
            PrefixCacheAffinityFilter(0.80, ttft_source="latencyPredictor", max_ttft_penalty_ms=5000, rng=rng1)],
            [(LatencyScorer(), 1.0)], WeightedRandomPicker(rng=rng1)), inflight=InFlightTracker())
    from_cfg = build_scheduler(REFERENCE_CONFIG, predictor=pred, sink=ListSink(), rng=rng2)
    eps = cluster()
    for i in range(50):
        h = {"x-llm-d-slo-ttft-ms": str(300 + 20 * i)}
        a = by_hand.schedule(InferenceRequest(request_id=f"r{i}", headers=h, input_tokens=500), eps)
        b = from_cfg.schedule(InferenceRequest(request_id=f"r{i}", headers=h, input_tokens=500), eps)
        assert a.picked[0].name == b.picked[0].name and a.scores == b.scores
