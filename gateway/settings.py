"""The gateway's one validated settings object: CLI flags, then the variables declared
below (a blank variable counts as unset). Fields declared without a variable are set by
keyword only. The README's gateway table is ``GatewaySettings.doc_table()``."""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from epp_client.plugins.producer.approx_prefix import ApproxPrefixProducer
from epp_client.types import ConfigError
from features.settings import (
    EnvSettings,
    SettingsError,
    boolean,
    host,
    http_url,
    integer,
    number,
    optional,
    setting,
    text,
    token,
    url_list,
)

__all__ = ["GatewaySettings", "SettingsError"]


def _config_file(v: Any) -> str:
    """A well-known config name (epp_client.profiles) or an existing file."""
    from epp_client.profiles import WELL_KNOWN_CONFIGS

    path = text(v)
    if path not in WELL_KNOWN_CONFIGS and not os.path.isfile(path):
        raise ValueError(f"no such file (nor a well-known config: {', '.join(WELL_KNOWN_CONFIGS)}): {path}")
    return path


def _priority(x: Any) -> int:
    """One priority: an integer, or its digits as text (a bool is no priority)."""
    if isinstance(x, bool) or not isinstance(x, int | str):
        raise ValueError(f"must be integers, got {x!r}")
    try:
        return int(x)
    except ValueError:
        raise ValueError(f"must be integers, got {x!r}") from None


def _objectives(v: Any) -> dict[str, int]:
    """Objective name -> priority."""
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise ValueError(f"must map objective names to integer priorities, got {v!r}")
    return {k: _priority(p) for k, p in v.items()}


def _priorities(v: Any) -> list[int]:
    """Comma-separated integers (or a list of them)."""
    items = [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else list(v)
    out = [_priority(x) for x in items]
    if len(out) > 64:
        raise ValueError(f"at most 64 priorities, got {len(out)}")
    return sorted(set(out))


def _prefix_param(name: str) -> tuple[Any, Callable[[Any], Any]]:
    """The default and the validation of the prefix index's parameter ``name`` as
    ``approx-prefix-cache-producer`` declares it (its one declaration); text is read as an integer."""
    spec = next(p for p in ApproxPrefixProducer.PARAMS if p.name == name)

    def parse(v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = int(v.strip())
            except ValueError:
                raise ValueError(f"must be an integer, got {v!r}") from None
        try:
            return spec.validate(ApproxPrefixProducer.TYPE, v)
        except ConfigError as e:
            raise ValueError(e.msg) from None

    return spec.default, parse


_POSITIVE = number(0.0, lo_open=True)
_COUNT = integer(1)


@dataclass
class GatewaySettings(EnvSettings):
    blank_is_unset = True

    endpoints: list[str] = setting("LATENCY_GATEWAY_ENDPOINTS", [], url_list(min_items=1, unique=True),
                                   "comma-separated base URLs of the model servers (`--endpoints`; required)")
    host: str = setting("LATENCY_GATEWAY_HOST", "127.0.0.1", host, "bind address (`--host`)")
    port: int = setting("LATENCY_GATEWAY_PORT", 8080, integer(0, 65535), "listen port, 0 = any free port (`--port`)")
    config: str | None = setting("LATENCY_GATEWAY_CONFIG", None, optional(_config_file),
                                 "EndpointPickerConfig YAML file or well-known name for the epp_client scheduler "
                                 "(`--config`); "
                                 "unset: the built-in router")
    prediction_urls: list[str] = setting("PREDICTION_SERVER_URL", [], url_list(),
                                         "prediction servers, comma-separated (`--prediction-urls`); unset: "
                                         "the EPP client's own default")
    training_url: str | None = setting("TRAINING_SERVER_URL", None, optional(http_url),
                                       "training server (`--training-url`); unset: the EPP client's own default")
    scrape_interval_s: float = setting("LATENCY_GATEWAY_SCRAPE_INTERVAL_S", 0.2, _POSITIVE,
                                       "seconds between endpoint metric scrapes (`--scrape-interval`)")
    scrape_timeout_s: float = setting(None, 1.0, _POSITIVE)
    connect_timeout_s: float = setting("LATENCY_GATEWAY_CONNECT_TIMEOUT_S", 2.0, _POSITIVE,
                                       "seconds to connect to an endpoint")
    first_byte_timeout_s: float = setting("LATENCY_GATEWAY_FIRST_BYTE_TIMEOUT_S", 120.0, _POSITIVE,
                                          "seconds from dispatch to the first body byte (the whole reply when "
                                          "not streaming) (`--first-byte-timeout`)")
    idle_timeout_s: float = setting("LATENCY_GATEWAY_IDLE_TIMEOUT_S", 60.0, _POSITIVE,
                                    "seconds allowed between two body chunks (`--idle-timeout`)")
    request_timeout_s: float = setting("LATENCY_GATEWAY_REQUEST_TIMEOUT_S", 600.0, _POSITIVE,
                                       "seconds for a whole request (`--request-timeout`)")
    max_attempts: int = setting("LATENCY_GATEWAY_MAX_ATTEMPTS", 2, _COUNT,
                                "endpoints tried before the first byte (`--max-attempts`)")
    max_hold_s: float = setting("LATENCY_GATEWAY_MAX_HOLD_S", 30.0, _POSITIVE,
                                "ceiling on the time any filter may hold a request (decode-harm-filter places "
                                "it at its own `maxHoldMs` bound before); past it, 429 `rejected-hold-expired`")
    ejection_base_s: float = setting("LATENCY_GATEWAY_EJECTION_BASE_S", 5.0, _POSITIVE,
                                     "seconds an endpoint is ejected after 3 failed requests in a row; doubled at "
                                     "each ejection without a success in between")
    ejection_max_s: float = setting("LATENCY_GATEWAY_EJECTION_MAX_S", 60.0, _POSITIVE,
                                    "longest ejection, seconds")
    eject_after_failures: int = setting(None, 3, _COUNT)
    max_body_bytes: int = setting(None, 8 << 20, _COUNT)
    max_header_bytes: int = setting("LATENCY_GATEWAY_MAX_HEADER_BYTES", 16384, integer(1024),
                                    "request headers larger than this (names and values) get 431")
    admin_token: str | None = setting("LATENCY_GATEWAY_ADMIN_TOKEN", None, token,
                                      "bearer token for `/gateway/*` (`Authorization: Bearer TOKEN`); unset: "
                                      "those endpoints answer 403")
    priorities: list[int] = setting("LATENCY_GATEWAY_PRIORITIES", [-1, 0], _priorities,
                                    "priorities a client may ask for with `x-llm-d-priority` (besides the "
                                    "`--objective` ones and the flow-control bands); any other value counts as 0",
                                    shown="`-1,0`")
    retry_after_s: int = setting(None, 1, _COUNT)    # Retry-After of the gateway's 429s
    max_concurrency: int = setting("LATENCY_GATEWAY_MAX_CONCURRENCY", 1024, _COUNT,
                                   "requests in flight through the gateway")
    stream_usage: bool = setting("LATENCY_GATEWAY_STREAM_USAGE", True, boolean,
                                 "ask the engine for usage on every stream (`stream_options.include_usage`) to "
                                 "learn each request's true prompt length; the usage chunk a client did not ask "
                                 "for is removed from its stream. false: streams pass through unchanged")
    # the prefix index of the built-in router (approx-prefix-cache-producer's parameters)
    block_size_tokens: int = setting("LATENCY_GATEWAY_BLOCK_SIZE_TOKENS", *_prefix_param("blockSizeTokens"),
                                     "tokens per prefix-cache block (`--block-size-tokens`)")
    max_prefix_blocks: int = setting(None, *_prefix_param("maxPrefixBlocksToMatch"))
    lru_capacity_per_endpoint: int = setting(None, *_prefix_param("lruCapacityPerServer"))
    record_capacity: int = setting(None, 20000, _COUNT)     # per-request records kept for /gateway/requests
    # x-llm-d-inference-objective -> priority (--objective NAME=PRIORITY)
    objectives: dict[str, int] = setting(None, {}, _objectives)

    def check(self) -> None:
        if self.ejection_base_s > self.ejection_max_s:
            raise SettingsError("LATENCY_GATEWAY_EJECTION_BASE_S", f"must not exceed LATENCY_GATEWAY_EJECTION_MAX_S "
                                f"({self.ejection_base_s} > {self.ejection_max_s})")

    @classmethod
    def from_env_and_args(cls, args: Mapping[str, Any], env: Mapping[str, str] | None = None) -> GatewaySettings:
        """``args`` (argparse dict, None = unset; keys that are no setting are ignored)
        wins over the environment."""
        names = {f for f in cls.__dataclass_fields__}
        return cls.from_env(env, **{k: v for k, v in args.items() if k in names})
