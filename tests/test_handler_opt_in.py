"""Per-request opt-in to prediction (prediction-opt-in-profile-handler) and the well-known
configs by name: which profile a request takes, the warm-up fallback, admission, config errors."""
from __future__ import annotations

import random

import prometheus_client
import pytest
import yaml

from epp_client import ConfigError, Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.framework.loader import build_scheduler
from epp_client.framework.scheduler import Scheduler
from epp_client.metrics import EppCollector
from epp_client.plugins import (
    KVCacheUtilizationScorer,
    LatencyScorer,
    LoraAffinityScorer,
    MaxScorePicker,
    QueueScorer,
    WeightedRandomPicker,
)
from epp_client.plugins.handler.opt_in import OPT_IN_HEADER, with_opt_in
from epp_client.predictor import BulkPrediction, InProcessPredictor
from epp_client.profiles import PREDICTED_LATENCY_SLO_CONFIG, RECOMMENDED_CONFIG, WELL_KNOWN_CONFIGS, config_text
from epp_client.training import ListSink
from features.loaded import LoadedBundle


class FixedPredictor:
    """Predicts a TTFT that grows with the endpoint's queue; ``source`` as the server reports it."""

    def __init__(self, source: str = "learned", fail: bool = False) -> None:
        self.source, self.fail = source, fail

    def predict_bulk(self, rows):
        if self.fail:
            return None
        return BulkPrediction([100.0 + 50.0 * r["num_request_waiting"] for r in rows], [10.0] * len(rows), "v1",
                              self.source)

    async def apredict_bulk(self, rows):
        return self.predict_bulk(rows)


def pool():
    return [Endpoint(name=f"pod{i}", address=f"10.0.0.{i}", port=8000,
                     metrics=EndpointMetrics(kv_cache_usage=0.1 * i, waiting_queue_size=i, running_requests_size=2),
                     prefix_match=PrefixMatch(0, 10)) for i in range(4)]


def request(header: str | None = None, **kw) -> InferenceRequest:
    headers = {"x-llm-d-slo-ttft-ms": "1000", "x-llm-d-slo-tpot-ms": "50"}
    if header is not None:
        headers[OPT_IN_HEADER] = header
    return InferenceRequest(headers=headers, input_tokens=500, **kw)


def sched(predictor=None, **opt_in) -> Scheduler:
    return build_scheduler(with_opt_in(RECOMMENDED_CONFIG, **opt_in),
                           predictor=predictor if predictor is not None else FixedPredictor(),
                           sink=ListSink(), rng=random.Random(1))


def ran(s: Scheduler, req: InferenceRequest) -> tuple[list[str], str, str]:
    """(profiles that ran, decision, picked endpoint)."""
    res = s.schedule(req, pool())
    assert res.ok
    return list(res.profiles), res.decision, res.endpoint.name


def test_the_header_routes_through_the_predicted_profile_and_its_absence_through_the_heuristic():
    s = sched()
    predicted, heuristic = s.profiles
    assert [type(sc).__name__ for sc, _ in predicted.scorers] == ["LatencyScorer", "LoraAffinityScorer",
                                                                  "KVCacheUtilizationScorer"]
    assert [type(sc).__name__ for sc, _ in heuristic.scorers] == ["QueueScorer", "KVCacheUtilizationScorer",
                                                                  "PrefixCacheScorer"]
    assert ran(s, request("true")) == (["predicted"], "predicted", "pod0")
    assert ran(s, request("TRUE ")) == (["predicted"], "predicted", "pod0")   # the value is read without case
    for header in (None, "false", "yes"):
        profiles, decision, _ = ran(s, request(header))
        assert (profiles, decision) == (["default"], "heuristic")
    assert s.profile_handler.decisions == {("unknown", "predicted"): 2, ("unknown", "heuristic"): 3}
    # the producer predicted for every request (the heuristic ones train the model too)
    assert s.producer.counters["predictions"] == 5


def test_prediction_for_all_makes_the_header_an_opt_out():
    s = sched(prediction_for_all=True)
    assert ran(s, request())[:2] == (["predicted"], "predicted")
    assert ran(s, request("true"))[:2] == (["predicted"], "predicted")
    assert ran(s, request("false"))[:2] == (["default"], "heuristic")


@pytest.mark.parametrize("predictor", [FixedPredictor(source="prior"), FixedPredictor(fail=True),
                                       InProcessPredictor(LoadedBundle.builtin_prior)],
                         ids=["prior-answers", "producer-falls-back", "builtin-prior-bundle"])
def test_opted_in_requests_take_the_heuristic_while_the_predictor_warms_up(predictor):
    s = sched(predictor)
    assert ran(s, request("true"))[:2] == (["default"], "warm-up")
    assert ran(s, request())[:2] == (["default"], "heuristic")
    assert s.profile_handler.decisions == {("unknown", "warm-up"): 1, ("unknown", "heuristic"): 1}
    # without the warm-up rule an opted-in request runs the predicted profile on what it has
    off = sched(predictor, heuristic_while_warming_up=False)
    assert ran(off, request("true"))[:2] == (["predicted"], "predicted")


def test_warm_up_ends_when_a_learned_model_answers():
    pred = FixedPredictor(source="prior")
    s = sched(pred)
    assert ran(s, request("true"))[1] == "warm-up"
    pred.source = "learned"
    assert ran(s, request("true"))[1] == "predicted"


def test_only_predicted_requests_meet_the_admitters():
    # sheddable, with an SLO no endpoint is predicted to meet: latency-slo-admitter rejects it
    s = sched()
    busy = pool()
    for e in busy:
        e.metrics = EndpointMetrics(kv_cache_usage=0.5, waiting_queue_size=40, running_requests_size=8)
    shed = s.schedule(request("true", priority=-1), busy)
    assert (shed.status, shed.reason) == (429, "no valid endpoint available to serve the request")
    kept = s.schedule(request(None, priority=-1), busy)
    assert kept.ok and kept.decision == "heuristic"
    assert s.admitters[0].rejected == 1


def test_decisions_are_exported():
    s = sched()
    for header in ("true", "true", None):
        s.schedule(request(header, target_model="m1"), pool())
    reg = prometheus_client.CollectorRegistry()
    reg.register(EppCollector(scheduler=s))

    def val(decision):
        return reg.get_sample_value("epp_prediction_opt_in_decision_total", {
            "plugin_name": "prediction-opt-in-profile-handler", "plugin_type": "prediction-opt-in-profile-handler",
            "model_name": "m1", "decision_type": decision})
    assert (val("predicted"), val("heuristic")) == (2, 1)


def _config_with(params: dict, profiles=("predicted", "default")) -> str:
    cfg = yaml.safe_load(with_opt_in(PREDICTED_LATENCY_SLO_CONFIG))
    cfg["plugins"][-1]["parameters"] = params
    cfg["schedulingProfiles"] = [dict(p, name=n) for p, n in zip(cfg["schedulingProfiles"], profiles)]
    return yaml.safe_dump(cfg)


@pytest.mark.parametrize("params, where, what", [
    ({"predictionForAll": "yes"}, "parameters.predictionForAll", "must be a bool"),
    ({"heuristicWhileWarmingUp": 1}, "parameters.heuristicWhileWarmingUp", "must be a bool"),
    ({"predictedProfile": ""}, "parameters.predictedProfile", "a profile name"),
    ({"heuristicProfile": "predicted"}, "parameters.heuristicProfile", "must differ from predictedProfile"),
    ({"predictionByDefault": True}, "parameters.predictionByDefault", "unknown parameter"),
])
def test_invalid_handler_parameters_name_the_parameter(params, where, what):
    with pytest.raises(ConfigError) as e:
        build_scheduler(_config_with(params))
    n = len(yaml.safe_load(_config_with(params))["plugins"]) - 1
    assert e.value.param == f"plugins[{n}].{where}" and what in e.value.msg


def test_the_handler_needs_both_profiles_and_with_opt_in_one_profile():
    with pytest.raises(ConfigError, match="needs a profile named 'default'"):
        build_scheduler(_config_with({}, profiles=("predicted", "heuristic")))
    assert build_scheduler(_config_with({"heuristicProfile": "heuristic"},
                                              profiles=("predicted", "heuristic"))).profile_handler
    with pytest.raises(ConfigError, match="already has a prediction-opt-in-profile-handler"):
        with_opt_in(with_opt_in(RECOMMENDED_CONFIG))
    with pytest.raises(ConfigError, match="exactly one profile"):
        with_opt_in("plugins: [{type: queue-scorer}]\nschedulingProfiles: [{name: a}, {name: b}]\n")


def test_well_known_configs_by_name(tmp_path):
    assert set(WELL_KNOWN_CONFIGS) == {"predicted-latency-slo", "predicted-latency-recommended"}
    rec = build_scheduler("predicted-latency-recommended", predictor=FixedPredictor())
    (prof,) = rec.profiles
    (scorer, w_latency), (lora, w_lora), (kv, w_kv) = prof.scorers
    assert isinstance(scorer, LatencyScorer) and scorer.headroom_selection_strategy == "most"
    assert (scorer.ttft_weight, scorer.tpot_weight) == (0.5, 0.5)
    assert scorer.headroom_normalization == "slo"   # each headroom as a share of its SLO (B2.4)
    # KV headroom beside the latency scorer, at equal weight (docs/plugins.md B2.8)
    assert isinstance(kv, KVCacheUtilizationScorer) and w_latency == w_kv == 1.0
    # llm-d's metric-only LoRA affinity at weight 0.75 (neutral where no adapter is loaded)
    assert isinstance(lora, LoraAffinityScorer) and not lora.request_history and w_lora == 0.75
    assert isinstance(prof.picker, MaxScorePicker)
    # the decode-harm-filter first, holding requests (docs/plugins.md B2.9)
    names = [type(f).__name__ for f in prof.filters]
    assert names[0] == "DecodeHarmFilter" and prof.filters[0].hold_slack_ms == 300.0
    assert prof.filters[-1].affinity_threshold == 0.80
    # and the prefix index sized to each engine's KV cache (docs/plugins.md B4.8)
    assert rec.prefix_producer is not None and rec.prefix_producer.auto_tune
    assert rec.prefix_producer.auto_tune_capacity == "kv-tokens"
    slo = build_scheduler("predicted-latency-slo", predictor=FixedPredictor())
    assert isinstance(slo.profiles[0].picker, WeightedRandomPicker)
    assert slo.profiles[0].scorers[0][0].headroom_selection_strategy == "least"
    f = tmp_path / "c.yaml"
    f.write_text("plugins: [{type: queue-scorer}]\n")
    assert config_text("predicted-latency-slo") == PREDICTED_LATENCY_SLO_CONFIG
    assert isinstance(build_scheduler(config_text(str(f))).profiles[0].scorers[0][0], QueueScorer)
    with pytest.raises(OSError):
        config_text(str(tmp_path / "missing.yaml"))


def test_well_known_configs_are_the_shipped_yaml_files():
    """Each name is a plain YAML file under epp_client/profiles/, read as it is (no code builds
    a config by editing another); an installed copy carries them as package data."""
    from epp_client.profiles import PROFILES_DIR, REFERENCE_CONFIG

    files = {p.stem: p.read_text(encoding="utf-8") for p in PROFILES_DIR.glob("*.yaml")}
    assert set(WELL_KNOWN_CONFIGS) | {"helm-reference"} == set(files)
    for name in WELL_KNOWN_CONFIGS:
        assert config_text(name) == files[name]
        assert yaml.safe_load(files[name])["kind"] == "EndpointPickerConfig"
    assert REFERENCE_CONFIG == files["helm-reference"]
    pyproject = (PROFILES_DIR.parents[1] / "pyproject.toml").read_text()
    assert '"epp_client" = ["profiles/*.yaml"]' in pyproject
