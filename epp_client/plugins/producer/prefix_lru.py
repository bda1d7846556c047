"""One endpoint's remembered prefix blocks: an LRU kept in a few generations.

An ``OrderedDict`` LRU costs a linked-list node and an eviction per recorded block in one
large table, and that table is rebuilt as a whole every few tens of thousands of inserts
(milliseconds at the default 31,250 blocks). Here the recency order is split over a short
list of insertion-ordered dicts, the *generations*, oldest first, each of at most
``g = ceil(capacity / GENERATIONS)`` blocks (7,813 at the default capacity):

- recording a prompt takes its leading hits out of the older generations that held them
  and appends its blocks, in order, to the newest generation; a full newest generation is
  closed and an empty one opened. A block the newest generation already holds keeps its
  place in it unless the prompt runs past the generation's end (moving it would cost two
  more dict operations per hit, the common case of a prompt sent again);
- over capacity, the excess is evicted from the front of the oldest generation, and an
  emptied generation is dropped whole. Old generations only shrink, so no table is ever
  rebuilt at more than a generation's size.

So, against an exact LRU of the same capacity:

- matching (``leading``) looks in each generation that could hold a block (on a miss,
  all of them: ``GENERATIONS + 1`` as a rule, at most about twice that); with nothing
  evicted yet the matches are the exact LRU's;
- at most ``capacity`` entries are held, exactly ``capacity`` once it has been reached;
- the order is the exact LRU's but within the newest generation (see above), so a block
  is evicted only after at least ``capacity - g`` other blocks were recorded after its
  last use (exact LRU: ``capacity``);
- a block recorded *after* the prompt's first miss is appended without being looked for
  in the older generations (a lookup per generation and block). If one held it (with
  chained hashes: its predecessor in the prompt was evicted and it was not yet, so it is
  about to be), that copy stays until evicted in turn and counts towards the capacity
  meanwhile.
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import islice

GENERATIONS = 4


class GenerationLRU:
    """Blocks remembered for one endpoint (not thread-safe: the producer holds the lock)."""

    __slots__ = ("capacity", "gen_capacity", "max_gens", "gens", "entries")

    def __init__(self, capacity: int, generations: int = GENERATIONS) -> None:
        if capacity <= 0 or generations <= 0:
            raise ValueError(f"capacity and generations must be > 0, got {capacity}, {generations}")
        self.capacity = capacity
        self.gen_capacity = -(-capacity // generations)
        self.max_gens = 2 * generations
        self.gens: list[dict[Hashable, None]] = [{}]
        self.entries = 0

    def __len__(self) -> int:
        return self.entries

    def order(self) -> list:
        """All entries, least recently used first (for tests and debugging)."""
        return [h for g in self.gens for h in g]

    def leading(self, hashes: Sequence) -> int:
        """How many leading ``hashes`` are held (one lookup per block while they come from
        the same generation, one per generation on a miss)."""
        gens = self.gens
        g = gens[-1]
        n = 0
        for h in hashes:
            if h not in g:
                for g in gens:
                    if h in g:
                        break
                else:
                    return n
            n += 1
        return n

    def record(self, hashes: Sequence) -> int:
        """Record a prompt's blocks as the most recently used, in order; returns how many
        leading blocks were held before."""
        gens = self.gens
        newest = g = gens[-1]
        n = moved = 0
        for h in hashes:                 # the leading hits in older generations leave them
            if h not in g:
                for g in gens:
                    if h in g:
                        break
                else:
                    break
            if g is not newest:
                del g[h]
                moved += 1
            n += 1
        entries = self.entries - moved
        before = len(newest)
        if len(hashes) <= self.gen_capacity - before:
            newest.update(dict.fromkeys(hashes))
            entries += len(newest) - before
        else:                            # over a generation's end: the hits it holds move too
            for h in hashes[:n]:
                newest.pop(h, None)
            self._spill(hashes)
            entries = sum(map(len, gens))    # (a merge in _open can drop a duplicate)
        if entries > self.capacity:
            self._evict(entries - self.capacity)
            entries = self.capacity
        self.entries = entries
        return n

    def _spill(self, hashes: Sequence) -> None:
        """Append ``hashes`` across as many new generations as they fill."""
        newest = self.gens[-1]
        cap = self.gen_capacity
        i = 0
        while i < len(hashes):
            room = cap - len(newest)
            if room <= 0:
                newest = self._open()
                room = cap
            newest.update(dict.fromkeys(hashes[i:i + room]))
            i += room

    def _evict(self, excess: int) -> None:
        """Evict the ``excess`` least recently used entries: from the front of the oldest
        generation (reading it from its start walks past the entries deleted before, a
        sequential scan of at most a generation; a copy of its keys would cost more, all at
        once when it is made or dropped)."""
        gens = self.gens
        while excess > 0:
            oldest = gens[0]             # never the newest: it holds at most gen_capacity <= capacity
            if len(oldest) <= excess:
                excess -= len(oldest)
                del gens[0]
            else:
                for h in list(islice(oldest, excess)):
                    del oldest[h]
                return

    def _open(self) -> dict:
        """Close the newest generation and open an empty one. Emptied generations are
        dropped; at ``2 * GENERATIONS`` of them (hits drain the old ones), the oldest two
        neighbours that fit in one generation are merged (in order), so that a miss looks
        in a bounded number of them."""
        gens = self.gens
        gens[:] = [g for g in gens if g]
        if len(gens) >= self.max_gens:
            for i in range(len(gens) - 1):
                older, younger = gens[i], gens[i + 1]
                if len(older) + len(younger) <= self.gen_capacity:
                    older.update(younger)
                    del gens[i + 1]
                    break
        newest: dict[Hashable, None] = {}
        gens.append(newest)
        return newest
