"""``GenerationLRU``: the same matches, capacity and (but within the newest generation)
eviction order as an exact ``OrderedDict`` LRU, the producer's previous index."""
from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from epp_client.plugins.producer.prefix_lru import GENERATIONS, GenerationLRU


class ExactLRU:
    """The reference: the OrderedDict LRU the prefix producer used before."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.od = capacity, OrderedDict()

    def leading(self, hashes) -> int:
        n = 0
        for h in hashes:
            if h not in self.od:
                break
            n += 1
        return n

    def record(self, hashes) -> int:
        n, counting = 0, True
        for h in hashes:
            if h in self.od:
                n += counting
                self.od.move_to_end(h)
            else:
                counting = False
                self.od[h] = None
        while len(self.od) > self.capacity:
            self.od.popitem(last=False)
        return n


def check_invariants(lru: GenerationLRU) -> None:
    sizes = [len(g) for g in lru.gens]
    assert sum(sizes) == lru.entries <= lru.capacity
    assert max(sizes) <= lru.gen_capacity
    assert len(lru.gens) <= 2 * GENERATIONS + 1


def check_against(lru: GenerationLRU, ref: ExactLRU) -> None:
    """Same number of blocks; every block among the ``capacity - g`` most recently used
    (by the exact LRU's order) held; the exact order when generations are one block."""
    held = lru.order()
    assert len(held) == len(set(held)) == len(ref.od)
    recent = list(ref.od)[max(0, len(ref.od) - (lru.capacity - lru.gen_capacity)):]
    assert set(recent) <= set(held)
    if lru.gen_capacity == 1:
        assert held == list(ref.od)


def test_without_eviction_matches_are_the_exact_lrus_on_any_sequences():
    rng = random.Random(3)
    universe = list(range(400))                  # small: sequences overlap, repeat and reorder
    lru, ref = GenerationLRU(10_000), ExactLRU(10_000)
    for _ in range(600):
        seq = rng.sample(universe, rng.randrange(1, 40))
        if rng.random() < 0.5:
            probe = rng.sample(universe, rng.randrange(1, 40))
            assert lru.leading(probe) == ref.leading(probe)
        assert lru.record(seq) == ref.record(seq)
        assert lru.leading(seq) == ref.leading(seq) == len(seq)
    assert set(lru.order()) == set(ref.od)


@pytest.mark.parametrize("capacity", [3, 50, 997])
def test_with_eviction_the_capacity_and_the_recent_blocks_are_the_exact_lrus(capacity):
    """Prompts made of a held prefix of an earlier prompt plus new blocks (every block after
    the first miss is new, as with chained hashes): as many blocks as the exact LRU, among
    them all of its ``capacity - g`` most recent ones."""
    rng = random.Random(capacity)
    lru, ref = GenerationLRU(capacity), ExactLRU(capacity)
    sent: list[list[int]] = []
    fresh = iter(range(10**9))
    for _ in range(1500):
        if sent and rng.random() < 0.7:
            base = rng.choice(sent)
            keep = rng.randrange(ref.leading(base) + 1)
            seq = base[:keep] + [next(fresh) for _ in range(rng.randrange(1, 60))]
        else:
            seq = [next(fresh) for _ in range(rng.randrange(1, 60))]
        assert lru.record(seq) == ref.record(seq)
        sent.append(seq)
        check_invariants(lru)
        check_against(lru, ref)
    assert len(lru) == capacity


def test_the_first_blocks_go_first():
    lru = GenerationLRU(3)
    lru.record(["a", "b", "c"])
    lru.record(["a"])                           # a hit: now the most recent
    lru.record(["d"])
    assert lru.order() == ["c", "a", "d"] and lru.leading(["b"]) == 0 and lru.leading(["a"]) == 1


def test_a_block_held_after_a_miss_is_not_moved():
    """The documented exception: a block that follows the prompt's first miss is appended
    without being looked for. Held in an older generation, its old copy stays (and counts)
    until evicted in turn; held in the newest, it keeps its place there."""
    lru = GenerationLRU(8, generations=2)       # generations of 4 blocks
    lru.record(["x", "y", "p", "q"])
    lru.record(["new", "y"])                    # "new" misses; "y" (older generation) is appended again
    assert lru.order() == ["x", "y", "p", "q", "new", "y"] and len(lru) == 6
    lru.record(["new2", "new"])                 # "new" is in the newest: it keeps its place
    lru.record(["t"])
    assert lru.order() == ["x", "y", "p", "q", "new", "y", "new2", "t"] and len(lru) == 8
    lru.record(["u"])                           # one over: the least recent ("x") goes
    assert lru.order() == ["y", "p", "q", "new", "y", "new2", "t", "u"] and len(lru) == 8
    lru.record(["v"])                           # the old copy of "y" goes; the new one stays
    assert lru.leading(["y"]) == 1 and lru.order() == ["p", "q", "new", "y", "new2", "t", "u", "v"]


def test_a_hot_set_keeps_the_generations_bounded():
    """Hits drain old generations; emptied ones are dropped and small neighbours merged.
    (Here a hot prompt's first blocks can go before its later ones, which are then held
    twice for a while: the documented exception, so no recency check.)"""
    rng = random.Random(9)
    lru, ref = GenerationLRU(2000), ExactLRU(2000)
    hot = [list(range(i * 1000, i * 1000 + 40)) for i in range(20)]
    fresh = iter(range(10**6, 10**9))
    for _ in range(3000):
        seq = rng.choice(hot) if rng.random() < 0.9 else [next(fresh) for _ in range(rng.randrange(1, 30))]
        assert lru.record(seq) == ref.record(seq)
        check_invariants(lru)
        assert lru.leading(seq) == len(seq) and len(lru) == len(ref.od)


@pytest.mark.parametrize("capacity,generations", [(7, 2), (37, 4), (200, 4), (200, 8)])
def test_any_sequences_keep_the_counts_and_bounds(capacity, generations):
    """Repeats, reorders, hot and cold blocks, prompts longer than a generation: the entry
    count stays the sum of the generations, within the capacity and at it once full, the
    generations stay few and small, and a recorded prompt's last block is held."""
    rng = random.Random(capacity * generations)
    lru = GenerationLRU(capacity, generations)
    hot = [rng.sample(range(50), rng.randrange(1, 12)) for _ in range(6)]
    for i in range(3000):
        if rng.random() < 0.5:
            seq = list(rng.choice(hot))
        else:
            seq = [rng.randrange(50 + i // 10) for _ in range(rng.randrange(1, 2 * lru.gen_capacity + 3))]
        lru.record(seq)
        sizes = [len(g) for g in lru.gens]
        assert sum(sizes) == lru.entries <= capacity and max(sizes) <= lru.gen_capacity
        assert len(lru.gens) <= 2 * generations + 1
        assert lru.leading(seq[-1:]) == 1
    assert lru.entries == capacity


def test_long_prompts_spill_over_several_generations_in_order():
    lru = GenerationLRU(100, generations=4)     # generations of 25
    lru.record(list(range(90)))
    assert [len(g) for g in lru.gens] == [25, 25, 25, 15] and lru.order() == list(range(90))
    lru.record(list(range(1000, 1030)))         # 20 over capacity: 0..19 go
    assert lru.order() == list(range(20, 90)) + list(range(1000, 1030)) and len(lru) == 100
    check_invariants(lru)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        GenerationLRU(0)


# ---- the producer sizes each endpoint's index from the KV cache it reports (autoTune) --------

def _endpoint(name: str, gpu_blocks: int = 0, block_size: int = 0):
    from epp_client import Endpoint, EndpointMetrics
    return Endpoint(name=name, metrics=EndpointMetrics(cache_num_blocks=gpu_blocks, cache_block_size=block_size))


def test_an_endpoint_reporting_its_kv_cache_gets_an_index_of_that_many_tokens():
    from epp_client.plugins.producer.approx_prefix import ApproxPrefixProducer

    p = ApproxPrefixProducer(64, lru_capacity_per_endpoint=1_000)
    eps = [_endpoint("a", 100, 16), _endpoint("b")]       # a: 1,600 tokens = 25 blocks of 64; b: nothing reported
    p.produce(list(range(5)), eps)
    assert p.capacity_of("a") == 25 and p.capacity_of("b") == 1_000
    p.record("a", list(range(40)))                       # a prompt longer than a's cache
    p.record("b", list(range(40)))
    assert p.size("a") == 25 and p.size("b") == 40
    p.produce(list(range(40)), eps)
    assert eps[0].prefix_match.match_blocks == 0         # its first blocks were evicted: the engine's are too
    assert eps[1].prefix_match.match_blocks == 40
    # llm-d's sizing: one 64-token block per 16-token GPU block, 4 times the tokens the engine holds
    up = ApproxPrefixProducer(64, auto_tune_capacity="gpu-blocks")
    up.produce([0], [_endpoint("a", 100, 16)])
    assert up.capacity_of("a") == 100
    off = ApproxPrefixProducer(64, lru_capacity_per_endpoint=7, auto_tune=False)
    off.produce([0], [_endpoint("a", 100, 16)])
    assert off.capacity_of("a") == 7


def test_a_changed_kv_cache_resizes_the_index_keeping_the_most_recent_blocks():
    from epp_client.plugins.producer.approx_prefix import ApproxPrefixProducer

    p = ApproxPrefixProducer(64)
    p.produce([0], [_endpoint("a", 400, 16)])           # 100 blocks
    p.record("a", list(range(60)))
    p.record("a", list(range(100, 130)))
    p.produce([0], [_endpoint("a", 160, 16)])           # restarted with a smaller cache: 40 blocks
    assert p.capacity_of("a") == 40 and p.size("a") == 40
    ep = _endpoint("a", 160, 16)
    p.produce(list(range(100, 130)), [ep])
    assert ep.prefix_match.match_blocks == 30           # the newest prompt is still there
    p.produce(list(range(60)), [ep])
    assert ep.prefix_match.match_blocks == 0            # the older one lost its first blocks


def test_auto_tune_parameters_are_checked():
    from epp_client.plugins.producer.approx_prefix import ApproxPrefixProducer
    from epp_client.types import ConfigError

    with pytest.raises(ConfigError, match="autoTuneCapacity"):
        ApproxPrefixProducer.from_config({"autoTuneCapacity": "pages"})
