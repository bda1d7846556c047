"""The plugins, one type a module: ``plugins/<role>/<type>.py`` (``docs/plugins.md`` Part A.1, Part B).

Each registers where it is declared::

    @plugin("latency-scorer", Scorer)          # upstream type name, role (a protocol)
    class LatencyScorer(Plugin):
        ttft_weight: float = param("ttftWeight", default=0.8, doc="...")

The roles are the protocols of :mod:`epp_client.framework.protocols` (admitter, filter,
scorer, picker, producer, in-flight load producer, prefix producer, P/D decider, profile
handler), one folder each here. Parameters are declared once, as fields
(:mod:`epp_client.framework.params`): constructors take them as snake_case keywords with the
upstream defaults (plus ``rng`` where random numbers are drawn); ``Class.from_config(params)``
takes the upstream camelCase names; invalid parameters raise ``ConfigError`` naming
``type.parameter``. The config loader finds the plugins with
:func:`epp_client.framework.registry.discover`, which imports every module here: adding a
plugin is adding a module (and its test, ``tests/test_<role>_<type>.py``). The
``*ProducerName`` parameters are accepted for config compatibility and ignored: in this
library each attribute has one source (the fields of :class:`~epp_client.Endpoint`).

The plugin classes are importable from here as well as from their modules.
"""
from epp_client.plugins.admitter.latency_slo import LatencySloAdmitter
from epp_client.plugins.admitter.probabilistic import ProbabilisticAdmitter
from epp_client.plugins.decider.always_disagg import AlwaysDisaggPDDecider
from epp_client.plugins.decider.predicted import PredictedPDDecider
from epp_client.plugins.decider.prefix_based import PrefixBasedPDDecider
from epp_client.plugins.filter.decode import DecodeFilter
from epp_client.plugins.filter.decode_harm import DecodeHarmFilter
from epp_client.plugins.filter.encode import EncodeFilter
from epp_client.plugins.filter.prefill import PrefillFilter
from epp_client.plugins.filter.prefix_cache_affinity import PrefixCacheAffinityFilter
from epp_client.plugins.filter.slo_headroom_tier import SloHeadroomTierFilter
from epp_client.plugins.handler.disagg import DisaggProfileHandler
from epp_client.plugins.handler.opt_in import PredictionOptInProfileHandler
from epp_client.plugins.picker.max_score import MaxScorePicker
from epp_client.plugins.picker.random import RandomPicker
from epp_client.plugins.picker.weighted_random import WeightedRandomPicker
from epp_client.plugins.producer.approx_prefix import ApproxPrefixProducer
from epp_client.plugins.producer.inflight_load import InFlightTracker
from epp_client.plugins.producer.predicted_latency import PredictedLatencyProducer
from epp_client.plugins.scorer.decode_harm import DecodeHarmScorer
from epp_client.plugins.scorer.inflight_token import InFlightTokenScorer
from epp_client.plugins.scorer.kv_cache_utilization import KVCacheUtilizationScorer
from epp_client.plugins.scorer.latency import LatencyScorer, composite_scores
from epp_client.plugins.scorer.lora_affinity import LoraAffinityScorer
from epp_client.plugins.scorer.prefix_cache import PrefixCacheScorer
from epp_client.plugins.scorer.queue import QueueScorer

__all__ = [
    "PredictedLatencyProducer", "PrefixCacheAffinityFilter", "SloHeadroomTierFilter", "LatencyScorer", "QueueScorer",
    "KVCacheUtilizationScorer", "PrefixCacheScorer", "LoraAffinityScorer", "LatencySloAdmitter",
    "ProbabilisticAdmitter", "WeightedRandomPicker", "MaxScorePicker", "RandomPicker", "composite_scores",
    "DecodeFilter", "PrefillFilter", "EncodeFilter", "PrefixBasedPDDecider", "AlwaysDisaggPDDecider",
    "PredictedPDDecider", "DisaggProfileHandler", "InFlightTokenScorer", "ApproxPrefixProducer", "DecodeHarmFilter",
    "DecodeHarmScorer", "InFlightTracker", "PredictionOptInProfileHandler",
]
