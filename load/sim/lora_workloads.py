"""Multi-LoRA workloads: which adapter each request targets, and the adapter-spike arrivals.

A scenario with a :class:`LoraSetup` gives every server adapter slots (``adapters``) and
assigns each request an adapter (``SimRequest.lora``, the EPP's ``target_model``),
deterministically from the seed. ``apply`` also puts the adapter into the request's
prefix-cache keys: vLLM's prefix cache is per adapter (a block computed under one adapter
is never reused by another).
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from . import workloads as W
from .adapters import LoraSpec


@dataclass(frozen=True)
class LoraSetup:
    slots: LoraSpec
    assign: Callable[[list, int], list]     # (arrivals, seed) -> adapter name per request

    def apply(self, requests: list, arrivals: list, seed: int) -> None:
        for r, adapter in zip(requests, self.assign(arrivals, seed)):
            r.lora = adapter
            r.segments = tuple(((adapter, key), n) for key, n in r.segments)


def zipf_weights(n: int, s: float = 1.0) -> list[float]:
    return [1.0 / (k + 1) ** s for k in range(n)]


def zipf_adapters(n_adapters: int = 32, s: float = 1.0, prefix: str = "lora") -> Callable[[list, int], list]:
    """One adapter per conversation, drawn Zipf-like (rank k: 1/k^s). In the Mooncake
    conversation trace every prompt starts with the same 512-token block and the second
    block identifies the conversation, so all turns of a conversation use one adapter (a
    tenant's fine-tune); a single-block prompt draws its own."""
    names = [f"{prefix}-{k}" for k in range(n_adapters)]
    weights = zipf_weights(n_adapters, s)

    def assign(arrivals: list, seed: int) -> list:
        rng = random.Random(seed ^ 0x10A)
        by_conv: dict = {}
        out = []
        for a in arrivals:
            if len(a.segments) > 1:
                conv = a.segments[1][0]
                if conv not in by_conv:
                    by_conv[conv] = rng.choices(names, weights)[0]
                out.append(by_conv[conv])
            else:
                out.append(rng.choices(names, weights)[0])
        return out

    return assign


# -- lora-spike: a burst of requests for adapters the pool has not seen --------------------
SPIKE_START, SPIKE_END = 300, 700          # request indices of the burst
SPIKE_COMPRESSION = 3.0                    # the burst's arrivals come this much faster
BASE_ADAPTERS, SPIKE_ADAPTERS = 8, 16


def spike_arrivals(seed: int, n: int = 1200) -> list:
    """The first ``n`` requests of the Mooncake conversation trace (real arrivals), with the
    requests ``SPIKE_START..SPIKE_END`` arriving ``SPIKE_COMPRESSION`` times faster (later
    arrivals move up by the time saved)."""
    arr = W.load_mooncake("conversation", limit=n, seed=seed)
    if len(arr) <= SPIKE_END:
        return arr
    t0 = arr[SPIKE_START].time_s
    out = list(arr[:SPIKE_START])
    for a in arr[SPIKE_START:SPIKE_END]:
        out.append(a._replace(time_s=t0 + (a.time_s - t0) / SPIKE_COMPRESSION))
    span = arr[SPIKE_END - 1].time_s - t0
    saved = span - span / SPIKE_COMPRESSION
    out.extend(a._replace(time_s=a.time_s - saved) for a in arr[SPIKE_END:])
    return out


def spike_adapters(arrivals: list, seed: int) -> list:
    """Base traffic: 8 adapters, Zipf-like. The burst: 16 adapters never requested before,
    uniform (a new tenant's batch job, a rollout of new fine-tunes)."""
    rng = random.Random(seed ^ 0x5B1C)
    base = [f"base-{k}" for k in range(BASE_ADAPTERS)]
    spike = [f"new-{k}" for k in range(SPIKE_ADAPTERS)]
    w = zipf_weights(BASE_ADAPTERS)
    return [rng.choice(spike) if SPIKE_START <= i < SPIKE_END else rng.choices(base, w)[0]
            for i in range(len(arrivals))]
