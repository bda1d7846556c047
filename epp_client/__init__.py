"""epp_client: the endpoint picker's predicted-latency plugins as a Python library.

Routes exactly as an llm-d gateway with predicted-latency routing would (same plugins,
parameters, defaults and decision rules; ``docs/plugins.md``), with the
deliberate differences of Part A.2. Four parts: ``framework/`` (the extension-point
protocols, parameters, registry, staged config loader, scheduler and request lifecycle; it
imports no plugin), ``plugins/<role>/<type>.py`` (one plugin type a module), ``profiles/``
(the well-known configs as YAML) and ``engine/`` (the engine twin behind ``EngineModel``).

Public API::

    from epp_client import (Endpoint, EndpointMetrics, PrefixMatch, InFlightLoad,
                            LatencyPrediction, InferenceRequest, Admission, ConfigError)
    from epp_client.plugins import PredictedLatencyProducer, ...       # every plugin class
    from epp_client.framework.loader import build_scheduler       # config -> Scheduler
    from epp_client.framework.scheduler import Scheduler
    from epp_client.framework.profile import SchedulingProfile
    from epp_client.framework.lifecycle import RequestLifecycle, SchedulingResult  # the request lifecycle
    from epp_client.heuristics import LeastLoadScheduler, ...  # heuristic policies on it
    from epp_client.predictor import PredictorClient, InProcessPredictor, BulkPrediction
    from epp_client.training import TrainingReporter, ListSink
    from epp_client.plugins.producer.inflight_load import InFlightTracker
    from epp_client.profiles import REFERENCE_CONFIG, RECOMMENDED_CONFIG, config_text  # configs by name
    from epp_client.plugins.handler.opt_in import with_opt_in    # the opt-in variant of a config
    from epp_client.metrics import EppCollector          # Prometheus exposition
    from epp_client import rank_endpoints                # one Endpoint per DP rank (B4.6)
    from epp_client.flowcontrol import ProgramAwareFairness, FlowController, build_flow_control  # B4.5

Typical use::

    sched = build_scheduler(REFERENCE_CONFIG, predictor=PredictorClient([...]),
                            sink=TrainingReporter(url))
    res = sched.schedule(InferenceRequest(headers=..., input_tokens=...), endpoints)
    sched.pre_request(req, res); ...; sched.on_complete(req.request_id)

The gateway (top-level ``gateway`` package) and the simulator (``load.sim``) drive every
routing policy through this lifecycle; this package imports neither.
"""
from epp_client.types import (
    Admission,
    ConfigError,
    EncoderMatch,
    Endpoint,
    EndpointMetrics,
    HoldRequest,
    InferenceRequest,
    InFlightLoad,
    LatencyPrediction,
    PrefixMatch,
    ShedRequest,
    rank_endpoints,
)

__all__ = ["Endpoint", "EndpointMetrics", "PrefixMatch", "InFlightLoad", "LatencyPrediction", "InferenceRequest",
           "Admission", "ConfigError", "EncoderMatch", "HoldRequest", "ShedRequest",
           "rank_endpoints"]
