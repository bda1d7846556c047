"""Data types shared by every plugin (``docs/plugins.md`` Part A.1).

Plain dataclasses; every field has a default so tests and routers can build partial
ones. One :class:`Endpoint` per data-parallel rank (B4.6): ``name`` is unique per rank
(for example ``<pod>-rank-<i>``), and every per-endpoint map in the plugins is keyed by it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epp_client.engine.columns import DecodingView
    from epp_client.engine.features import EngineView
    from epp_client.engine.twin import Running

#: The scheduling profile that picks the prefill endpoint under P/D disaggregation.
PREFILL_PROFILE = "prefill"
#: ``model_source`` of predictions made by the prior, before any model is trained (wire API).
PRIOR_MODEL_SOURCE = "prior"

#: SLO request headers: the new name first, then the deprecated alias (B §1.3, B3).
TTFT_SLO_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
TPOT_SLO_HEADERS = ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")


class ConfigError(ValueError):
    """An invalid plugin or scheduler parameter; ``param`` names it."""

    def __init__(self, param: str, msg: str) -> None:
        self.param = param
        self.msg = msg
        super().__init__(f"{param}: {msg}")


@dataclass
class EndpointMetrics:
    """Scraped server metrics (a scheduling-time snapshot). ``kv_cache_usage`` is a fraction."""

    kv_cache_usage: float = 0.0
    waiting_queue_size: int = 0
    running_requests_size: int = 0
    active_lora_adapters: frozenset = frozenset()
    waiting_lora_adapters: frozenset = frozenset()
    max_active_lora: int = 0
    cache_num_blocks: int = 0       # KV cache blocks the engine has (vllm:cache_config_info num_gpu_blocks; 0: unknown)
    cache_block_size: int = 0       # tokens per engine KV block (its block_size label; 0: unknown)

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the engine's KV cache holds (0: not reported)."""
        return self.cache_num_blocks * self.cache_block_size


@dataclass
class PrefixMatch:
    """PrefixCacheMatchInfo: how many of the request's prompt blocks the endpoint caches."""

    match_blocks: int = 0
    total_blocks: int = 0
    block_size_tokens: int = 16

    @property
    def score(self) -> float:
        # A.2.7: total 0 gives 0, never +Inf (upstream divides anyway)
        if self.total_blocks <= 0:
            return 0.0
        s = self.match_blocks / self.total_blocks
        return 0.0 if s != s else s


@dataclass
class EncoderMatch:
    """EncoderCacheMatchInfo (multimodal): request input size and the part this endpoint caches."""

    input_size: int = 0
    matched_size: int = 0


@dataclass
class InFlightLoad:
    """Requests and uncached prompt tokens this router has in flight on an endpoint (B4.4)."""

    tokens: int = 0
    requests: int = 0


@dataclass
class LatencyPrediction:
    """LatencyPredictionInfo written by the producer onto each candidate (B1.3, B1.5)."""

    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    ttft_headroom_ms: float = 0.0
    tpot_headroom_ms: float = 0.0
    ttft_valid: bool = False
    tpot_valid: bool = False
    dispatched_request_count: int = 0
    model_version: str = ""
    model_source: str = ""  # "learned", "prior", or "" when the predictor did not say
    #: the requests this router has running on the endpoint, in dispatch order, as the engine twin
    #: sees them (:class:`epp_client.engine.twin.Running`: decode time and tokens so far, TPOT SLO,
    #: context, prompt tokens still to prefill); streaming mode only: the function computing them,
    #: called once, on first use (:meth:`running_decodes`)
    decoding: Callable[[], tuple[Running, ...]] | None = None
    #: the same view of every endpoint at once, as columns (:class:`epp_client.engine.columns.DecodingView`;
    #: streaming mode, the producer's): one function per decision, shared by the candidates, computing it once
    decoding_columns: Callable[[], DecodingView] | None = None
    #: the engine's prompt tokens per token of ``input_tokens`` (the gateway's estimate), learned by
    #: the producer from the responses' usage (:class:`epp_client.engine.prompt_scale.PromptScale`):
    #: the engine twin counts prompts in the engine's tokens
    prompt_scale: float = 1.0
    _decodes: tuple[Running, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def running_decodes(self) -> tuple[Running, ...]:
        """``decoding()``, computed once (``()`` without it)."""
        if self._decodes is None:
            self._decodes = self.decoding() if self.decoding is not None else ()
        return self._decodes

    @property
    def is_valid(self) -> bool:
        return self.ttft_valid and self.tpot_valid


@dataclass(eq=False)
class Endpoint:
    """One schedulable target: a pod, or one data-parallel rank of it."""

    name: str = ""
    address: str = ""
    port: int = 0
    rank: int = 0
    labels: dict = field(default_factory=dict)
    metrics: EndpointMetrics | None = field(default_factory=EndpointMetrics)
    prefix_match: PrefixMatch | None = None
    inflight: InFlightLoad | None = None
    prediction: LatencyPrediction | None = None
    encoder_match: EncoderMatch | None = None

    def clone(self) -> Endpoint:
        """Per-request copy (the director clones candidates at scheduling time)."""
        new = object.__new__(Endpoint)
        new.__dict__.update(self.__dict__)
        return new

    @property
    def host_port(self) -> str:
        return f"{self.address}:{self.port}"


def parse_slo(headers: dict, names: tuple[str, str]) -> float:
    """Float SLO from the first header *present* (new name, then alias); 0 when invalid.

    Like upstream's general float parser, ``1e3``, negatives, NaN and Inf parse.
    """
    for name in names:
        if name in headers:
            value = headers[name]
            try:
                return float(str(value).strip())
            except (TypeError, ValueError):
                return 0.0
    return 0.0


@dataclass
class InferenceRequest:
    """The request as the scheduler sees it. Header names must be lower-case.

    ``priority < 0`` means sheddable. ``max_tokens`` (client ``max_tokens``) is only used
    by the in-flight accounting when estimated output tokens are enabled.
    """

    request_id: str = ""
    headers: dict = field(default_factory=dict)
    priority: int = 0
    input_tokens: int = 0
    target_model: str = ""
    streaming: bool = False
    max_tokens: int | None = None
    waited_ms: float = 0.0      # how long the router has held the request before this scheduling
    #: the engine twin's view of the request at dispatch (epp_client.engine.features.EngineView),
    #: set by a decode-harm plugin's pre_request, sent by the producer with its TTFT training entry
    engine_view: EngineView | None = None

    @property
    def ttft_slo_ms(self) -> float:
        """The TTFT SLO left to the engine: the header's less ``waited_ms`` (at least 1 ms; 0: none)."""
        slo = parse_slo(self.headers, TTFT_SLO_HEADERS)
        return max(1.0, slo - self.waited_ms) if slo > 0 and self.waited_ms > 0 else slo

    @property
    def tpot_slo_ms(self) -> float:
        return parse_slo(self.headers, TPOT_SLO_HEADERS)

    @property
    def sheddable(self) -> bool:
        return self.priority < 0


class HoldRequest(Exception):
    """Raised by a filter: no endpoint should take the request now, and it can wait; the
    scheduler answers a held result and the caller schedules it again ``retry_after_s`` later
    (with ``waited_ms`` set), or answers 429 with Retry-After if it cannot hold requests."""

    def __init__(self, retry_after_s: float, reason: str = "held") -> None:
        super().__init__(f"{reason}: retry after {retry_after_s:g} s")
        self.retry_after_s = retry_after_s
        self.reason = reason


class ShedRequest(Exception):
    """Raised by a filter: the request is refused now (status 429 with ``reason``, e.g. a
    sheddable request no endpoint can serve within its SLO); the caller answers it with
    Retry-After and never schedules it again itself."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Admission:
    """Admission decision. A.2.2: a denial is ``Admission(False, reason, status=429)``."""

    admitted: bool = True
    reason: str = ""
    status: int = 200


ADMITTED = Admission(True)


#: Pod annotation listing the active data-parallel ports (B4.6), then its legacy alias.
ACTIVE_PORTS_ANNOTATIONS = ("llm-d.ai/active-ports", "inference.networking.k8s.io/active-ports")


def rank_endpoints(pod: str, address: str, target_ports: list[int], annotations: dict | None = None,
                   labels: dict | None = None) -> list[Endpoint]:
    """One Endpoint per data-parallel rank (B4.6): port ``target_ports[i]`` becomes
    ``<pod>-rank-<i>`` with ``rank = i``. When the active-ports annotation is present,
    only the listed ports that are also target ports become endpoints."""
    annotations = annotations or {}
    active = None
    for key in ACTIVE_PORTS_ANNOTATIONS:
        if key in annotations:
            active = set()
            for part in str(annotations[key]).split(","):
                part = part.strip()
                if part.isdigit():
                    active.add(int(part))
            break
    return [Endpoint(name=f"{pod}-rank-{i}", address=address, port=port, rank=i, labels=dict(labels or {}))
            for i, port in enumerate(target_ports) if active is None or port in active]


def uncached_prompt_tokens(endpoint: Endpoint, input_tokens: int) -> int:
    """The prompt tokens ``endpoint`` would prefill: those of the blocks its prefix match does not
    cover (all of them without a match)."""
    pm = endpoint.prefix_match
    if pm is None:
        return input_tokens
    total = pm.total_blocks * pm.block_size_tokens
    return (pm.total_blocks - pm.match_blocks) * pm.block_size_tokens + max(0, input_tokens - total)
