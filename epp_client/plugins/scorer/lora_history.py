"""What the router itself sent where: per (endpoint, adapter), the requests it dispatched
there that are still running (the request-history half of ``lora-affinity-scorer``).

- ``dispatched(request_id, endpoint, adapter)``: +1 (pre-request); a request dispatched
  again (a gateway retry on another endpoint) moves its count there;
- ``released(request_id)``: -1, floored at 0 (completion or abort); unknown ids are ignored;
- ``recent(endpoint, n)``: the last ``n`` distinct adapters dispatched to the endpoint,
  finished or not. An engine keeps an idle adapter loaded until it needs the slot for
  another one (least recently used first), so these are probably still loaded there;
- ``reconcile(endpoints)``: compares the counts with the scraped adapter metrics. A count
  the metrics showed neither running nor waiting at two consecutive reconciles is reset
  (its requests are forgotten, so their late completions cannot eat a newer count);
  endpoints that are no longer in the pool are forgotten;
- ``maybe_reconcile(endpoints, now)``: ``reconcile`` when at least ``interval_s`` has
  passed since the last one (the first call only starts the clock).

Scraped metrics lag the router's own decisions by a scrape interval or more; this state
is what lets affinity form before the metrics show it. Not thread-safe (one scheduler).
"""
from __future__ import annotations

from collections.abc import Iterable

from epp_client.types import Endpoint

#: A count survives this many consecutive reconciles that do not see its adapter.
MISSES_BEFORE_RESET = 2
#: Distinct adapters remembered per endpoint for ``recent`` (far above any ``max_lora``).
RECENT_LIMIT = 256


class LoraRequestHistory:
    def __init__(self, interval_s: float = 1.0) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = interval_s
        self._counts: dict[str, dict[str, int]] = {}        # endpoint -> adapter -> running requests
        self._misses: dict[tuple[str, str], int] = {}       # (endpoint, adapter) -> consecutive misses
        self._requests: dict[str, tuple[str, str]] = {}     # request id -> (endpoint, adapter)
        self._recent: dict[str, dict[str, None]] = {}       # endpoint -> adapters dispatched, oldest first
        self._last: float | None = None
        self.resets = 0
        self.reconciles = 0

    # -- lifecycle ----------------------------------------------------------------------
    def dispatched(self, request_id: str, endpoint: str, adapter: str) -> None:
        if not adapter or self._requests.get(request_id) == (endpoint, adapter):
            return
        self.released(request_id)
        per = self._counts.setdefault(endpoint, {})
        per[adapter] = per.get(adapter, 0) + 1
        self._requests[request_id] = (endpoint, adapter)
        recent = self._recent.setdefault(endpoint, {})
        recent.pop(adapter, None)
        recent[adapter] = None
        if len(recent) > RECENT_LIMIT:
            del recent[next(iter(recent))]

    def released(self, request_id: str) -> None:
        key = self._requests.pop(request_id, None)
        if key is None:
            return
        endpoint, adapter = key
        per = self._counts.get(endpoint)
        if per is None:
            return
        n = per.get(adapter, 0) - 1
        if n > 0:
            per[adapter] = n
        else:
            per.pop(adapter, None)
            self._misses.pop(key, None)

    # -- queries ------------------------------------------------------------------------
    def count(self, endpoint: str, adapter: str) -> int:
        return self._counts.get(endpoint, {}).get(adapter, 0)

    def adapters(self, endpoint: str) -> frozenset:
        """Adapters with a count > 0 on this endpoint."""
        return frozenset(self._counts.get(endpoint, ()))

    def recent(self, endpoint: str, n: int) -> frozenset:
        """The last ``n`` distinct adapters dispatched to ``endpoint`` (running or finished)."""
        order = self._recent.get(endpoint)
        if not order or n <= 0:
            return frozenset()
        return frozenset(list(order)[-n:])

    # -- reconcile ----------------------------------------------------------------------
    def maybe_reconcile(self, endpoints: Iterable[Endpoint], now: float) -> bool:
        if self._last is None:
            self._last = now
            return False
        if now - self._last < self.interval_s:
            return False
        self._last = now
        self.reconcile(endpoints)
        return True

    def reconcile(self, endpoints: Iterable[Endpoint]) -> None:
        self.reconciles += 1
        seen = {}
        for e in endpoints:
            m = e.metrics
            seen[e.name] = (m.active_lora_adapters | m.waiting_lora_adapters) if m is not None else frozenset()
        for endpoint in [e for e in self._recent if e not in seen]:
            self._forget(endpoint)
        for endpoint in list(self._counts):
            if endpoint not in seen:
                self._forget(endpoint)
                continue
            shown = seen[endpoint]
            for adapter in list(self._counts[endpoint]):
                key = (endpoint, adapter)
                if adapter in shown:
                    self._misses.pop(key, None)
                    continue
                misses = self._misses.get(key, 0) + 1
                if misses >= MISSES_BEFORE_RESET:
                    self._reset(endpoint, adapter)
                else:
                    self._misses[key] = misses

    def _reset(self, endpoint: str, adapter: str) -> None:
        self.resets += 1
        self._counts[endpoint].pop(adapter, None)
        self._misses.pop((endpoint, adapter), None)
        for rid in [r for r, k in self._requests.items() if k == (endpoint, adapter)]:
            del self._requests[rid]

    def _forget(self, endpoint: str) -> None:
        self._counts.pop(endpoint, None)
        self._recent.pop(endpoint, None)
        for key in [k for k in self._misses if k[0] == endpoint]:
            del self._misses[key]
        for rid in [r for r, k in self._requests.items() if k[0] == endpoint]:
            del self._requests[rid]
