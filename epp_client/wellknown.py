"""Well-known EndpointPickerConfigs, by name, and the opt-in variant of a predicted config.

A name is accepted wherever a config is (``Scheduler.from_config``, the gateway's
``--config``, ``simulate --epp-config``)::

    predicted-latency-slo          llm-d's predicted-latency wiring (its integration test's config)
    predicted-latency-recommended  this project's recommended predicted-latency profile

Each is a plain YAML file, ``epp_client/profiles/<name>.yaml`` (with ``helm-reference.yaml``, the
Helm chart's wiring, ``REFERENCE_CONFIG``); why a profile is wired as it is lives in
docs/plugins.md B2.8.
:func:`config_text` turns a name or a file path into YAML text; :func:`with_opt_in` turns a
single-profile predicted config into one where only requests carrying
``x-prediction-based-scheduling: true`` take it (``prediction-opt-in-profile-handler``).
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .plugins.opt_in import HANDLER_TYPE as OPT_IN_HANDLER
from .scheduler import default_profile
from .types import ConfigError

#: the folder of the well-known configs, one YAML file a name (``<name>.yaml``)
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


def profile_text(name: str) -> str:
    """The YAML text of the shipped config ``profiles/<name>.yaml``."""
    return (PROFILES_DIR / f"{name}.yaml").read_text(encoding="utf-8")


#: B2.8: the Helm chart's wiring with router.latencyPredictor.enabled=true.
REFERENCE_CONFIG = profile_text("helm-reference")
#: B2.8: the integration test's well-known config ``predicted-latency-slo``.
PREDICTED_LATENCY_SLO_CONFIG = profile_text("predicted-latency-slo")
#: the recommended predicted-latency profile ``predicted-latency-recommended`` (docs/plugins.md B2.8).
RECOMMENDED_CONFIG = profile_text("predicted-latency-recommended")

#: name -> YAML text of the configs accepted by name
WELL_KNOWN_CONFIGS: dict[str, str] = {
    "predicted-latency-slo": PREDICTED_LATENCY_SLO_CONFIG,
    "predicted-latency-recommended": RECOMMENDED_CONFIG,
}


def config_text(name_or_path: str) -> str:
    """The YAML text of a well-known config name, else of the file at that path (OSError
    when it cannot be read)."""
    text = WELL_KNOWN_CONFIGS.get(name_or_path)
    return text if text is not None else Path(name_or_path).read_text()


def with_opt_in(config: str | Mapping, *, prediction_for_all: bool = False,
                heuristic_while_warming_up: bool = True) -> str:
    """``config`` (YAML text, a well-known name or the decoded dict; exactly one scheduling
    profile) as an opt-in config: its profile renamed ``predicted``, llm-d's default profile
    as ``default`` beside it, and a ``prediction-opt-in-profile-handler`` with the given
    parameters choosing between them per request."""
    cfg: Any = config
    if isinstance(config, str):
        cfg = yaml.safe_load(WELL_KNOWN_CONFIGS.get(config, config))
    if not isinstance(cfg, Mapping):
        raise ConfigError("config", "must be a mapping")
    cfg = dict(cfg)
    plugins = [dict(p) for p in cfg.get("plugins") or []]
    if any(isinstance(p, Mapping) and p.get("type") == OPT_IN_HANDLER for p in plugins):
        raise ConfigError("plugins", f"already has a {OPT_IN_HANDLER}")
    profiles = cfg.get("schedulingProfiles")
    if not isinstance(profiles, list) or len(profiles) != 1 or not isinstance(profiles[0], Mapping):
        raise ConfigError("schedulingProfiles", "an opt-in config is made from a config with exactly one profile")
    predicted = dict(profiles[0], name="predicted")
    # the heuristic profile: llm-d's default one (epp_client.scheduler.default_profile)
    default = default_profile()
    scorers = [(f"heuristic-{type(sc).TYPE}", type(sc).TYPE, w) for sc, w in default.scorers]
    picker = f"heuristic-{type(default.picker).TYPE}"
    plugins += [{"name": name, "type": ptype} for name, ptype, _ in scorers]
    plugins.append({"name": picker, "type": type(default.picker).TYPE})
    plugins.append({"type": OPT_IN_HANDLER, "parameters": {"predictionForAll": prediction_for_all,
                                                           "heuristicWhileWarmingUp": heuristic_while_warming_up}})
    refs = [{"pluginRef": name, "weight": w} for name, _, w in scorers]
    heuristic = {"name": "default", "plugins": [*refs, {"pluginRef": picker}]}
    cfg["plugins"] = plugins
    cfg["schedulingProfiles"] = [predicted, heuristic]
    return yaml.safe_dump(cfg, sort_keys=False)
