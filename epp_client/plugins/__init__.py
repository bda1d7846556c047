"""The predicted-latency plugins and their neighbours (``docs/plugins.md`` Part A.1, Part B).

Each plugin is a class in one module of this package, registered where it is declared::

    @plugin("latency-scorer", Scorer)          # upstream type name, role (a protocol)
    class LatencyScorer(Plugin):
        ttft_weight: float = param("ttftWeight", default=0.8, doc="...")

The roles are the protocols of :mod:`.protocols` (filter, scorer, picker, admitter,
producer, in-flight load producer, P/D decider, profile handler). Parameters are declared
once, as fields (:mod:`epp_client.framework.params`): constructors take them as snake_case keywords
with the upstream defaults (plus ``rng`` where random numbers are drawn);
``Class.from_config(params)`` takes the upstream camelCase names; invalid parameters raise
``ConfigError`` naming ``type.parameter``. The config builder finds the plugins with
:func:`.registry.discover`, which imports every module here: adding a plugin is adding a
module. The ``*ProducerName`` parameters are accepted for config compatibility and
ignored: in this library each attribute has one source (the fields of
:class:`~epp_client.Endpoint`).
"""
from epp_client.framework.protocols import (
    Admitter,
    Filter,
    InFlightLoadProducer,
    LifecycleObserver,
    PDDecider,
    Picker,
    PrefixProducer,
    Producer,
    ProfileHandler,
    Scorer,
)
from epp_client.framework.registry import discover, plugin
from epp_client.plugins.admitters import LatencySloAdmitter, ProbabilisticAdmitter
from epp_client.plugins.deciders import AlwaysDisaggPDDecider, PrefixBasedPDDecider
from epp_client.plugins.disagg import DisaggProfileHandler
from epp_client.plugins.filters import PrefixCacheAffinityFilter, SloHeadroomTierFilter
from epp_client.plugins.inflight_scorer import InFlightTokenScorer
from epp_client.plugins.pickers import MaxScorePicker, RandomPicker, WeightedRandomPicker
from epp_client.plugins.predicted_decider import PredictedPDDecider
from epp_client.plugins.prefix import ApproxPrefixProducer
from epp_client.plugins.producer import PredictedLatencyProducer
from epp_client.plugins.roles import DecodeFilter, EncodeFilter, PrefillFilter
from epp_client.plugins.scorers import (
    KVCacheUtilizationScorer,
    LatencyScorer,
    LoraAffinityScorer,
    PrefixCacheScorer,
    QueueScorer,
    composite_scores,
)

__all__ = [
    "PredictedLatencyProducer", "PrefixCacheAffinityFilter", "SloHeadroomTierFilter", "LatencyScorer", "QueueScorer",
    "KVCacheUtilizationScorer", "PrefixCacheScorer", "LoraAffinityScorer", "LatencySloAdmitter",
    "ProbabilisticAdmitter", "WeightedRandomPicker", "MaxScorePicker", "RandomPicker", "composite_scores",
    "DecodeFilter", "PrefillFilter", "EncodeFilter", "PrefixBasedPDDecider", "AlwaysDisaggPDDecider",
    "PredictedPDDecider", "DisaggProfileHandler", "InFlightTokenScorer", "ApproxPrefixProducer", "plugin",
    "discover", "Producer", "InFlightLoadProducer", "PrefixProducer", "Admitter", "Filter", "Scorer", "Picker",
    "PDDecider", "ProfileHandler", "LifecycleObserver",
]
