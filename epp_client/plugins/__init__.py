"""The predicted-latency plugins and their neighbours (``docs/plugins.md`` Part A.1, Part B).

Protocol (all synchronous except the producer's network calls):

- filter: ``filter(request, endpoints) -> list[Endpoint]`` (order preserved, never empty
  for a non-empty input);
- scorer: ``score(request, endpoints) -> dict[name, float]`` (raw; the profile clamps
  to [0, 1] and applies the weight);
- admitter: ``admit(request, endpoints) -> Admission``;
- picker: ``pick(endpoints, scores) -> list[Endpoint]``.

Constructors take upstream parameters as snake_case keywords (upstream defaults) plus
``rng`` where random numbers are drawn; ``Class.from_config(params)`` takes the upstream
camelCase names; invalid parameters raise ``ConfigError`` naming the parameter.
The ``*ProducerName`` parameters are accepted for config compatibility and ignored: in
this library each attribute has one source (the fields of :class:`~epp_client.Endpoint`).
"""
from .admitters import LatencySloAdmitter, ProbabilisticAdmitter
from .deciders import AlwaysDisaggPDDecider, PrefixBasedPDDecider
from .disagg import DisaggProfileHandler
from .filters import PrefixCacheAffinityFilter, SloHeadroomTierFilter
from .inflight_scorer import InFlightTokenScorer
from .pickers import MaxScorePicker, RandomPicker, WeightedRandomPicker
from .predicted_decider import PredictedPDDecider
from .prefix import ApproxPrefixProducer
from .producer import PredictedLatencyProducer
from .roles import DecodeFilter, EncodeFilter, PrefillFilter
from .scorers import (KVCacheUtilizationScorer, LatencyScorer, LoraAffinityScorer, PrefixCacheScorer, QueueScorer,
                      composite_scores)

__all__ = [
    "PredictedLatencyProducer", "PrefixCacheAffinityFilter", "SloHeadroomTierFilter", "LatencyScorer", "QueueScorer",
    "KVCacheUtilizationScorer", "PrefixCacheScorer", "LoraAffinityScorer", "LatencySloAdmitter",
    "ProbabilisticAdmitter", "WeightedRandomPicker", "MaxScorePicker", "RandomPicker", "composite_scores",
    "DecodeFilter", "PrefillFilter", "EncodeFilter", "PrefixBasedPDDecider", "AlwaysDisaggPDDecider",
    "PredictedPDDecider", "DisaggProfileHandler", "InFlightTokenScorer", "ApproxPrefixProducer",
]
