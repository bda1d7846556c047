"""``disagg-profile-handler`` (B4.7): which scheduling profiles run for a request, in
which order, and the headers that tell the decode side where its prefill (and encode)
work was scheduled.

decode-first (default): run decode; if it picked nothing, stop (the request fails). If
an encode profile exists and the encode decider says yes for the decode pick, run
encode; if a prefill profile exists and the prefill decider says yes, run prefill. A
stage whose profile picked nothing (e.g. no endpoint with a prefill role) is dropped,
as a failed profile is upstream, so the request is served decode-only. A prefill
decider with ``judges_prefill_pick = True`` (this project's ``predicted-pd-decider``;
the upstream ones have none) is asked after the prefill profile ran, with its pick as
the only candidate, and a yes keeps that pick: the decider judges the prefill endpoint
the request would really use, not the pool's best.
prefill-first: run prefill whenever its profile exists (no prefill decider allowed),
then encode if its decider says yes (asked without a decode endpoint), then decode.

Each completed request counts one decision (``decode-only``, ``prefill-decode``,
``encode-decode``, ``encode-prefill-decode``) in ``decisions[(model, type)]``; the model
is ``unknown`` when the request names none. Nothing is counted when decode fails.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from epp_client.framework.protocols import ProfileHandler
from epp_client.framework.registry import plugin
from epp_client.types import ConfigError, Endpoint, InferenceRequest

HANDLER_TYPE = "disagg-profile-handler"

PREFILL_HEADER = "x-prefiller-host-port"
ENCODER_HEADER = "x-encoder-hosts-ports"

DECODE_FIRST = "decode-first"
PREFILL_FIRST = "prefill-first"

DECODE_ONLY = "decode-only"
PREFILL_DECODE = "prefill-decode"
ENCODE_DECODE = "encode-decode"
ENCODE_PREFILL_DECODE = "encode-prefill-decode"

_NESTED = {"stageOrder", "profiles", "deciders"}
_LEGACY = {"stageOrder", "decodeProfile", "prefillProfile", "encodeProfile", "prefillDeciderPluginName",
           "encodeDeciderPluginName", "deciderPluginName"}


def parse_stage_order(value: Any) -> str:
    """Upstream's lenient spelling: case, '-' and '_' are ignored; '' is decode-first."""
    if not isinstance(value, str):
        raise ConfigError("disagg-profile-handler.stageOrder", f"must be a string, got {value!r}")
    key = value.lower().replace("-", "").replace("_", "")
    if key in ("", "decodefirst", "decode"):
        return DECODE_FIRST
    if key in ("prefillfirst", "prefill"):
        return PREFILL_FIRST
    raise ConfigError("disagg-profile-handler.stageOrder",
                      f"must be {DECODE_FIRST!r} or {PREFILL_FIRST!r}, got {value!r}")


def decision_type(encode_used: bool, prefill_used: bool) -> str:
    if encode_used:
        return ENCODE_PREFILL_DECODE if prefill_used else ENCODE_DECODE
    return PREFILL_DECODE if prefill_used else DECODE_ONLY


def host_port(e: Endpoint) -> str:
    """Go's net.JoinHostPort: an IPv6 address is bracketed."""
    host = f"[{e.address}]" if ":" in e.address else e.address
    return f"{host}:{e.port}"


def _str(owner: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"disagg-profile-handler.{owner}", f"must be a string, got {value!r}")
    return value


def _section(params: Mapping, key: str, allowed: tuple[str, ...]) -> dict:
    sec = params.get(key) or {}
    if not isinstance(sec, Mapping):
        raise ConfigError(f"disagg-profile-handler.{key}", "must be a mapping")
    for k in sec:
        if k not in allowed:
            raise ConfigError(f"disagg-profile-handler.{key}.{k}", f"unknown key (known: {', '.join(allowed)})")
    return {k: _str(f"{key}.{k}", v) for k, v in sec.items()}


@plugin(HANDLER_TYPE, ProfileHandler)
class DisaggProfileHandler:
    """Chooses the profiles that run (decode, prefill, encode) and their headers (B4.7).

    Its parameters are structured (``profiles``, ``deciders``, ``stageOrder``, or the
    deprecated flat names), so it parses them itself (:meth:`parse_params`); decider
    plugin names are resolved by the config builder."""

    def __init__(self, decode_profile: str = "decode", prefill_profile: str = "prefill",
                 encode_profile: str = "encode", prefill_decider: Any = None, encode_decider: Any = None,
                 stage_order: str = DECODE_FIRST, name: str = HANDLER_TYPE) -> None:
        self.stage_order = parse_stage_order(stage_order)
        if self.stage_order == PREFILL_FIRST and prefill_decider is not None:
            raise ConfigError("disagg-profile-handler.deciders.prefill",
                              f"a prefill decider is not supported with stageOrder {PREFILL_FIRST}")
        self.decode_profile = decode_profile or "decode"
        self.prefill_profile = prefill_profile or "prefill"
        self.encode_profile = encode_profile or "encode"
        self.prefill_decider = prefill_decider
        self.encode_decider = encode_decider
        self.name = name
        self.decisions: Counter = Counter()  # (model_name, decision_type) -> count

    @staticmethod
    def parse_params(params: Mapping | None) -> dict:
        """camelCase parameters (nested, or the deprecated flat names; not mixed) ->
        constructor kwargs, with the decider *plugin names* under ``prefill_decider`` /
        ``encode_decider`` for the config builder to resolve."""
        if params is None:
            return {}
        if not isinstance(params, Mapping):
            raise ConfigError("disagg-profile-handler.parameters", "must be a mapping")
        keys = set(params)
        out: dict = {}
        if keys <= _NESTED:
            profiles = _section(params, "profiles", ("decode", "prefill", "encode"))
            deciders = _section(params, "deciders", ("prefill", "encode"))
            out.update({f"{k}_profile": v for k, v in profiles.items() if v})
            out.update({f"{k}_decider": v for k, v in deciders.items() if v})
        elif keys <= _LEGACY:
            for key, kw in (("decodeProfile", "decode_profile"), ("prefillProfile", "prefill_profile"),
                            ("encodeProfile", "encode_profile"), ("prefillDeciderPluginName", "prefill_decider"),
                            ("encodeDeciderPluginName", "encode_decider")):
                if params.get(key):
                    out[kw] = _str(key, params[key])
            if params.get("deciderPluginName") and "prefill_decider" not in out:
                out["prefill_decider"] = _str("deciderPluginName", params["deciderPluginName"])
        else:
            bad = sorted(keys - _NESTED - _LEGACY) or sorted(keys & (_LEGACY - _NESTED))
            raise ConfigError(f"disagg-profile-handler.{bad[0]}",
                              "unknown parameter, or nested (profiles/deciders) and deprecated flat names mixed")
        if "stageOrder" in params:
            out["stage_order"] = parse_stage_order(params["stageOrder"])
        if out.get("stage_order") == PREFILL_FIRST and out.get("prefill_decider"):
            raise ConfigError("disagg-profile-handler.deciders.prefill",
                              f"a prefill decider is not supported with stageOrder {PREFILL_FIRST}")
        return out

    #: the Prometheus family of ``decisions`` (epp_client.metrics)
    DECISION_METRIC = ("llm_d_epp_disagg_decision", "disaggregation routing decisions")

    def required_profiles(self) -> tuple[str, ...]:
        return (self.decode_profile,)

    def admits(self, request: InferenceRequest, candidates: list[Endpoint]) -> bool:
        return True

    def primary(self, results: Mapping[str, Any]) -> str:
        return self.decode_profile

    def decision(self, request: InferenceRequest, results: Mapping[str, Any]) -> str:
        return decision_type(self.encode_profile in results, self.prefill_profile in results)

    # -- Pick + ProcessResults ----------------------------------------------------------
    def run(self, request: InferenceRequest, profiles: Mapping[str, Any], candidates: list[Endpoint]) -> dict:
        """Run the stages; returns {profile name: ProfileResult} of the stages that picked
        something (decode first). No decode entry (or an empty one) means failure."""
        if self.stage_order == PREFILL_FIRST:
            return self._prefill_first(request, profiles, candidates)
        return self._decode_first(request, profiles, candidates)

    def _stage(self, name: str, request, profiles, candidates, results: dict) -> bool:
        res = profiles[name].run(request, candidates)
        if res.picked:
            results[name] = res
            return True
        return False

    def _decode_first(self, request, profiles, candidates) -> dict:
        results: dict = {}
        if self.decode_profile not in profiles:
            return results
        decode = profiles[self.decode_profile].run(request, candidates)
        results[self.decode_profile] = decode
        if not decode.picked:
            return results
        target = decode.picked[0]
        encode_used = prefill_used = False
        if self.encode_profile in profiles and self.encode_decider is not None \
                and self.encode_decider.disaggregate(request, target, candidates):
            encode_used = self._stage(self.encode_profile, request, profiles, candidates, results)
        if self.prefill_profile in profiles and self.prefill_decider is not None:
            if getattr(self.prefill_decider, "judges_prefill_pick", False):
                # the decider judges the path the request would take: the prefill profile
                # runs first and the decider is asked about its pick only
                pre = profiles[self.prefill_profile].run(request, candidates)
                if self.prefill_decider.disaggregate(request, target, list(pre.picked[:1])) and pre.picked:
                    results[self.prefill_profile] = pre
                    prefill_used = True
            elif self.prefill_decider.disaggregate(request, target, candidates):
                prefill_used = self._stage(self.prefill_profile, request, profiles, candidates, results)
        self._count(request, encode_used, prefill_used)
        return results

    def _prefill_first(self, request, profiles, candidates) -> dict:
        results: dict = {}
        prefill_used = encode_used = False
        if self.prefill_profile in profiles:
            prefill_used = self._stage(self.prefill_profile, request, profiles, candidates, results)
        if self.encode_profile in profiles and self.encode_decider is not None \
                and self.encode_decider.disaggregate(request, None, candidates):
            encode_used = self._stage(self.encode_profile, request, profiles, candidates, results)
        if self.decode_profile not in profiles:
            return {}
        decode = profiles[self.decode_profile].run(request, candidates)
        results = {self.decode_profile: decode, **results}
        if decode.picked:
            self._count(request, encode_used, prefill_used)
        return results

    def _count(self, request: InferenceRequest, encode_used: bool, prefill_used: bool) -> None:
        self.decisions[(request.target_model or "unknown", decision_type(encode_used, prefill_used))] += 1

    # -- PreRequest ---------------------------------------------------------------------
    def headers(self, profile_results: Mapping[str, Any]) -> dict[str, str | None]:
        """Header values to set (``None``: remove the header, the stage did not run)."""
        pre = profile_results.get(self.prefill_profile)
        enc = profile_results.get(self.encode_profile)
        return {
            PREFILL_HEADER: host_port(pre.picked[0]) if pre is not None and pre.picked else None,
            ENCODER_HEADER: ",".join(host_port(e) for e in enc.picked) if enc is not None and enc.picked else None,
        }
