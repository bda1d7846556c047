"""``approx-prefix-cache-producer``: which prompt blocks each endpoint has probably cached.

Like llm-d's approximate prefix producer: the block hashes of a prompt are recorded for
the endpoint the request was dispatched to, in an LRU per endpoint; a later prompt's
match on an endpoint is the number of its leading blocks found in that endpoint's LRU.
It produces the :class:`~epp_client.types.PrefixMatch` read by ``prefix-cache-scorer``,
``prefix-cache-affinity-filter`` and the in-flight accounting.

The caller hashes the prompt (the gateway hashes the prompt text, the simulator its
token segments) in blocks of ``block_size_tokens``, at most ``max_prefix_blocks`` of them::

    producer.produce(hashes, endpoints)        # writes Endpoint.prefix_match on each
    producer.record(endpoint.name, hashes)     # at dispatch

Parameters (upstream names): ``blockSizeTokens`` (tokens per hashed block, default 64),
``maxPrefixBlocksToMatch`` (default 2048), ``lruCapacityPerServer`` (blocks remembered
per endpoint, default 31250), ``autoTune`` (default true, as upstream's): an endpoint that
reports its KV cache (``vllm:cache_config_info``: ``num_gpu_blocks`` x ``block_size``
tokens, :class:`~epp_client.types.EndpointMetrics`) gets an index of that size instead of
``lruCapacityPerServer``. ``autoTuneCapacity`` says how: ``kv-tokens`` (ours, the default)
remembers as many tokens as the engine's cache holds, ``kv_capacity_tokens /
blockSizeTokens`` blocks; ``gpu-blocks`` is llm-d's: one index entry per GPU block, which
with vLLM's 16-token blocks and 64-token index blocks remembers 4 times what the engine
holds, so the index claims prefixes the engine has evicted (on ``standard`` at 80% load
1 request in 10 is placed for a cache that is not there; docs/plugins.md B4.8).
Thread-safe (the gateway's scrape and request tasks).

Each endpoint's LRU is a :class:`~.prefix_lru.GenerationLRU`: the capacity of an
``OrderedDict`` LRU and, until it first fills, its matches; its eviction order but for two
approximations its module states (a block is evicted only after at least 3/4 of the
capacity was recorded after its last use). It is kept in a few generations so that no
table is rebuilt at the full capacity, and costs a decision much less.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from epp_client.framework.params import Plugin, gt, one_of, param
from epp_client.framework.protocols import PrefixProducer
from epp_client.framework.registry import plugin
from epp_client.plugins.producer.prefix_lru import GenerationLRU
from epp_client.types import Endpoint, EndpointMetrics, PrefixMatch


@plugin("approx-prefix-cache-producer", PrefixProducer)
class ApproxPrefixProducer(Plugin):
    block_size_tokens: int = param("blockSizeTokens", default=64, check=gt(0), doc="tokens per hashed block")
    max_prefix_blocks: int = param("maxPrefixBlocksToMatch", default=2048, check=gt(0),
                                   doc="leading blocks of a prompt that are hashed and matched")
    lru_capacity_per_endpoint: int = param("lruCapacityPerServer", default=31250, check=gt(0),
                                           doc="blocks remembered per endpoint (LRU)")
    auto_tune: bool = param("autoTune", default=True,
                            doc="size an endpoint's index from the KV cache it reports (vllm:cache_config_info) "
                                "instead of lruCapacityPerServer")
    auto_tune_capacity: str = param("autoTuneCapacity", default="kv-tokens", check=one_of("kv-tokens", "gpu-blocks"),
                                    doc="with autoTune: kv-tokens remembers the tokens the engine's cache holds; "
                                        "gpu-blocks (llm-d's) one block per GPU block it reports")

    def setup(self) -> None:
        self.capacity = self.lru_capacity_per_endpoint
        self._lru: dict[str, GenerationLRU] = {}
        self._capacity: dict[str, int] = {}      # endpoint -> its auto-tuned capacity
        self._lock = threading.Lock()
        self.lookups = 0
        self.hit_blocks = 0
        self.total_blocks = 0

    def match(self, endpoint: str, hashes: Sequence, total_blocks: int | None = None) -> PrefixMatch:
        """Leading blocks of ``hashes`` cached on ``endpoint``; ``total_blocks`` defaults to
        ``len(hashes)`` (the simulator counts a partial last block too)."""
        with self._lock:
            lru = self._lru.get(endpoint)
            n = lru.leading(hashes) if lru is not None else 0
        return PrefixMatch(n, len(hashes) if total_blocks is None else total_blocks, self.block_size_tokens)

    def produce(self, hashes: Sequence, endpoints: Iterable[Endpoint], total_blocks: int | None = None) -> None:
        """Write each endpoint's :class:`PrefixMatch` for a prompt with these block hashes
        (one lock for all endpoints: this runs for every candidate of every decision). The
        endpoints without a match share one ``PrefixMatch(0, ...)`` (it is never mutated)."""
        total = len(hashes) if total_blocks is None else total_blocks
        block = self.block_size_tokens
        lrus = self._lru
        none = PrefixMatch(0, total, block)
        with self._lock:
            for e in endpoints:
                if self.auto_tune and e.metrics is not None and e.metrics.cache_num_blocks > 0:
                    self._tune(e.name, e.metrics)
                lru = lrus.get(e.name)
                n = lru.leading(hashes) if lru is not None else 0
                e.prefix_match = PrefixMatch(n, total, block) if n else none

    def record(self, endpoint: str, hashes: Sequence) -> PrefixMatch:
        """Record a dispatch; returns the match the request had (for hit-rate accounting)."""
        with self._lock:
            lru = self._lru.get(endpoint)
            if lru is None:
                lru = self._lru[endpoint] = GenerationLRU(self._capacity.get(endpoint, self.capacity))
            n = lru.record(hashes)
            self.lookups += 1
            self.hit_blocks += n
            self.total_blocks += len(hashes)
        return PrefixMatch(n, len(hashes), self.block_size_tokens)

    def capacity_of(self, endpoint: str) -> int:
        """Blocks the endpoint's index holds at most."""
        with self._lock:
            return self._capacity.get(endpoint, self.capacity)

    def _tune(self, endpoint: str, m: EndpointMetrics) -> None:
        """The endpoint reports its KV cache: size its index to it (lock held). A changed size
        rebuilds the index with its most recently used blocks, in order (rare: the engine
        restarted with another cache)."""
        if self.auto_tune_capacity == "gpu-blocks" or m.cache_block_size <= 0:
            cap = m.cache_num_blocks
        else:
            cap = max(1, m.kv_capacity_tokens // self.block_size_tokens)
        if self._capacity.get(endpoint) == cap:
            return
        self._capacity[endpoint] = cap
        old = self._lru.get(endpoint)
        if old is not None and old.capacity != cap:
            lru = self._lru[endpoint] = GenerationLRU(cap)
            lru.record(old.order()[-cap:])

    def size(self, endpoint: str) -> int:
        with self._lock:
            return len(self._lru.get(endpoint, ()))

    @property
    def hit_ratio(self) -> float:
        return self.hit_blocks / self.total_blocks if self.total_blocks else 0.0

