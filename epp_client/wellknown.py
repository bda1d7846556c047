"""Well-known EndpointPickerConfigs, by name, and the opt-in variant of a predicted config.

A name is accepted wherever a config is (``Scheduler.from_config``, the gateway's
``--config``, ``simulate --epp-config``)::

    predicted-latency-slo          llm-d's predicted-latency wiring (its integration test's config)
    predicted-latency-recommended  this project's recommended predicted-latency profile

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

#: B2.8: the Helm chart's wiring with router.latencyPredictor.enabled=true.
REFERENCE_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
- name: strict-affinity-filter
  type: prefix-cache-affinity-filter
  parameters:
    affinityThreshold: 0.99
    ttftSource: latencyPredictor
    maxTTFTPenaltyMs: 5000
- name: loose-affinity-filter
  type: prefix-cache-affinity-filter
  parameters:
    affinityThreshold: 0.80
    ttftSource: latencyPredictor
    maxTTFTPenaltyMs: 5000
- type: latency-scorer
- type: weighted-random-picker
- type: slo-headroom-tier-filter
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: strict-affinity-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
    weight: 1
  - pluginRef: weighted-random-picker
"""

#: B2.8: the integration test's well-known config ``predicted-latency-slo``: the reference
#: wiring in streaming mode, its filters with the default source and penalty.
PREDICTED_LATENCY_SLO_CONFIG = (
    REFERENCE_CONFIG.replace("- type: predicted-latency-producer\n",
                             "- type: predicted-latency-producer\n  parameters:\n    streamingMode: true\n")
    .replace("    ttftSource: latencyPredictor\n    maxTTFTPenaltyMs: 5000\n", "")
)


#: The recommended predicted-latency profile (``predicted-latency-recommended``). For now the
#: best-measured wiring: predicted-latency-slo with the latency scorer preferring the MOST
#: headroom, TTFT and TPOT headroom weighted equally, each as a share of its SLO (headroomNormalization: slo:
#: upstream's min-max over the candidates let a 2 ms spread of TPOT weigh as much as seconds of TTFT;
#: ``standard``, seeds 0-2, at 80% / 100%: 91.7% / 57.8% against 90.6% / 54.2%), the max-score picker instead of the
#: weighted-random one (spread load rather than pack requests next to their SLO edge), and
#: llm-d's kv-cache-utilization-scorer beside the latency scorer at weight 1: the models see KV
#: use but not the preemption cliff a full cache falls off, so without it the most-headroom
#: choice piled KV onto a few servers under overload (``standard`` at 100% load, seed 0:
#: 895 preemptions, 42.0% SLO attainment; with it 68 and 57.7%, the best heuristic 52.3%; at
#: 80%: 91.9% against 88.3% and token-load's 88.0%; docs/evaluation.md §4). And llm-d's
#: metric-only lora-affinity-scorer at weight 0.75: the models know nothing of adapter slots, so
#: without it a LoRA pool thrashed adapters (``multi-lora`` at 80% / 100%: 43.9% / 26.2%, with it
#: 68.4% / 38.4%); at weight 2 it herded a burst of new adapters onto the first servers to load
#: them (``lora-spike`` at 100%, seeds 0-4: 24.5% against token-load's 26.1%; at 0.75 26.3%).
#: Where no server serves adapters it scores every endpoint alike (0), so it changes nothing there.
#: And this project's decode-harm-filter first (after the producer): the endpoints where the request
#: pushes the fewest running requests over their TPOT SLO and does not miss its own, by an engine twin
#: stepped forward from the requests this router has running on each (epp_client/twin.py), counting
#: adapter loads and near-full KV caches too; where every endpoint would be harmed and the request has
#: more than 300 ms of TTFT SLO to spare, it holds the request and the caller schedules it again 50 ms
#: later (holdSlackMs; the gateway and the simulator do). And the approximate prefix producer sized to
#: each engine's KV cache (autoTune, kv-tokens): the twin reads which prompts are cached from it, and an
#: index 4 times the cache (llm-d's sizing) placed 1 request in 10 for a cache that was gone.
#: ``standard``, seed 0, at 80% / 100% / 120%: 99.2% / 95.1% / 93.2% (TTFT p90 3.33 s at 80%: 0.67x
#: token-load's); the best heuristic 88.0% / 52.3% / 0.6%; docs/plugins.md B2.9, docs/evaluation.md §4.
RECOMMENDED_CONFIG = (
    PREDICTED_LATENCY_SLO_CONFIG
    .replace("- type: latency-scorer\n", "- type: lora-affinity-scorer\n"
             "- type: latency-scorer\n  parameters:\n    headroomSelectionStrategy: most\n"
             "    ttftWeight: 0.5\n    tpotWeight: 0.5\n    headroomNormalization: slo\n"
             "- type: kv-cache-utilization-scorer\n")
    .replace("  - pluginRef: latency-scorer\n    weight: 1\n",
             "  - pluginRef: latency-scorer\n    weight: 1\n"
             "  - pluginRef: lora-affinity-scorer\n    weight: 0.75\n"
             "  - pluginRef: kv-cache-utilization-scorer\n    weight: 1\n")
    .replace("weighted-random-picker", "max-score-picker")
    .replace("- type: max-score-picker\n", "- type: max-score-picker\n- type: decode-harm-filter\n"
             "  parameters:\n    holdSlackMs: 300\n")
    .replace("  - pluginRef: predicted-latency-producer\n",
             "  - pluginRef: predicted-latency-producer\n  - pluginRef: decode-harm-filter\n")
    .replace("plugins:\n- type: predicted-latency-producer\n",
             "plugins:\n- type: approx-prefix-cache-producer\n- type: predicted-latency-producer\n", 1)
)

#: name -> YAML text
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
