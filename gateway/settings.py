"""The gateway's one validated settings object (CLI flags, then LATENCY_GATEWAY_* env)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit


class SettingsError(ValueError):
    def __init__(self, name: str, msg: str) -> None:
        self.name = name
        super().__init__(f"{name}: {msg}")


def _parse_url(name: str, u: str) -> str:
    u = u.strip().rstrip("/")
    p = urlsplit(u)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise SettingsError(name, f"not an http(s) URL: {u!r}")
    try:
        p.port
    except ValueError:
        raise SettingsError(name, f"bad port in {u!r}") from None
    return u


@dataclass
class GatewaySettings:
    endpoints: list[str]
    host: str = "127.0.0.1"
    port: int = 8080
    config: str | None = None                 # EndpointPickerConfig YAML for epp_client
    prediction_urls: list[str] = field(default_factory=list)
    training_url: str | None = None
    scrape_interval_s: float = 0.2
    scrape_timeout_s: float = 1.0
    connect_timeout_s: float = 2.0
    first_byte_timeout_s: float = 120.0       # dispatch -> first body byte (whole reply when not streaming)
    idle_timeout_s: float = 60.0              # between two body chunks
    request_timeout_s: float = 600.0          # whole request
    max_attempts: int = 2                     # endpoints tried before the first byte
    max_body_bytes: int = 8 << 20
    max_concurrency: int = 1024               # requests in flight through the gateway
    block_size_tokens: int = 64
    max_prefix_blocks: int = 2048
    lru_capacity_per_endpoint: int = 31250
    record_capacity: int = 20000              # per-request records kept for /gateway/requests
    objectives: dict[str, int] = field(default_factory=dict)  # x-llm-d-inference-objective -> priority

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise SettingsError("endpoints", "at least one endpoint URL is required")
        self.endpoints = [_parse_url("endpoints", u) for u in self.endpoints]
        if len(set(self.endpoints)) != len(self.endpoints):
            raise SettingsError("endpoints", "duplicate endpoint URL")
        self.prediction_urls = [_parse_url("prediction_urls", u) for u in self.prediction_urls if u.strip()]
        if self.training_url:
            self.training_url = _parse_url("training_url", self.training_url)
        if not (0 <= self.port <= 65535):
            raise SettingsError("port", "must be in 0..65535")
        for name in ("scrape_interval_s", "scrape_timeout_s", "connect_timeout_s",
                     "first_byte_timeout_s", "idle_timeout_s", "request_timeout_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0):
                raise SettingsError(name, "must be a number > 0")
        for name in ("max_attempts", "max_body_bytes", "max_concurrency", "block_size_tokens",
                     "max_prefix_blocks", "lru_capacity_per_endpoint", "record_capacity"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise SettingsError(name, "must be an integer >= 1")
        if self.config is not None and not os.path.isfile(self.config):
            raise SettingsError("config", f"no such file: {self.config}")

    @classmethod
    def from_env_and_args(cls, args: dict, env: dict[str, str] | None = None) -> "GatewaySettings":
        """``args`` (argparse dict, None = unset) wins over the environment."""
        env = dict(os.environ if env is None else env)

        def pick(key: str, env_name: str, conv, default=None):
            v = args.get(key)
            if v is not None:
                return v
            if env_name in env and env[env_name].strip():
                try:
                    return conv(env[env_name])
                except ValueError:
                    raise SettingsError(env_name, f"bad value {env[env_name]!r}") from None
            return default

        def urls(s: str) -> list[str]:
            return [x for x in s.split(",") if x.strip()]

        kw: dict = {}
        kw["endpoints"] = pick("endpoints", "LATENCY_GATEWAY_ENDPOINTS", urls, [])
        kw["prediction_urls"] = pick("prediction_urls", "PREDICTION_SERVER_URL", urls, [])
        tu = pick("training_url", "TRAINING_SERVER_URL", str, None)
        kw["training_url"] = tu
        for key, conv in (("host", str), ("port", int), ("config", str),
                          ("scrape_interval_s", float), ("first_byte_timeout_s", float),
                          ("idle_timeout_s", float), ("request_timeout_s", float),
                          ("connect_timeout_s", float), ("max_attempts", int),
                          ("block_size_tokens", int), ("max_concurrency", int)):
            v = pick(key, "LATENCY_GATEWAY_" + key.upper(), conv, None)
            if v is not None:
                kw[key] = v
        obj = args.get("objectives")
        if obj:
            kw["objectives"] = obj
        return cls(**kw)
