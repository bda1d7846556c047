"""Replay one measured run in the simulator: the same requests at the same launch times on a
pool of the preset's servers, behind the router that stands for the stack.

Every request the run sent that is known is replayed: its recorded rows and the requests it lost
(``lost``). Two properties of the stack's request path, both fitted on its lowest-QPS run
(``fit``), complete the engine: the stack's request timeout (a request not finished that long
after its launch is abandoned, and its server frees its slot and KV blocks, as vLLM does when
the gateway resets the stream) and the fixed latency outside the engine's steps (HTTP, the
gateway and its endpoint picker), added to every TTFT. The simulated run is measured as the
real one is: on the requests that finished.

Prompts: the runs record token counts only, not text. A share ``continued`` of the prompts
(fitted, see ``fit``) continue an earlier prompt of the run, as a later turn of a ShareGPT
conversation does: they start with that prompt's tokens (its KV can be reused if it is
still cached on the server they reach) and add their own. The parent is drawn, seeded,
among the ``PARENT_WINDOW`` latest earlier prompts shorter than the child.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from load.sim.bench import RunOptions, make_router
from load.sim.engine import ClusterConfig, Simulation
from load.sim.realism import Realism
from load.sim.request import SimRequest
from load.sim.stepmodel import ServerSpec
from load.sim.workloads import SEG

from .runs import Run, stats

#: the simulator's policy for a stack: stock vLLM behind a Kubernetes Service (connection-level
#: balancing, so a uniformly random replica per request) or the llm-d stack's endpoint picker
#: (prefix-aware and load-aware scorers: llm-d's default profile)
STACK_POLICIES = {"vllm": "random", "llm-d": "llmd-default"}
PARENT_WINDOW = 16


def policy_for(stack: str, overrides: dict[str, str]) -> str:
    """The policy for a stack folder: an explicit ``--policy STACK=NAME``, else by the folder's
    name (``llm-d...`` is the llm-d stack, anything else stock vLLM)."""
    if stack in overrides:
        return overrides[stack]
    return STACK_POLICIES["llm-d" if stack.lower().startswith("llm-d") else "vllm"]


def _own(tag: tuple, start: int, n: int) -> list:
    """``n`` new tokens as segments of at most SEG tokens keyed ``tag + (k,)``."""
    return [((*tag, k), min(SEG, n - k * SEG)) for k in range(-(-n // SEG))] if n > 0 else []


def requests_of(run: Run, block_size: int, continued: float = 0.0, seed: int = 0) -> list[SimRequest]:
    """One simulated request per request sent, recorded or lost (``continued``: the share that
    continue an earlier prompt)."""
    if not 0.0 <= continued <= 1.0:
        raise ValueError(f"continued share must be in [0, 1], got {continued}")
    rng = random.Random(seed)
    out: list[SimRequest] = []
    for i, row in enumerate(run.sent()):
        n = row.prompt_tokens
        segs: list = []
        if rng.random() < continued:
            parents = [r for r in out[-PARENT_WINDOW:] if r.input_len < n]
            if parents:
                segs = list(rng.choice(parents).segments)
        used = sum(k for _, k in segs)
        segs += _own((run.workload, i), used, n - used)
        out.append(SimRequest(i, row.arrival_s, n, row.output_tokens, tuple(segs), block_size=block_size))
    return out


def finished(r: SimRequest) -> bool:
    """A request the client saw to its last token (what a run records)."""
    return r.done and not r.shed and not r.abandoned


@dataclass(frozen=True)
class Replay:
    stats: dict[str, float]
    requests: list[SimRequest]
    preemptions: int
    latency_s: float = 0.0

    @property
    def completed(self) -> int:
        return sum(1 for r in self.requests if finished(r))


def timeout_world(timeout_s: float) -> Realism:
    """The idealised world but for a client deadline of ``timeout_s`` after each launch."""
    return Realism(scrape_interval_s=ClusterConfig.scrape_interval_s, scrape_delay_s=(0.0, 0.0), step_sigma=0.0,
                   speed_jitter=0.0, bytes_per_token_sigma=0.0, deadline_s=timeout_s)


def replay(run: Run, spec: ServerSpec, replicas: int, policy: str, continued: float = 0.0,
           seed: int = 0, timeout_s: float | None = None, latency_s: float = 0.0) -> Replay:
    """``timeout_s``: the stack's request timeout (None: none); ``latency_s``: its fixed latency
    outside the engine, which counts against the timeout too."""
    if latency_s < 0 or (timeout_s is not None and timeout_s <= latency_s):
        raise ValueError(f"need 0 <= latency ({latency_s:g} s) < timeout ({timeout_s} s)")
    reqs = requests_of(run, spec.block_size, continued, seed)
    router = make_router(policy, RunOptions(seed=seed), replicas)
    world = timeout_world(timeout_s - latency_s) if timeout_s is not None else None
    res = Simulation(ClusterConfig([spec] * replicas, realism=world), reqs, router).run()
    done = [r for r in reqs if finished(r)]
    return Replay(stats([r.ttft_ms / 1000.0 + latency_s for r in done], [r.tpot_ms for r in done if r.output_len > 1]),
                  reqs, res.preemptions, latency_s)
