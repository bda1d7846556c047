"""epp_client.framework.params: parameters declared once give the constructor, validation naming the
plugin and parameter, coercion, durations, and the context a plugin asks for."""
from __future__ import annotations

import inspect
import random

import pytest

from epp_client import (
    ConfigError,
)
from epp_client.framework.params import Plugin, param, parse_duration
from epp_client.plugins import (
    PredictedLatencyProducer,
    ProbabilisticAdmitter,
    SloHeadroomTierFilter,
)


def test_the_constructor_comes_from_the_declarations():
    sig = inspect.signature(ProbabilisticAdmitter)
    assert [(p.name, p.default) for p in sig.parameters.values()][:4] == [
        ("queue_depth_threshold", 5), ("kv_cache_util_threshold", 0.8), ("power", 5.0), ("k", 300.0)]
    assert "rng" in sig.parameters
    producer = inspect.signature(PredictedLatencyProducer).parameters
    assert [n for n, p in producer.items() if p.kind is p.POSITIONAL_OR_KEYWORD] == ["predictor", "sink"]
    assert producer["slo_buffer_factor"].kind is inspect.Parameter.KEYWORD_ONLY
    assert [p.name for p in ProbabilisticAdmitter.PARAMS] == ["queueDepthThreshold", "kvCacheUtilThreshold",
                                                              "power", "k"]


@pytest.mark.parametrize("build", [
    lambda: ProbabilisticAdmitter(power=-1.5),
    lambda: ProbabilisticAdmitter.from_config({"power": -1.5}),
])
def test_validation_names_plugin_parameter_and_value(build):
    with pytest.raises(ConfigError) as e:
        build()
    assert e.value.param == "probabilistic-admitter.power"
    assert e.value.msg == "must be > 0, got -1.5"


def test_values_are_coerced_where_declared():
    a = ProbabilisticAdmitter(queue_depth_threshold=3.0, k=2)
    assert a.queue_depth_threshold == 3 and type(a.queue_depth_threshold) is int
    assert a.k == 2.0 and type(a.k) is float
    assert PredictedLatencyProducer(context_ttl="1m30s").context_ttl == 90.0
    with pytest.raises(ConfigError, match="must be a bool, got 'yes'"):
        PredictedLatencyProducer(streaming_mode="yes")
    with pytest.raises(ConfigError, match="must be finite"):
        SloHeadroomTierFilter(epsilon_explore_neg=float("nan"))


def test_a_parameter_needs_a_known_kind():
    with pytest.raises(TypeError, match="annotate it as float, int, bool or str"):
        class Odd(Plugin):
            things: list = param("things", default=None)
    with pytest.raises(ValueError, match="unknown kind"):
        param("x", default=1, kind="complex")


def test_context_is_passed_only_to_plugins_that_declare_it():
    clock = lambda: 5.0  # noqa: E731
    p = PredictedLatencyProducer.from_config({"streamingMode": True}, clock=clock, rng=random.Random(), sink=None)
    assert p.clock is clock and p.streaming_mode and not hasattr(p, "rng")
    r = random.Random(2)
    assert SloHeadroomTierFilter.from_config(None, rng=r, clock=clock).rng is r


def test_go_duration_parsing():
    assert parse_duration("5m") == 300 and parse_duration("1h30m") == 5400
    assert parse_duration("250ms") == pytest.approx(0.25) and parse_duration("1.5s") == 1.5
    with pytest.raises(ValueError):
        parse_duration("5 minutes")
    assert PredictedLatencyProducer.from_config({"contextTTL": "30s"}).context_ttl == 30
    with pytest.raises(ConfigError, match="contextTTL"):
        PredictedLatencyProducer.from_config({"contextTTL": "soon"})
