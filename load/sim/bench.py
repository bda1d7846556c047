"""Run a scenario: every policy on the same arrivals, at each load level."""
from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import workloads as W
from .engine import ClusterConfig, Simulation
from .harm_oracle import HarmOracleRouter
from .lora_v1 import LoraV1Router
from .realism import DEFAULT_DEADLINE_S, Realism
from .report import summarize
from .routers import NATIVE as _NATIVE
from .scenarios import Scenario

#: multi-LoRA policies (docs/multi-lora.md): the v1 baseline here, the llm-d ones in epp_routers
LORA_EPP_POLICIES = ("llmd-lora", "llmd-lora-history", "predicted-lora-history")
NATIVE = {**_NATIVE, "lora-v1": LoraV1Router, "oracle-harm": HarmOracleRouter}

EPP_POLICIES = ("llmd-default", "llmd-token-load", "predicted-upstream", "predicted-llmd", "predicted",
                *LORA_EPP_POLICIES)
#: the policies with a predicted-latency pipeline (the ones ``opt_in_share`` applies to)
PREDICTED_POLICIES = ("predicted-upstream", "predicted-llmd", "predicted", "predicted-lora-history")


@dataclass
class RunOptions:
    seed: int = 0
    limit: int | None = None               # cap on requests (quick runs)
    predictor_url: str | None = None       # predicted policies against real servers
    training_url: str | None = None
    retrain_interval_s: float = 60.0       # simulated seconds between retrains (in-process mode)
    record_trace: object | None = None     # a file-like object receiving JSONL training entries
    epp_config: str | None = None          # EndpointPickerConfig YAML for the predicted policies
    opt_in_share: float | None = None      # predicted policies: share of requests opted in to prediction
    true_latencies: bool = False           # predicted policies: the simulator's true latencies, no models
    true_harm: str = ""                    # predicted policies: harm plugins count the simulator's true harm:
                                           # "all", "harm" or "own" (harm_oracle.TRUE_HARM_PARTS); "": off
    true_harm_probe: int = 4               # decode steps past the first token the true harm is judged at
    flow_ttl_s: float = 60.0               # request TTL of the "<router>+<ordering>" flow-control policies
    flow_detector: dict = field(default_factory=dict)   # their saturation detector: type + camelCase parameters
    flow_params: dict = field(default_factory=dict)     # program-aware-fairness parameters of their las/turn-priority
    ideal: bool = False                    # the idealised world (``--ideal``): no realism.Realism
    deadline_s: float | None = None        # client deadline (s after arrival; 0: none); None: the scenario's
    stop_below: float | None = None        # end a run once its SLO attainment is certainly below this (capacity
                                           # probes; not for program scenarios); None: run to the end
    extra: dict = field(default_factory=dict)


def realism_for(scenario: Scenario, opts: RunOptions) -> Realism | None:
    """The realism a run lives with (None with ``opts.ideal``): the run's seed, and the client
    deadline of ``opts``, else of the scenario, else the gateway's first-byte timeout."""
    if opts.ideal:
        return None
    deadline = opts.deadline_s if opts.deadline_s is not None else scenario.deadline_s
    return Realism(seed=opts.seed, deadline_s=DEFAULT_DEADLINE_S if deadline is None else deadline)


def run_key(scenario: Scenario, opts: RunOptions, engine: str, requests: int, capacity_rps: float) -> dict:
    """What decides a run's figures besides its load and policy (results.json ``meta.run_key``):
    two runs with equal keys at the same (load, policy) are the same run, so ``simulate
    --capacity --from-sweep`` takes a sweep's runs as probes."""
    skip = ("record_trace", "stop_below", "training_url")
    return {"scenario": scenario.name, "engine": engine, "requests": requests, "capacity_rps": capacity_rps,
            **{f.name: getattr(opts, f.name) for f in dataclasses.fields(opts) if f.name not in skip}}


def cluster_for(scenario: Scenario, servers: Sequence, opts: RunOptions, lora=None) -> ClusterConfig:
    """The simulated cluster of a run: realism's per-server scrapes, or the scenario's idealised ones."""
    realism = realism_for(scenario, opts)
    if realism is None:
        return ClusterConfig(servers, scenario.scrape_interval_s, scenario.scrape_delay_s, lora=lora)
    return ClusterConfig(servers, lora=lora, realism=realism)


def make_router(policy: str, opts: RunOptions, n_servers: int):
    from . import flowsim

    fc = flowsim.split(policy)
    if fc is not None:
        return flowsim.make(policy, make_router(fc[0], opts, n_servers), opts.flow_ttl_s, opts.flow_detector,
                             opts.flow_params)
    if is_pd_policy(policy):
        raise ValueError(f"{policy} runs on P/D pools: use run_one")
    if policy in NATIVE:
        return NATIVE[policy](opts.seed)
    if policy in EPP_POLICIES:
        from . import epp_routers
        router = epp_routers.make(policy, opts, n_servers)
        if opts.epp_config and "flowControl" in opts.epp_config:
            router = flowsim.from_config(router, opts.epp_config)   # the config's own flowControl section
        return router
    raise ValueError(f"unknown policy {policy!r}; known: {', '.join((*NATIVE, *EPP_POLICIES))}")


def _pd_policies() -> tuple[str, ...]:
    from .pd_bench import PD_POLICIES
    return PD_POLICIES


def is_pd_policy(policy: str) -> bool:
    """A P/D policy: one of pd_bench.PD_POLICIES or ``pd-prefix-<N>`` for any N."""
    from .pd_bench import is_pd_policy as check
    return check(policy)


def known_policies() -> tuple[str, ...]:
    return (*NATIVE, *EPP_POLICIES, *_pd_policies())


def is_known(policy: str) -> bool:
    """A plain or P/D policy, or ``<router>+<ordering>`` (flow control in front of a known router)."""
    from . import flowsim

    if is_pd_policy(policy):
        return True

    try:
        fc = flowsim.split(policy)
    except ValueError:
        return False
    return (fc[0] if fc else policy) in known_policies()


def prepare(scenario: Scenario, opts: RunOptions) -> tuple[list, float]:
    """(arrivals, capacity in requests/s); for a program scenario (programs, capacity in programs/s)."""
    if scenario.programs is not None:
        from . import agentic

        progs = scenario.programs(opts.seed)[:opts.limit]
        return progs, agentic.capacity_programs(progs, scenario.servers)
    arrivals = scenario.workload(opts.seed)
    if opts.limit is not None:
        arrivals = arrivals[:opts.limit]
    if not arrivals:
        raise ValueError(f"scenario {scenario.name}: empty workload")
    return arrivals, W.capacity_rps(arrivals, scenario.servers)


def run_one(scenario: Scenario, arrivals: Sequence, capacity: float, load: float, policy: str, opts: RunOptions,
            progress: Callable[[float], None] | None = None):
    """Simulate one (load, policy); returns (metrics, raw latency arrays, router)."""
    if is_pd_policy(policy):
        from . import pd_bench
        return pd_bench.run_one(scenario, arrivals, capacity, load, policy, opts, progress)
    if not opts.flow_detector and scenario.flow_detector:    # the scenario's detector unless one is given
        opts = dataclasses.replace(opts, flow_detector=dict(scenario.flow_detector))
    router = make_router(policy, opts, len(scenario.servers))
    driver = None
    if scenario.programs is not None:      # closed loop: the driver injects each next turn
        from . import agentic
        from .flowsim import FlowSimRouter

        driver = agentic.AgenticDriver(agentic.scaled(arrivals, load * capacity), scenario.slo_classes[0],
                                       scenario.servers[0])
        reqs = driver.initial_requests()
        router = router if isinstance(router, FlowSimRouter) else FlowSimRouter(router)
        router.driver = driver
    else:
        scaled = W.scale_to_rate(arrivals, load * capacity)
        reqs = W.make_requests(scaled, scenario.slo_classes, opts.seed, scenario.servers[0])
        if scenario.lora is not None:
            scenario.lora.apply(reqs, scaled, opts.seed)
    cluster = cluster_for(scenario, scenario.servers, opts, scenario.lora.slots if scenario.lora is not None else None)
    budget = None
    if opts.stop_below is not None and driver is None:
        from .capacity import misses_allowed
        budget = misses_allowed(len(reqs), opts.stop_below)
    sim = Simulation(cluster, reqs, router, tick_interval_s=getattr(router, "tick_interval_s", 0.0),
                     progress=progress, stop_after_misses=budget)
    res = sim.run()
    res.extra.update(router.stats())
    if scenario.lora is not None:
        slots = [s.adapters for s in sim.servers if s.adapters is not None]
        if len(slots) != len(sim.servers):
            raise RuntimeError(f"scenario {scenario.name}: LoRA cluster with a server without adapter slots")
        res.extra["adapter_loads"] = sum(a.loads for a in slots)
        res.extra["adapter_evictions"] = sum(a.evictions for a in slots)
    close = getattr(router, "close", None)
    if close is not None:
        close()
    m, raw = summarize(res, len(scenario.servers))
    if "decided_at" in m:       # stopped on misses: the attainment it can at most reach, below opts.stop_below
        m["slo_attainment"] = 1.0 - m["known_misses"] / len(reqs)
    if driver is not None:
        from .agentic import summarize_programs

        m.update(summarize_programs(driver))
    return m, raw, router


class ProgressBar:
    """One line on stderr: overall progress and the current run."""

    def __init__(self, total_runs: int, stream=sys.stderr, enabled: bool = True) -> None:
        self.total = total_runs
        self.stream = stream
        self.enabled = enabled
        self.done = 0
        self.label = ""
        self.t0 = time.monotonic()
        self._last = 0.0

    def start(self, label: str) -> None:
        self.label = label
        self.update(0.0)

    def update(self, frac: float) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if 0.0 < frac < 1.0 and now - self._last < 0.25:
            return
        self._last = now
        overall = (self.done + frac) / max(1, self.total)
        width = 30
        fill = int(width * overall)
        el = time.monotonic() - self.t0
        self.stream.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {100 * overall:5.1f}% "
                          f"run {self.done + 1}/{self.total} {self.label} {100 * frac:3.0f}% {el:6.0f}s ")
        self.stream.flush()

    def finish_run(self) -> None:
        self.done += 1
        self.update(0.0) if self.done < self.total else None

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
