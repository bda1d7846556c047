"""Stage 1 of reading an EndpointPickerConfig: the text, a well-known name or the decoded
mapping -> a checked dict of its top-level sections. Imports no plugin: the scheduler's
builder (:mod:`epp_client.framework.loader`) and flow control (:mod:`epp_client.flowcontrol.config`)
each read their own sections of the dict it returns."""
from __future__ import annotations

from collections.abc import Mapping

import yaml

from epp_client.profiles import WELL_KNOWN_CONFIGS
from epp_client.types import ConfigError

#: the top-level keys of an EndpointPickerConfig
TOP_KEYS = frozenset({"apiVersion", "kind", "plugins", "schedulingProfiles", "featureGates", "saturationDetector",
                      "data", "flowControl"})


def load_config(config: Mapping | str | None) -> dict:
    """The config as a dict: YAML text or a well-known name (:mod:`epp_client.profiles`) is
    parsed, a mapping copied; ``None`` or empty text is ``{}``. ConfigError on invalid YAML, a
    non-mapping or an unknown top-level key."""
    if config is None:
        return {}
    if isinstance(config, str):
        config = WELL_KNOWN_CONFIGS.get(config, config)
        try:
            config = yaml.safe_load(config)
        except yaml.YAMLError as e:
            raise ConfigError("config", f"not valid YAML: {e}") from None
        if config is None:
            return {}
    if not isinstance(config, Mapping):
        raise ConfigError("config", f"must be a mapping, got {type(config).__name__}")
    unknown = set(config) - TOP_KEYS
    if unknown:
        raise ConfigError(sorted(unknown)[0], f"unknown top-level key (known: {', '.join(sorted(TOP_KEYS))})")
    return dict(config)
