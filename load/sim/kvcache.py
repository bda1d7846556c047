"""Paged KV cache with prefix caching by block hash and LRU eviction of free blocks.

Pages (blocks) are ``block_size`` tokens. A prompt is a sequence of *segments*
``(key, n_tokens)``: the content unit of a workload (a Mooncake 512-token hash block, a
shared system prompt, one turn of a session). A segment ``key`` stands for the whole
prefix chain up to and including it, as Mooncake's hash ids do. The cache stores, per
segment, how many of its leading full pages are cached (``cached[key]``) and how many
running requests pin it (``refs[key]``). Unpinned segments sit in an LRU; eviction frees
pages from the tail of the least recently freed segment first (vLLM appends a freed
request's blocks in reverse order, so tails go first). Bookkeeping is per segment, not
per page, for speed; capacity and usage are exact page counts.

Physical pages = ``free + lru_pages + used`` where ``used`` = private pages of requests
plus pages of pinned segments.
"""
from __future__ import annotations

from collections import OrderedDict


class KVCache:
    __slots__ = ("num_blocks", "block_size", "prefix_caching", "free", "lru_pages", "cached", "refs",
                 "lru", "evicted_pages")

    def __init__(self, num_blocks: int, block_size: int = 16, prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.free = num_blocks
        self.lru_pages = 0
        self.cached: dict = {}
        self.refs: dict = {}
        self.lru: OrderedDict = OrderedDict()   # key -> None, least recent first
        self.evicted_pages = 0

    # -- accounting -------------------------------------------------------------------
    @property
    def used(self) -> int:
        return self.num_blocks - self.free - self.lru_pages

    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: share of blocks in use (cached-but-free count as free)."""
        return (self.num_blocks - self.free - self.lru_pages) / self.num_blocks

    def available(self) -> int:
        return self.free + self.lru_pages

    def allocate(self, n: int) -> bool:
        """Take ``n`` empty pages, evicting LRU cached pages if needed."""
        if n <= 0:
            return True
        if n > self.free + self.lru_pages:
            return False
        short = n - self.free
        if short > 0:
            self._evict(short)
        self.free -= n
        return True

    def _evict(self, n: int) -> None:
        lru, cached = self.lru, self.cached
        while n > 0:
            key = next(iter(lru))
            c = cached[key]
            k = c if c <= n else n
            c -= k
            self.lru_pages -= k
            self.free += k
            self.evicted_pages += k
            n -= k
            if c == 0:
                del lru[key]
                del cached[key]
                del self.refs[key]
            else:
                cached[key] = c

    # -- segments ---------------------------------------------------------------------
    def pin(self, key) -> None:
        """Pin segment ``key`` for a request (creating it empty if unknown)."""
        r = self.refs.get(key)
        if r is None:
            self.refs[key] = 1
            self.cached[key] = 0
            return
        if r == 0:
            c = self.cached[key]
            if c:
                del self.lru[key]
                self.lru_pages -= c
        self.refs[key] = r + 1

    def unpin(self, key) -> None:
        r = self.refs[key] - 1
        if r == 0:
            c = self.cached[key]
            if c and self.prefix_caching:
                self.lru[key] = None
                self.lru_pages += c
                self.refs[key] = 0
            else:
                self.free += c
                del self.cached[key]
                del self.refs[key]
        else:
            self.refs[key] = r

    def match(self, segments, full_pages) -> tuple[int, int]:
        """Longest cached prefix: (number of segments touched, cached pages matched).

        ``full_pages[i]`` is the number of full pages of segment i. Matching stops at the
        first segment that is unknown or not fully cached (a partial one still counts).
        """
        if not self.prefix_caching:
            return 0, 0
        cached = self.cached
        pages = 0
        touched = 0
        for (key, _), fp in zip(segments, full_pages):
            c = cached.get(key, 0)
            if c == 0:
                break
            touched += 1
            if c >= fp:
                pages += fp
            else:
                pages += c
                break
        return touched, pages

    def clone(self) -> KVCache:
        c = KVCache.__new__(KVCache)
        c.num_blocks, c.block_size, c.prefix_caching = self.num_blocks, self.block_size, self.prefix_caching
        c.free, c.lru_pages, c.evicted_pages = self.free, self.lru_pages, self.evicted_pages
        c.cached = self.cached.copy()
        c.refs = self.refs.copy()
        c.lru = self.lru.copy()
        return c

    def check(self) -> None:
        """Invariants (used by tests): page counts add up."""
        lru_sum = sum(self.cached[k] for k in self.lru)
        assert lru_sum == self.lru_pages, (lru_sum, self.lru_pages)
        assert all(self.refs[k] == 0 for k in self.lru)
        assert set(self.cached) == set(self.refs)
        assert 0 <= self.free <= self.num_blocks
        pinned = sum(c for k, c in self.cached.items() if self.refs[k] > 0)
        assert pinned <= self.used, (pinned, self.used)
