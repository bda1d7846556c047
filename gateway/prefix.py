"""Approximate prefix index: which prompt blocks each endpoint has probably cached.

Like llm-d's approximate prefix producer: block hashes of a prompt are recorded for the
endpoint the request was dispatched to, in an LRU per endpoint; a later prompt's match on
an endpoint is the number of its leading blocks found in that endpoint's LRU.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Match:
    match_blocks: int
    total_blocks: int
    block_size_tokens: int

    @property
    def score(self) -> float:
        return self.match_blocks / self.total_blocks if self.total_blocks else 0.0


class PrefixIndex:
    def __init__(self, block_size_tokens: int = 64, lru_capacity_per_endpoint: int = 31250) -> None:
        if block_size_tokens <= 0 or lru_capacity_per_endpoint <= 0:
            raise ValueError("block size and LRU capacity must be > 0")
        self.block_size_tokens = block_size_tokens
        self.capacity = lru_capacity_per_endpoint
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._lock = threading.Lock()
        self.lookups = 0
        self.hit_blocks = 0
        self.total_blocks = 0

    def match(self, endpoint: str, hashes: list[int]) -> Match:
        with self._lock:
            lru = self._lru.get(endpoint)
            n = 0
            if lru:
                for h in hashes:
                    if h not in lru:
                        break
                    n += 1
            return Match(n, len(hashes), self.block_size_tokens)

    def record(self, endpoint: str, hashes: list[int]) -> Match:
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
            return Match(n, len(hashes), self.block_size_tokens)

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
