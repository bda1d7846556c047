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
per endpoint, default 31250). Thread-safe (the gateway's scrape and request tasks).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Iterable, Sequence

from ..params import Configurable, Param, gt
from ..types import Endpoint, PrefixMatch


class ApproxPrefixProducer(Configurable):
    TYPE = "approx-prefix-cache-producer"
    PARAMS = (
        Param("blockSizeTokens", "block_size_tokens", "int", gt(0)),
        Param("maxPrefixBlocksToMatch", "max_prefix_blocks", "int", gt(0)),
        Param("lruCapacityPerServer", "lru_capacity_per_endpoint", "int", gt(0)),
    )

    def __init__(self, block_size_tokens: int = 64, max_prefix_blocks: int = 2048,
                 lru_capacity_per_endpoint: int = 31250) -> None:
        v = self._validated(block_size_tokens=block_size_tokens, max_prefix_blocks=max_prefix_blocks,
                            lru_capacity_per_endpoint=lru_capacity_per_endpoint)
        self.block_size_tokens = v["block_size_tokens"]
        self.max_prefix_blocks = v["max_prefix_blocks"]
        self.capacity = v["lru_capacity_per_endpoint"]
        self._lru: dict[str, OrderedDict[object, None]] = {}
        self._lock = threading.Lock()
        self.lookups = 0
        self.hit_blocks = 0
        self.total_blocks = 0

    def match(self, endpoint: str, hashes: Sequence, total_blocks: int | None = None) -> PrefixMatch:
        """Leading blocks of ``hashes`` cached on ``endpoint``; ``total_blocks`` defaults to
        ``len(hashes)`` (the simulator counts a partial last block too)."""
        with self._lock:
            lru = self._lru.get(endpoint)
            n = 0
            if lru:
                for h in hashes:
                    if h not in lru:
                        break
                    n += 1
        return PrefixMatch(n, len(hashes) if total_blocks is None else total_blocks, self.block_size_tokens)

    def produce(self, hashes: Sequence, endpoints: Iterable[Endpoint], total_blocks: int | None = None) -> None:
        """Write each endpoint's :class:`PrefixMatch` for a prompt with these block hashes."""
        for e in endpoints:
            e.prefix_match = self.match(e.name, hashes, total_blocks)

    def record(self, endpoint: str, hashes: Sequence) -> PrefixMatch:
        """Record a dispatch; returns the match the request had (for hit-rate accounting)."""
        with self._lock:
            lru = self._lru.setdefault(endpoint, OrderedDict())
            n = 0
            counting = True
            for h in hashes:
                if h in lru:
                    if counting:
                        n += 1
                    lru.move_to_end(h)
                else:
                    counting = False
                    lru[h] = None       # a new key goes to the most recent end already
            while len(lru) > self.capacity:
                lru.popitem(last=False)
            self.lookups += 1
            self.hit_blocks += n
            self.total_blocks += len(hashes)
        return PrefixMatch(n, len(hashes), self.block_size_tokens)

    def forget(self, endpoint: str) -> None:
        """Drop an endpoint's entries (e.g. the engine restarted and lost its cache)."""
        with self._lock:
            self._lru.pop(endpoint, None)

    def size(self, endpoint: str) -> int:
        with self._lock:
            return len(self._lru.get(endpoint, ()))

    @property
    def hit_ratio(self) -> float:
        return self.hit_blocks / self.total_blocks if self.total_blocks else 0.0
