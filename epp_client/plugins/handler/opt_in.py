"""``prediction-opt-in-profile-handler`` (this project's; GKE Inference Gateway documents the
same opt-in for its predicted-latency routing): per request, the predicted-latency
pipeline or the heuristic one.

- A request carrying ``x-prediction-based-scheduling: true`` takes the predicted profile
  (``predictedProfile``, default ``predicted``); one without the header takes the heuristic
  profile (``heuristicProfile``, default ``default``), unless ``predictionForAll`` makes
  prediction the default, when ``x-prediction-based-scheduling: false`` opts a request out.
  The value is read without case; any other value counts as no header.
- Warm-up: while no learned model answers, an opted-in request takes the heuristic profile
  too (``heuristicWhileWarmingUp``, default true). "No learned model" is the producer's
  fallback (no candidate has a prediction: the predictor failed, timed out or is not
  configured) or predictions that all come from the prior (``model_source`` ``prior``: the
  servers have not published a trained model yet).
- Only requests that take the predicted profile meet the global admitters
  (``latency-slo-admitter`` judges by predictions); a heuristic request is scheduled as the
  default pipeline would. The producer runs for every request, so the heuristic traffic
  trains the model that opted-in traffic uses.

Each scheduled request counts one decision in ``decisions[(model, decision)]``: ``predicted``,
``heuristic`` (not opted in) or ``warm-up`` (opted in, heuristic during warm-up);
``SchedulingResult.decision`` carries it (the gateway's ``/gateway/requests`` too).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, ClassVar

import yaml

from epp_client.framework.params import Check, Plugin, param, parse_params
from epp_client.framework.profile import default_profile
from epp_client.framework.protocols import ProfileHandler
from epp_client.framework.registry import plugin
from epp_client.profiles import WELL_KNOWN_CONFIGS
from epp_client.types import PRIOR_MODEL_SOURCE, ConfigError, Endpoint, InferenceRequest

HANDLER_TYPE = "prediction-opt-in-profile-handler"
OPT_IN_HEADER = "x-prediction-based-scheduling"

PREDICTED = "predicted"
HEURISTIC = "heuristic"
WARM_UP = "warm-up"

_PROFILE_NAME = Check(lambda v: bool(v), "a profile name (non-empty)")


def opted_in(headers: Mapping[str, str], default: bool = False) -> bool:
    """The request's ``x-prediction-based-scheduling`` (``true`` / ``false``), else ``default``."""
    value = headers.get(OPT_IN_HEADER)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("true", "false"):
            return v == "true"
    return default


def learned_model_answers(candidates: list[Endpoint]) -> bool:
    """A candidate carries a prediction that is not the prior's (see the module docstring)."""
    return any(c.prediction is not None and c.prediction.model_source != PRIOR_MODEL_SOURCE for c in candidates)


@plugin(HANDLER_TYPE, ProfileHandler)
class PredictionOptInProfileHandler(Plugin):
    """Per-request opt-in to the predicted profile (``x-prediction-based-scheduling``)."""

    predicted_profile: str = param("predictedProfile", default="predicted", check=_PROFILE_NAME,
                                   doc="profile of opted-in requests (the predicted-latency pipeline)")
    heuristic_profile: str = param("heuristicProfile", default="default", check=_PROFILE_NAME,
                                   doc="profile of the other requests, and of opted-in ones during warm-up")
    prediction_for_all: bool = param("predictionForAll", default=False,
                                     doc="true: a request without the header is opted in (`false` opts out)")
    heuristic_while_warming_up: bool = param("heuristicWhileWarmingUp", default=True,
                                             doc="opted-in requests take the heuristic profile while no learned "
                                                 "model answers (prior or no predictions)")
    name: str = HANDLER_TYPE

    #: the Prometheus family of ``decisions`` (epp_client.metrics)
    DECISION_METRIC: ClassVar[tuple[str, str]] = ("epp_prediction_opt_in_decision",
                                                  "predicted-latency opt-in routing decisions")

    def setup(self) -> None:
        if self.predicted_profile == self.heuristic_profile:
            raise ConfigError(f"{HANDLER_TYPE}.heuristicProfile",
                              f"must differ from predictedProfile, got {self.heuristic_profile!r} for both")
        self.decisions: Counter = Counter()  # (model_name, decision) -> count

    @classmethod
    def parse_params(cls, params: Mapping | None) -> dict:
        return parse_params(cls.owner(), cls.PARAMS, params)

    def required_profiles(self) -> tuple[str, ...]:
        return self.predicted_profile, self.heuristic_profile

    def route(self, request: InferenceRequest, candidates: list[Endpoint]) -> str:
        """``predicted``, ``heuristic`` or ``warm-up`` for this request and these candidates."""
        if not opted_in(request.headers, self.prediction_for_all):
            return HEURISTIC
        if self.heuristic_while_warming_up and not learned_model_answers(candidates):
            return WARM_UP
        return PREDICTED

    def admits(self, request: InferenceRequest, candidates: list[Endpoint]) -> bool:
        return self.route(request, candidates) == PREDICTED

    def run(self, request: InferenceRequest, profiles: Mapping, candidates: list[Endpoint]) -> dict:
        decision = self.route(request, candidates)
        name = self.predicted_profile if decision == PREDICTED else self.heuristic_profile
        result = profiles[name].run(request, candidates)
        if result.picked:
            self.decisions[(request.target_model or "unknown", decision)] += 1
        return {name: result}

    def primary(self, results: Mapping) -> str:
        return next(iter(results), self.predicted_profile)

    def decision(self, request: InferenceRequest, results: Mapping) -> str:
        if self.predicted_profile in results:
            return PREDICTED
        return WARM_UP if opted_in(request.headers, self.prediction_for_all) else HEURISTIC

    def headers(self, profile_results: Mapping) -> dict[str, str | None]:
        return {}


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
    if any(isinstance(p, Mapping) and p.get("type") == HANDLER_TYPE for p in plugins):
        raise ConfigError("plugins", f"already has a {HANDLER_TYPE}")
    profiles = cfg.get("schedulingProfiles")
    if not isinstance(profiles, list) or len(profiles) != 1 or not isinstance(profiles[0], Mapping):
        raise ConfigError("schedulingProfiles", "an opt-in config is made from a config with exactly one profile")
    predicted = dict(profiles[0], name="predicted")
    # the heuristic profile: llm-d's default one (epp_client.framework.profile.default_profile)
    default = default_profile()
    scorers = [(f"heuristic-{type(sc).TYPE}", type(sc).TYPE, w) for sc, w in default.scorers]
    picker = f"heuristic-{type(default.picker).TYPE}"
    plugins += [{"name": name, "type": ptype} for name, ptype, _ in scorers]
    plugins.append({"name": picker, "type": type(default.picker).TYPE})
    plugins.append({"type": HANDLER_TYPE, "parameters": {"predictionForAll": prediction_for_all,
                                                           "heuristicWhileWarmingUp": heuristic_while_warming_up}})
    refs = [{"pluginRef": name, "weight": w} for name, _, w in scorers]
    heuristic = {"name": "default", "plugins": [*refs, {"pluginRef": picker}]}
    cfg["plugins"] = plugins
    cfg["schedulingProfiles"] = [predicted, heuristic]
    return yaml.safe_dump(cfg, sort_keys=False)
