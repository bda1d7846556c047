"""LoRA adapters on a simulated server (vLLM multi-LoRA behaviour).

- ``max_loras`` GPU slots: the running requests of one server use at most ``max_loras``
  distinct adapters. A waiting request whose adapter would exceed that is skipped (it
  keeps its place at the head of the queue) and later requests may go first, as vLLM's
  scheduler does (``skipped_waiting_requests``).
- An adapter that is not resident in a slot is loaded when the first step that runs one
  of its requests starts: the step takes ``load_ms`` longer per adapter loaded (vLLM
  activates adapters synchronously before the forward pass), so the request cannot
  produce a token before the load is over, and the whole batch waits with it.
- A load takes a slot; when all slots are taken, the least recently used adapter that
  has no request in the batch is evicted.
- Mixing adapters costs step time: ``step_ms`` for a step with any adapter plus
  ``mix_ms`` per additional distinct adapter in the batch.
- Scraped metrics, as vLLM's ``vllm:lora_requests_info``: running adapters (those with a
  running request), waiting adapters (those with a queued request) and ``max_lora``.

Numbers (defaults of :class:`LoraSpec`; all are assumptions, chosen before any policy
comparison, and configurable):

- ``mix_ms`` / ``step_ms``: Punica (Chen et al., "Punica: Multi-Tenant LoRA Serving",
  arXiv 2310.18547, MLSys 2024) measures about 2 ms of added latency per token when a
  batch mixes different LoRA models with its SGMV kernel (7B-70B). We charge 1 ms for a
  step with adapters plus 0.25 ms per additional distinct adapter: 1.75 ms at 4 distinct
  adapters, under Punica's ~2 ms. S-LoRA (Sheng et al., arXiv 2311.03285) reports the same
  shape: throughput falls as a batch holds more distinct adapters.
- ``load_ms`` = 100: a rank-16 adapter of an 8B model is a few tens of MB; the host-to-GPU
  copy alone takes a few ms over PCIe 4 (the cold start CaraServe, Li et al., arXiv
  2401.11240, shows "substantially delays token generation"), while vLLM loads an adapter
  that is not in its CPU cache from disk and builds its tensors in Python (hundreds of ms
  for large adapters). 100 ms sits between the two.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class LoraSpec:
    max_loras: int = 4
    load_ms: float = 100.0
    step_ms: float = 1.0
    mix_ms: float = 0.25

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if self.load_ms < 0 or self.step_ms < 0 or self.mix_ms < 0:
            raise ValueError("load_ms, step_ms and mix_ms must be >= 0")


class AdapterSlots:
    """One server's adapter slots (LRU of resident adapters) and load counters."""

    def __init__(self, spec: LoraSpec) -> None:
        self.spec = spec
        self.resident: OrderedDict[str, None] = OrderedDict()   # least recently used first
        self.loads = 0
        self.evictions = 0
        self.skips = 0

    def admissible(self, adapter: str, running_counts: dict[str, int]) -> bool:
        """May a waiting request for ``adapter`` join the running batch?"""
        if running_counts.get(adapter, 0) > 0:
            return True
        distinct = 0
        for v in running_counts.values():
            if v > 0:
                distinct += 1
        if distinct < self.spec.max_loras:
            return True
        self.skips += 1
        return False

    def step_extra_ms(self, batch_adapters: list) -> float:
        """Extra time of a step whose batch uses these distinct adapters (in batch order):
        loads, then the mixing cost."""
        if not batch_adapters:
            return 0.0
        spec = self.spec
        extra = spec.step_ms + spec.mix_ms * (len(batch_adapters) - 1)
        res = self.resident
        in_batch = set(batch_adapters)
        for a in batch_adapters:
            if a in res:
                res.move_to_end(a)
                continue
            if len(res) >= spec.max_loras:
                victim = next((v for v in res if v not in in_batch), None)
                if victim is not None:
                    del res[victim]
                    self.evictions += 1
            res[a] = None
            self.loads += 1
            extra += spec.load_ms
        return extra

    def clone(self) -> AdapterSlots:
        c = AdapterSlots(self.spec)
        c.resident = OrderedDict(self.resident)
        c.loads, c.evictions, c.skips = self.loads, self.evictions, self.skips
        return c
