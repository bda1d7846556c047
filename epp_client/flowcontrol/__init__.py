"""Flow control in front of the scheduler: priority bands of per-flow FIFO queues, a
saturation detector, and fairness policies (llm-d's flow-control layer, B4.5).

Public API::

    from epp_client.flowcontrol import (ProgramAwareFairness, GlobalStrictFairness, RoundRobinFairness,
                                        QueueView, FlowController, UtilizationDetector, ConcurrencyDetector,
                                        EndpointLoad, make_detector,
                                        build_flow_control, fairness_id)

    policy = ProgramAwareFairness(strategy="turn-priority", clock=my_clock)
    view = policy.pick([QueueView("prog-a", 2, t_a), QueueView("prog-b", 1, t_b)])
    policy.on_dispatch(view.fairness_id); ...; policy.on_complete(view.fairness_id, 812, 120)

    fc = build_flow_control(endpoint_picker_config_yaml)   # None without a flowControl section
    item, reason = fc.controller.enqueue(request_id, fairness_id(headers), priority)
    nxt = fc.controller.dispatch_next(fc.detector.saturation(loads, now))
"""
from epp_client.flowcontrol.config import FLOW_PLUGIN_TYPES, FlowControl, build_flow_control, make_detector
from epp_client.flowcontrol.controller import (
           DROPPED_REASON_HEADER,
           REJECTED_CAPACITY,
           REJECTED_TTL,
           BandConfig,
           FlowController,
           FlowItem,
)
from epp_client.flowcontrol.policies import (
           DEFAULT_FLOW,
           GlobalStrictFairness,
           QueueView,
           RoundRobinFairness,
           fairness_id,
)
from epp_client.flowcontrol.program_aware import ProgramAwareFairness, jains_index
from epp_client.flowcontrol.saturation import (
           DETECTOR_TYPES,
           USAGE_LIMIT,
           ConcurrencyDetector,
           EndpointLoad,
           UtilizationDetector,
)

__all__ = ["ProgramAwareFairness", "GlobalStrictFairness", "RoundRobinFairness", "QueueView", "FlowController",
           "FlowItem", "BandConfig", "UtilizationDetector", "ConcurrencyDetector",
           "DETECTOR_TYPES", "make_detector", "EndpointLoad", "USAGE_LIMIT", "build_flow_control",
           "FlowControl", "FLOW_PLUGIN_TYPES", "fairness_id", "DEFAULT_FLOW", "jains_index",
           "DROPPED_REASON_HEADER", "REJECTED_CAPACITY", "REJECTED_TTL"]
