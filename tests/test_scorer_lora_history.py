"""The lora-affinity scorer's request history: in-flight counts per endpoint and adapter
(dispatch, completion, abort), the recently sent adapters, and the reconcile against the
scraped metrics."""
from __future__ import annotations

from epp_client.plugins.scorer.lora_history import RECENT_LIMIT as LIMIT
from epp_client.plugins.scorer.lora_history import LoraRequestHistory
from support.lora import ep


def test_lifecycle_counts_complete_and_abort_floor_at_zero():
    h = LoraRequestHistory()
    h.dispatched("1", "e", "sql")
    h.dispatched("2", "e", "sql")
    h.dispatched("2", "e", "sql")          # the same request twice counts once
    h.dispatched("3", "e", "")             # no adapter: nothing to remember
    assert h.count("e", "sql") == 2 and h.adapters("e") == {"sql"}
    h.dispatched("2", "f", "sql")          # retried on another endpoint: the count moves
    assert (h.count("e", "sql"), h.count("f", "sql")) == (1, 1)
    h.dispatched("2", "e", "sql")
    h.released("1")
    assert h.count("e", "sql") == 1
    h.released("1")                        # released twice: floored, the other request still counts
    assert h.count("e", "sql") == 1
    h.released("2")
    h.released("unknown")
    assert h.count("e", "sql") == 0 and h.adapters("e") == frozenset()


def test_recent_keeps_the_last_distinct_adapters_per_endpoint_in_dispatch_order():
    h = LoraRequestHistory()
    for i, a in enumerate(("a", "b", "a", "c", "")):
        h.dispatched(str(i), "e", a)
    assert h.recent("e", 2) == {"a", "c"} and h.recent("e", 3) == {"a", "b", "c"}
    assert h.recent("e", 0) == frozenset() and h.recent("other", 4) == frozenset()
    h.dispatched("5", "e", "b")             # used again: the most recent
    assert h.recent("e", 2) == {"b", "c"}
    for i in range(LIMIT + 10):
        h.dispatched(f"x{i}", "e", f"ad{i}")
    assert len(h.recent("e", 10 * LIMIT)) == LIMIT


def test_reconcile_resets_after_two_consecutive_misses_and_forgets_departed_endpoints():
    h = LoraRequestHistory(interval_s=1.0)
    h.dispatched("1", "e", "sql")
    h.dispatched("2", "e", "chat")
    h.dispatched("3", "gone", "sql")
    blind = [ep("e")]
    shows_chat = [ep("e", waiting={"chat"})]
    assert not h.maybe_reconcile(blind, 0.0)     # first call starts the clock
    assert not h.maybe_reconcile(blind, 0.5)     # before the interval
    assert h.maybe_reconcile(shows_chat, 1.0)    # miss 1 for sql; chat seen (waiting); "gone" left
    assert h.count("e", "sql") == 1 and h.count("e", "chat") == 1 and h.count("gone", "sql") == 0
    assert h.recent("gone", 4) == frozenset() and h.recent("e", 4) == {"sql", "chat"}
    assert h.maybe_reconcile(blind, 2.0)         # miss 2 for sql -> reset; miss 1 for chat
    assert h.count("e", "sql") == 0 and h.count("e", "chat") == 1
    h.released("1")                              # its count was reset: a late completion is a no-op
    h.dispatched("4", "e", "sql")
    h.released("1")
    assert h.count("e", "sql") == 1
    assert h.maybe_reconcile([ep("e", running={"chat"})], 3.0)  # seen again: misses start over
    assert h.maybe_reconcile(blind, 4.0)
    assert h.count("e", "chat") == 1            # one miss since it was last seen: kept
    assert h.count("e", "sql") == 0 and h.resets == 2  # request 4's sql never showed at 3.0 and 4.0
