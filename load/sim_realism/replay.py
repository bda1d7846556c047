"""Replay one measured run in the simulator: the same requests at the same launch times on a
pool of the preset's servers, behind the router that stands for the stack.

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
    """One simulated request per recorded row (``continued``: the share that continue an earlier prompt)."""
    if not 0.0 <= continued <= 1.0:
        raise ValueError(f"continued share must be in [0, 1], got {continued}")
    rng = random.Random(seed)
    out: list[SimRequest] = []
    for i, row in enumerate(run.rows):
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


@dataclass(frozen=True)
class Replay:
    stats: dict[str, float]
    requests: list[SimRequest]
    preemptions: int

    @property
    def completed(self) -> int:
        return sum(1 for r in self.requests if r.done and not r.shed)


def replay(run: Run, spec: ServerSpec, replicas: int, policy: str, continued: float = 0.0,
           seed: int = 0) -> Replay:
    reqs = requests_of(run, spec.block_size, continued, seed)
    router = make_router(policy, RunOptions(seed=seed), replicas)
    res = Simulation(ClusterConfig([spec] * replicas), reqs, router).run()
    done = [r for r in reqs if r.done and not r.shed]
    return Replay(stats([r.ttft_ms / 1000.0 for r in done], [r.tpot_ms for r in done if r.output_len > 1]),
                  reqs, res.preemptions)
