"""The EndpointPickerConfig's ``flowControl`` section -> a flow controller and a saturation detector.

Flow control is off when the section is absent. Accepted shape (upstream's field names)::

    plugins:
    - type: program-aware-fairness
      parameters: {strategy: turn-priority, turnPriorityTimeWeight: 0.5}
    - type: utilization-detector            # optional: defaults are used without it
      parameters: {queueDepthThreshold: 5}  # (or concurrency-detector: {maxConcurrency: 16})
    flowControl:
      maxRequests: 0                        # all bands together; 0 = no limit
      defaultRequestTTL: 60s                # queue-wait budget; "0s" disables it
      defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness, maxRequests: 5000}
      defaultNegativePriorityBand: {...}    # template for priorities < 0
      priorityBands: [{priority: 10, fairnessPolicyRef: round-robin-fairness-policy}]
      saturationDetector: {pluginRef: utilization-detector}

A ``...Ref`` names a plugin of the ``plugins`` list, or one of the built-in types directly
(``global-strict-fairness-policy``, ``round-robin-fairness-policy``,
``program-aware-fairness``, ``utilization-detector``, ``concurrency-detector``,
``fcfs-ordering-policy``), which then gets its defaults. Without a ``saturationDetector``
the first detector of ``plugins`` is used, else a default ``utilization-detector``.
Unknown or unsupported keys raise ConfigError naming them.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from epp_client.flowcontrol.controller import BandConfig, FlowController
from epp_client.flowcontrol.policies import GlobalStrictFairness, RoundRobinFairness
from epp_client.flowcontrol.program_aware import ProgramAwareFairness
from epp_client.flowcontrol.saturation import DETECTOR_TYPES, ConcurrencyDetector, UtilizationDetector
from epp_client.framework.config import load_config
from epp_client.framework.params import parse_duration
from epp_client.types import ConfigError

FAIRNESS_TYPES = {c.TYPE: c for c in (GlobalStrictFairness, RoundRobinFairness, ProgramAwareFairness)}
ORDERING_TYPES = frozenset({"fcfs-ordering-policy"})
#: plugin types that belong to flow control (the scheduler's config builder skips them)
FLOW_PLUGIN_TYPES = frozenset({*FAIRNESS_TYPES, *DETECTOR_TYPES, *ORDERING_TYPES})
Detector = UtilizationDetector | ConcurrencyDetector

_FC_KEYS = ("maxRequests", "defaultRequestTTL", "defaultPriorityBand", "defaultNegativePriorityBand",
            "priorityBands", "saturationDetector")
_BAND_KEYS = ("priority", "maxRequests", "fairnessPolicyRef", "orderingPolicyRef")
DEFAULT_BAND_MAX_REQUESTS = 5000
DEFAULT_REQUEST_TTL_S = 60.0


@dataclass
class FlowControl:
    controller: FlowController
    detector: Detector


def make_detector(spec: Mapping | None = None) -> Detector:
    """A detector from ``{type: ..., <camelCase parameters>}`` (type default ``utilization-detector``)."""
    spec = dict(spec or {})
    dtype = spec.pop("type", None) or UtilizationDetector.TYPE
    cls = DETECTOR_TYPES.get(dtype)
    if cls is None:
        raise ConfigError("saturationDetector.type", f"unknown detector {dtype!r} (known: {', '.join(DETECTOR_TYPES)})")
    return cls.from_config(spec or None)


def _count(loc: str, v: Any) -> int:
    """A request count: an integer or a quantity string such as ``"100"``, ``"1k"``."""
    if type(v) is int and v >= 0:
        return v
    if isinstance(v, str):
        m = re.fullmatch(r"\s*(\d+)\s*(k|M)?\s*", v)
        if m:
            return int(m.group(1)) * {None: 1, "k": 1000, "M": 1_000_000}[m.group(2)]
    raise ConfigError(loc, f"must be a non-negative integer or quantity, got {v!r}")


def _duration(loc: str, v: Any) -> float:
    try:
        if isinstance(v, str):
            s = parse_duration(v)
        elif type(v) in (int, float):
            s = float(v)
        else:
            raise ValueError(f"must be a duration such as '60s', got {v!r}")
    except ValueError as e:
        raise ConfigError(loc, str(e)) from None
    if not s >= 0:
        raise ConfigError(loc, f"must be >= 0, got {v!r}")
    return s


def _keys(loc: str, obj: Any, known: tuple[str, ...]) -> Mapping:
    if not isinstance(obj, Mapping):
        raise ConfigError(loc, "must be a mapping")
    for k in obj:
        if k not in known:
            raise ConfigError(f"{loc}.{k}", f"unknown or unsupported key (supported: {', '.join(known)})")
    return obj


def build_flow_control(config: Mapping | str | None, clock: Callable[[], float] = time.monotonic) -> FlowControl | None:
    """None when the config has no ``flowControl`` section (flow control off)."""
    cfg = load_config(config)
    if cfg.get("flowControl") is None:
        return None
    fc = _keys("flowControl", cfg["flowControl"], _FC_KEYS)
    plugins: dict[str, Any] = {}
    for i, spec in enumerate(cfg.get("plugins") or []):
        if not isinstance(spec, Mapping) or spec.get("type") not in FLOW_PLUGIN_TYPES:
            continue      # scheduler plugins: validated by the scheduler's builder
        ptype = spec["type"]
        name = spec.get("name") or ptype
        if ptype in ORDERING_TYPES:
            plugins[name] = ptype
            continue
        cls = FAIRNESS_TYPES.get(ptype) or DETECTOR_TYPES[ptype]
        try:
            plugins[name] = cls.from_config(spec.get("parameters"), clock=clock)
        except ConfigError as e:
            raise ConfigError(f"plugins[{i}].parameters.{e.param.split('.', 1)[-1]}", e.msg) from None

    def resolve(loc: str, ref: Any, kinds: dict) -> Any:
        if not isinstance(ref, str) or not ref:
            raise ConfigError(loc, "must be a plugin name")
        if ref in plugins:
            obj = plugins[ref]
            if not isinstance(obj, tuple(kinds.values())):
                raise ConfigError(loc, f"plugin {ref!r} is not a {' or '.join(kinds)}")
            return obj
        if ref in kinds:
            plugins[ref] = ProgramAwareFairness(clock=clock) if ref == ProgramAwareFairness.TYPE else kinds[ref]()
            return plugins[ref]
        raise ConfigError(loc, f"unknown plugin {ref!r} (define it under plugins, or use one of {', '.join(kinds)})")

    def band(loc: str, spec: Any, with_priority: bool) -> tuple[int, BandConfig]:
        _keys(loc, spec, _BAND_KEYS if with_priority else _BAND_KEYS[1:])
        prio = 0
        if with_priority:
            prio = spec.get("priority")
            if type(prio) is not int:
                raise ConfigError(f"{loc}.priority", f"required, an integer; got {prio!r}")
        order = spec.get("orderingPolicyRef")
        if order is not None and plugins.get(order, order) not in ORDERING_TYPES:
            raise ConfigError(f"{loc}.orderingPolicyRef", f"only fcfs-ordering-policy is supported, got {order!r}")
        policy = None
        if spec.get("fairnessPolicyRef") is not None:
            policy = resolve(f"{loc}.fairnessPolicyRef", spec["fairnessPolicyRef"], FAIRNESS_TYPES)
        cap = _count(f"{loc}.maxRequests", spec.get("maxRequests", 0)) or DEFAULT_BAND_MAX_REQUESTS
        return prio, BandConfig(policy, cap)

    default = band("flowControl.defaultPriorityBand", fc.get("defaultPriorityBand") or {}, False)[1]
    negative = None
    if fc.get("defaultNegativePriorityBand") is not None:
        negative = band("flowControl.defaultNegativePriorityBand", fc["defaultNegativePriorityBand"], False)[1]
    bands: dict[int, BandConfig] = {}
    pbs = fc.get("priorityBands") or []
    if not isinstance(pbs, list):
        raise ConfigError("flowControl.priorityBands", "must be a list")
    for j, spec in enumerate(pbs):
        prio, b = band(f"flowControl.priorityBands[{j}]", spec, True)
        if prio in bands:
            raise ConfigError(f"flowControl.priorityBands[{j}].priority", f"duplicate band {prio}")
        bands[prio] = b
    ttl = DEFAULT_REQUEST_TTL_S
    if fc.get("defaultRequestTTL") is not None:
        ttl = _duration("flowControl.defaultRequestTTL", fc["defaultRequestTTL"])
    detector: Any = None
    sd = fc.get("saturationDetector")
    if sd is not None:
        _keys("flowControl.saturationDetector", sd, ("pluginRef",))
        if sd.get("pluginRef"):
            detector = resolve("flowControl.saturationDetector.pluginRef", sd["pluginRef"], DETECTOR_TYPES)
    if detector is None:
        detector = next((p for p in plugins.values() if isinstance(p, (UtilizationDetector, ConcurrencyDetector))),
                        None) or UtilizationDetector()
    controller = FlowController(default, bands, negative, request_ttl_s=ttl,
                                max_requests=_count("flowControl.maxRequests", fc.get("maxRequests", 0)), clock=clock)
    return FlowControl(controller, detector)
