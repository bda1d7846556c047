"""Named scenarios: a workload, a cluster and SLOs (``latency-predictor simulate --list``)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from . import workloads as W
from .adapters import LoraSpec
from .lora_workloads import LoraSetup, spike_adapters, spike_arrivals, zipf_adapters
from .stepmodel import ServerSpec, get_preset

POLICIES = ("random", "round-robin", "least-queue", "llmd-default", "llmd-token-load",
            "predicted-upstream", "predicted-llmd", "predicted", "oracle")
LOADS = (0.5, 0.8, 1.0, 1.2)

#: Standard SLO: TTFT within 1 s plus 3x the prompt's prefill time on an idle server,
#: TPOT within 100 ms (chosen before any policy comparison; see the report's header).
STANDARD_SLO = (W.SloClass(ttft_ms=1000.0, ttft_slowdown=3.0, tpot_ms=100.0),)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    workload: Callable[[int], list]            # seed -> arrivals (native time scale)
    servers: tuple[ServerSpec, ...]
    slo_classes: tuple = STANDARD_SLO
    scrape_interval_s: float = 0.05            # the idealised scrapes (``--ideal``); realism scrapes per server
    scrape_delay_s: float = 0.0
    deadline_s: float | None = None            # the clients' deadline (s after arrival); None: the default
    notes: tuple[str, ...] = field(default=())
    programs: Callable[[int], list] | None = None   # closed-loop program scenarios: seed -> programs
    lora: LoraSetup | None = None              # adapter slots + each request's adapter (multi-LoRA)
    pd: object = None                          # pd_bench.PDSetup: prefill/decode pools of the same GPU count
    flow_detector: tuple = ()                  # the <router>+<ordering> policies' saturation detector
                                               # ((key, value) pairs: type + camelCase parameters);
                                               # () = llm-d's utilization detector with its defaults

    def cluster_desc(self) -> str:
        names: dict[str, int] = {}
        for s in self.servers:
            key = s.name if s.speed == 1.0 else f"{s.name} (speed {s.speed:g})"
            names[key] = names.get(key, 0) + 1
        return ", ".join(f"{n} x {k}" for k, n in names.items())


def _pool(preset: str, n: int, **kw) -> tuple[ServerSpec, ...]:
    return tuple(get_preset(preset, **kw) for _ in range(n))


def _mooncake(name: str, limit: int | None = None):
    return lambda seed: W.load_mooncake(name, limit=limit, seed=seed)


SCENARIOS: dict[str, Scenario] = {}


def _add(s: Scenario) -> None:
    SCENARIOS[s.name] = s


_add(Scenario("standard", "Mooncake FAST'25 conversation trace (12,031 requests, real prefix-block hashes) "
              "on 8 Llama-3-8B / A100 servers", _mooncake("conversation"), _pool("llama3-8b-a100", 8)))
_add(Scenario("standard-small", "first 800 requests of the Mooncake conversation trace on 4 Llama-3-8B / A100 "
              "servers (smoke tests)", _mooncake("conversation", 800), _pool("llama3-8b-a100", 4)))
_add(Scenario("mooncake-synthetic", "Mooncake FAST'25 synthetic trace (3,993 requests, Poisson, heavy prefix "
              "sharing) on 8 Llama-3-8B / A100 servers", _mooncake("synthetic"), _pool("llama3-8b-a100", 8)))
_add(Scenario("heterogeneous", "Mooncake conversation trace on 4 normal and 4 slow (speed 0.6) Llama-3-8B / A100 "
              "servers", _mooncake("conversation"),
              _pool("llama3-8b-a100", 4) + _pool("llama3-8b-a100", 4, speed=0.6)))
_add(Scenario("azure-code", "Azure LLM inference 2023 code trace (8,819 requests, very bursty) on 4 Llama-2-7B / "
              "H100 servers; prefixes are SYNTHETIC (shared system prompts, the trace has none)",
              lambda seed: W.load_azure("code", seed=seed), _pool("llama2-7b-h100", 4),
              slo_classes=(W.SloClass(ttft_ms=500.0, ttft_slowdown=3.0, tpot_ms=50.0),)))
_add(Scenario("sessions", "synthetic multi-turn chat sessions (growing context, shared system prompt) on 4 "
              "Llama-3-8B / A100 servers: prefix-heavy", lambda seed: W.synthetic_sessions(1500, rate=0.5, seed=seed),
              _pool("llama3-8b-a100", 4)))
_add(Scenario("high-kv", "long prompts (median 16k tokens, Poisson) on 2 Llama-3-8B / A100 servers with a 200k-token "
              "KV cache: high KV use, long queues, preemptions",
              lambda seed: W.synthetic_poisson(2500, rate=1.0, seed=seed, input_median=16_000, input_sigma=0.6,
                                               output_median=400, max_input=100_000, system_prompt_share=0.3),
              _pool("llama3-8b-a100", 2, kv_capacity_tokens=200_000)))
_add(Scenario("ramp", "chat-like requests (median prompt 2k tokens, Poisson) whose rate rises linearly over the run; "
              "at load L the load ramps from 0.53 L to 1.47 L (load 0.95: 0.5 -> 1.4 of capacity) on 2 Llama-3-8B / "
              "A100 servers with a 120k-token KV cache: queues, KV pressure and preemptions build past anything "
              "seen earlier", lambda seed: W.synthetic_ramp(2400, seed=seed, input_median=2000, input_sigma=0.8,
                                                              output_median=250, system_prompt_share=0.3),
              _pool("llama3-8b-a100", 2, kv_capacity_tokens=120_000)))
_add(Scenario("llama70b", "Mooncake conversation trace (first 4,000 requests) on 4 Llama-2-70B / H100 TP4 servers",
              _mooncake("conversation", 4000), _pool("llama2-70b-h100-tp4", 4),
              slo_classes=(W.SloClass(ttft_ms=1000.0, ttft_slowdown=3.0, tpot_ms=120.0),)))

# multi-LoRA (docs/multi-lora.md): one base model, adapters in 4 slots per server
_add(Scenario("multi-lora", "first 2,000 requests of the Mooncake conversation trace (real arrivals) on 8 "
              "Llama-3-8B / A100 servers with 4 LoRA slots each; one adapter per conversation, drawn Zipf-like "
              "(1/k) from 32",
              _mooncake("conversation", 2000), _pool("llama3-8b-a100", 8),
              lora=LoraSetup(LoraSpec(max_loras=4), zipf_adapters(32))))
_add(Scenario("lora-spike", "a fresh pool (no adapter loaded) of 8 Llama-3-8B / A100 servers with 4 LoRA slots "
              "each; first 1,200 Mooncake conversation requests for 8 adapters (Zipf-like), requests 300-699 arrive "
              "3x faster and ask for 16 adapters never seen before",
              spike_arrivals, _pool("llama3-8b-a100", 8), lora=LoraSetup(LoraSpec(max_loras=4), spike_adapters)))

# P/D disaggregation (docs/pd.md): the same 8 GPUs as one aggregated pool or as 5 prefill + 3 decode
from .pd_bench import PDSetup  # noqa: E402

_add(Scenario("pd", "long prompts (median 6k tokens, 30% behind shared system prompts, Poisson) with 250-token "
              "answers on 8 Llama-3-8B / A100: aggregated, or 5 prefill + 3 decode servers with KV over 200 Gb/s "
              "RDMA (pd-* policies)",
              lambda seed: W.synthetic_poisson(600, rate=1.0, seed=seed, input_median=6000, input_sigma=0.6,
                                               output_median=250, max_input=32_000, system_prompt_share=0.3),
              _pool("llama3-8b-a100", 8), pd=PDSetup(5, 3),
              slo_classes=(W.SloClass(ttft_ms=1000.0, ttft_slowdown=3.0, tpot_ms=40.0),)))


def _agentic_programs(seed: int) -> list:
    from .agentic import programs

    return programs(360, seed=seed)


_add(Scenario("agentic", "agentic programs (Poisson arrivals; 2-48 turns, median 8; tool/think time median 2 s "
              "between turns; each turn's prompt = the previous context + answer + a tool result, so the "
              "previous turn is the shared prefix) on 4 Llama-3-8B / A100 servers with a 300k-token KV cache; "
              "load 1.0 = the pool's capacity with a perfect prefix cache", lambda seed: [],
              _pool("llama3-8b-a100", 4, kv_capacity_tokens=300_000), programs=_agentic_programs,
              flow_detector=(("type", "concurrency-detector"), ("maxConcurrency", 16))))


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
