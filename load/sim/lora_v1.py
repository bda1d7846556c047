"""``lora-v1``: the Gateway API Inference Extension's original filter-tree scheduler.

Facts read from kubernetes-sigs/gateway-api-inference-extension at commit
16ded6689ff224aeaf739a738202b8e98ab112b9 ("update algorithm parameters from env
variables", 2025-03-27), pkg/epp/scheduling/{scheduler.go,filter.go} and
pkg/epp/backend/metrics/metrics.go; the code here is our own.

Defaults: KV-cache threshold 0.8, critical queue threshold 5, LoRA queueing threshold 128,
LoRA affinity probability 0.999. A filter that leaves nothing "fails": the next filter
gets the filter's *input* (on success it gets the filtered set). The active adapters of a
server are its running *and* waiting adapters (the v1 scrape merged both labels).

- critical (priority >= 0): queue < 128 ? [LoRA affinity → (least queue → least KV)]
  : [least queue → LoRA affinity → least KV];
- sheddable (priority < 0): servers with queue <= 5 and KV <= 0.8, then least queue →
  LoRA affinity → least KV; none: the request is dropped;
- a uniformly random pick among what remains.

Least queue (least KV) keeps the servers within ``(max - min) / n`` of the minimum
(integer division for queues). LoRA affinity: servers with the adapter active, or else
with a free slot (``|active| < max``); when both groups exist, the affinity group with
probability 0.999.
"""
from __future__ import annotations

from typing import NamedTuple

from epp_client.heuristics import HeuristicScheduler

from .driver import LifecycleRouter, doc_note

KV_CACHE_THRESHOLD = 0.8
QUEUE_THRESHOLD_CRITICAL = 5
QUEUEING_THRESHOLD_LORA = 128
LORA_AFFINITY_THRESHOLD = 0.999


def least_queue(idx: list[int], metrics) -> list[int]:
    qs = [metrics[i].waiting for i in idx]
    lo, hi = min(qs), max(qs)
    return [i for i, q in zip(idx, qs) if lo <= q <= lo + (hi - lo) // len(idx)]


def least_kv(idx: list[int], metrics) -> list[int]:
    kv = [metrics[i].kv_cache_usage for i in idx]
    lo, hi = min(kv), max(kv)
    return [i for i, k in zip(idx, kv) if lo <= k <= lo + (hi - lo) / len(idx)]


def lora_affinity(idx: list[int], metrics, adapter: str, u: float) -> list[int]:
    affinity, available = [], []
    for i in idx:
        m = metrics[i]
        active = m.active_lora | m.waiting_lora
        if adapter in active:
            affinity.append(i)
        elif len(active) < m.max_lora:
            available.append(i)
    if affinity and available:
        return affinity if u < LORA_AFFINITY_THRESHOLD else available
    return affinity or available


def _or_input(filtered: list[int], idx: list[int]) -> list[int]:
    return filtered if filtered else idx


def v1_candidates(idx: list[int], metrics, adapter: str, critical: bool, u: float) -> list[int]:
    """The filter tree's result: the servers to pick from at random (empty: drop)."""
    if critical:
        low = [i for i in idx if metrics[i].waiting < QUEUEING_THRESHOLD_LORA]
        if low:
            aff = _or_input(lora_affinity(low, metrics, adapter, u), low)
            return least_kv(least_queue(aff, metrics), metrics)
        base = idx
    else:
        base = [i for i in idx if metrics[i].waiting <= QUEUE_THRESHOLD_CRITICAL
                and metrics[i].kv_cache_usage <= KV_CACHE_THRESHOLD]
        if not base:
            return []
    q = least_queue(base, metrics)
    return least_kv(_or_input(lora_affinity(q, metrics, adapter, u), q), metrics)


class _V1Metrics(NamedTuple):
    """An endpoint's scraped metrics under the names the v1 tree reads."""

    waiting: int
    kv_cache_usage: float
    active_lora: frozenset
    waiting_lora: frozenset
    max_lora: int


class LoraV1Scheduler(HeuristicScheduler):
    """Gateway API Inference Extension v1 filter tree (commit 16ded668): low queue → LoRA
    affinity (p 0.999) → least queue → least KV for critical requests; sheddable ones only
    where queue <= 5 and KV <= 0.8, else dropped; random pick; scraped metrics."""

    name = "lora-v1"

    def order(self, request, candidates):
        metrics = [_V1Metrics(m.waiting_queue_size, m.kv_cache_usage, m.active_lora_adapters,
                              m.waiting_lora_adapters, m.max_active_lora) for m in (c.metrics for c in candidates)]
        idx = list(range(len(metrics)))
        cands = v1_candidates(idx, metrics, request.target_model, not request.sheddable, self.rng.random())
        if not cands:
            return []
        return [candidates[cands[self.rng.randrange(len(cands))]]]


class LoraV1Router(LifecycleRouter):
    """The v1 tree in the loop (:class:`LoraV1Scheduler`)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__("lora-v1", lambda rng, clock, wall: LoraV1Scheduler(rng), seed,
                         description=doc_note(LoraV1Scheduler))
