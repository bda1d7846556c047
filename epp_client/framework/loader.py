"""EndpointPickerConfig-style configuration (plugins + scheduling profiles) -> Scheduler.

Accepted shape (YAML text, a well-known name of :mod:`epp_client.profiles`, or the decoded dict;
stage 1, :func:`epp_client.framework.config.load_config`, reads it)::

    apiVersion: inference.networking.x-k8s.io/v1alpha1     # optional
    kind: EndpointPickerConfig                              # optional
    plugins:
    - name: strict-affinity-filter        # optional, defaults to the type
      type: prefix-cache-affinity-filter
      parameters: {affinityThreshold: 0.99, ttftSource: latencyPredictor, maxTTFTPenaltyMs: 5000}
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: strict-affinity-filter
      - pluginRef: latency-scorer
        weight: 1

Plugin types are the registered ones (``plugins.registry.discover``), each placed by the
role it declares when it registers. Producers and admitters are global (they run before every profile) whether or not a
profile references them. A profile without a picker gets the first configured picker, or
a max-score picker. The in-flight accounting (``inflight-load-producer``) is always
present (upstream auto-creates it); its parameters can be set in the plugin list.
Strict like upstream: unknown keys, types and parameters raise ConfigError naming them.

A profile handler chooses which profiles run: ``disagg-profile-handler`` for P/D
disaggregation (B4.7; its ``deciders`` name decider plugins of this list) or
``prediction-opt-in-profile-handler`` (per-request opt-in to prediction); without one every
profile runs and the primary is ``decode`` if present, else the first.
"""
from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from epp_client.flowcontrol.config import FLOW_PLUGIN_TYPES
from epp_client.framework.config import load_config
from epp_client.framework.profile import SchedulingProfile, default_picker, default_profile
from epp_client.framework.protocols import (
    Admitter,
    Filter,
    InFlightLoadProducer,
    PDDecider,
    Picker,
    PrefixProducer,
    Producer,
    ProfileHandler,
    Scorer,
)
from epp_client.framework.registry import discover, role_of
from epp_client.framework.scheduler import Scheduler
from epp_client.types import ConfigError

__all__ = ["build_scheduler"]

#: the in-flight accounting every scheduler has (upstream auto-creates it)
INFLIGHT_TYPE = "inflight-load-producer"

#: Upstream plugin types accepted and ignored here: the router supplies their data itself
#: (prefix match info on each Endpoint), they only select profiles, or they belong to flow
#: control (``flowcontrol.build_flow_control`` builds those).
IGNORED_TYPES = frozenset({"single-profile-handler", *FLOW_PLUGIN_TYPES})

def _role(plugin: Any) -> type | None:
    if isinstance(plugin, _HandlerSpec):
        return ProfileHandler
    return role_of(plugin)


class _HandlerSpec:
    """A profile handler whose decider names are resolved once all plugins exist."""

    def __init__(self, cls: type, name: str, kwargs: dict) -> None:
        self.cls, self.name, self.kwargs = cls, name, kwargs

    def build(self, loc: str, instances: dict) -> Any:
        try:
            return self._build(loc, instances)
        except ConfigError as e:
            if e.param.startswith(loc):
                raise
            raise ConfigError(f"{loc}.parameters.{e.param.split('.', 1)[-1]}", e.msg) from None

    def _build(self, loc: str, instances: dict) -> Any:
        kw = dict(self.kwargs)
        for stage in ("prefill", "encode"):
            ref = kw.get(f"{stage}_decider")
            if ref is None:
                continue
            if _role(instances.get(ref)) is not PDDecider:
                raise ConfigError(f"{loc}.parameters.deciders.{stage}",
                                  f"{ref!r} is not a decider plugin of this config")
            kw[f"{stage}_decider"] = instances[ref]
        return self.cls(name=self.name, **kw)


def build_scheduler(config: Mapping | str | None, predictor: Any = None, sink: Any = None,
                    rng: random.Random | None = None, plugin_types: Mapping[str, type] | None = None,
                    **producer_kwargs: Any) -> Scheduler:
    """Build a Scheduler; ``producer_kwargs`` (e.g. ``clock``, ``wall_clock``) go to the plugins
    that declare them (the producer). ``plugin_types`` (type name -> class) replaces the
    discovered plugins (:func:`~epp_client.framework.registry.discover`)."""
    cfg = load_config(config)
    if plugin_types is None:
        plugin_types = discover()
    plugins_cfg = cfg.get("plugins") or []
    if not isinstance(plugins_cfg, list):
        raise ConfigError("plugins", "must be a list")
    instances: dict[str, Any] = {}
    order: list[str] = []
    for i, spec in enumerate(plugins_cfg):
        loc = f"plugins[{i}]"
        if not isinstance(spec, Mapping):
            raise ConfigError(loc, "must be a mapping with type, name and parameters")
        extra = set(spec) - {"type", "name", "parameters"}
        if extra:
            raise ConfigError(f"{loc}.{sorted(extra)[0]}", "unknown key")
        ptype = spec.get("type")
        if not isinstance(ptype, str) or not ptype:
            raise ConfigError(f"{loc}.type", "required (a plugin type name)")
        name = spec.get("name") or ptype
        if not isinstance(name, str):
            raise ConfigError(f"{loc}.name", "must be a string")
        if name in instances:
            raise ConfigError(f"{loc}.name", f"duplicate plugin name {name!r}")
        if ptype in IGNORED_TYPES:
            instances[name] = None
            order.append(name)
            continue
        cls: Any = plugin_types.get(ptype)
        if cls is None:
            raise ConfigError(f"{loc}.type", f"unknown plugin type {ptype!r} (known: {', '.join(plugin_types)})")
        params = spec.get("parameters")
        try:
            if role_of(cls) is ProfileHandler:
                instances[name] = _HandlerSpec(cls, name, cls.parse_params(params))
                order.append(name)
                continue
            # each plugin takes the context it declares (the producer: predictor, sink, clocks)
            plugin = cls.from_config(params, predictor=predictor, sink=sink,
                                     rng=rng if rng is not None else random.Random(), **producer_kwargs)
        except ConfigError as e:
            raise ConfigError(f"{loc}.parameters.{e.param.split('.', 1)[-1]}", e.msg) from None
        instances[name] = plugin
        order.append(name)

    producers = [n for n in order if _role(instances[n]) is Producer]
    if len(producers) > 1:
        raise ConfigError("plugins", f"at most one predicted-latency-producer is supported, got {producers}")
    producer = instances[producers[0]] if producers else None
    trackers = [instances[n] for n in order if _role(instances[n]) is InFlightLoadProducer]
    inflight = trackers[0] if trackers else (plugin_types.get(INFLIGHT_TYPE) or discover()[INFLIGHT_TYPE])()
    prefixes = [instances[n] for n in order if _role(instances[n]) is PrefixProducer]
    prefix = prefixes[0] if prefixes else None
    admitters = [instances[n] for n in order if _role(instances[n]) is Admitter]
    pickers = [instances[n] for n in order if _role(instances[n]) is Picker]
    handlers = [n for n in order if _role(instances[n]) is ProfileHandler]
    if len(handlers) > 1:
        raise ConfigError("plugins", f"at most one profile handler is supported, got {handlers}")
    handler = None
    if handlers:
        handler = instances[handlers[0]].build(f"plugins[{order.index(handlers[0])}]", instances)

    profiles_cfg = cfg.get("schedulingProfiles")
    if not profiles_cfg:
        if not plugins_cfg:
            return Scheduler(producer, admitters, [default_profile()], inflight, prefix_producer=prefix)
        if handler is not None:
            raise ConfigError("schedulingProfiles", f"required with a {handler.TYPE}")
        profiles_cfg = [{"name": "default", "plugins": [{"pluginRef": n} for n in order]}]
    if not isinstance(profiles_cfg, list):
        raise ConfigError("schedulingProfiles", "must be a list")
    profiles = []
    for i, pspec in enumerate(profiles_cfg):
        loc = f"schedulingProfiles[{i}]"
        if not isinstance(pspec, Mapping):
            raise ConfigError(loc, "must be a mapping with name and plugins")
        extra = set(pspec) - {"name", "plugins"}
        if extra:
            raise ConfigError(f"{loc}.{sorted(extra)[0]}", "unknown key")
        pname = pspec.get("name")
        if not isinstance(pname, str) or not pname:
            raise ConfigError(f"{loc}.name", "required")
        filters: list = []
        scorers: list = []
        picker: Any = None
        for j, ref in enumerate(pspec.get("plugins") or []):
            rloc = f"{loc}.plugins[{j}]"
            if not isinstance(ref, Mapping) or set(ref) - {"pluginRef", "weight"}:
                raise ConfigError(rloc, "must be a mapping with pluginRef and optional weight")
            pref = ref.get("pluginRef")
            if pref not in instances:
                raise ConfigError(f"{rloc}.pluginRef", f"unknown plugin {pref!r}")
            weight = ref.get("weight", 1.0)
            if type(weight) not in (int, float) or weight != weight:
                raise ConfigError(f"{rloc}.weight", f"must be a number, got {weight!r}")
            plugin = instances[pref]
            role = _role(plugin)
            if role is Filter:
                filters.append(plugin)
            elif role is Scorer:
                scorers.append((plugin, float(weight)))
            elif role is Picker:
                if picker is not None:
                    raise ConfigError(f"{rloc}.pluginRef", "a profile has at most one picker")
                picker = plugin
            # producers, admitters, deciders, in-flight accounting, handlers and ignored types are global
        if picker is None:
            picker = pickers[0] if pickers else default_picker(rng if rng is not None else random.Random())
        profiles.append(SchedulingProfile(pname, filters, scorers, picker))
    if handler is not None:
        missing = [n for n in handler.required_profiles() if n not in {p.name for p in profiles}]
        if missing:
            raise ConfigError("schedulingProfiles", f"the {handler.TYPE} needs a profile named {missing[0]!r}")
    return Scheduler(producer, admitters, profiles, inflight, profile_handler=handler, prefix_producer=prefix)
