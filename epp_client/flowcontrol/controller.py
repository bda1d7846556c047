"""The flow controller: priority bands of per-flow FIFO queues in front of the scheduler.

``enqueue`` admits a request into its band (one FIFO queue per fairness id) or rejects it
when the band or the whole controller is at capacity. ``dispatch_next(saturation)``
returns the next request to schedule, or None: nothing while the pool is saturated
(saturation >= 1.0, head-of-line blocking across all bands), otherwise bands strictly
from the highest priority down, each asking its fairness policy which flow goes next
(a band whose policy picks nothing is skipped). ``expire`` removes requests that waited
longer than the TTL. Rejections carry upstream's ``x-llm-d-request-dropped-reason``.
Time comes only from ``clock``.
"""
from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epp_client.flowcontrol.policies import DEFAULT_FLOW, GlobalStrictFairness, QueueView
from epp_client.flowcontrol.saturation import USAGE_LIMIT

DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"
REJECTED_CAPACITY = "rejected-saturated"      # upstream maps a full queue to this reason
REJECTED_TTL = "rejected-ttl-expired"


@dataclass(frozen=True)
class BandConfig:
    """A band template: its fairness policy (an object with ``pick``) and capacity."""

    policy: Any = None                          # None -> a fresh global-strict policy
    max_requests: int = 5000


@dataclass(eq=False)
class FlowItem:
    request_id: str
    fairness_id: str
    priority: int
    enqueued_at: float
    payload: Any = None


@dataclass
class Band:
    priority: int
    policy: Any
    max_requests: int
    queues: dict[str, collections.deque] = field(default_factory=dict)
    size: int = 0


class FlowController:
    def __init__(self, default_band: BandConfig | None = None, bands: dict[int, BandConfig] | None = None,
                 default_negative_band: BandConfig | None = None, request_ttl_s: float = 60.0,
                 max_requests: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.default_band = default_band or BandConfig()
        self.default_negative_band = default_negative_band
        self.band_configs = dict(bands or {})
        self.request_ttl_s = request_ttl_s          # 0 disables expiry
        self.max_requests = max_requests            # 0: no global limit
        self.clock = clock
        self.bands: dict[int, Band] = {}
        self.size = 0
        self.rejected: collections.Counter = collections.Counter()
        self.dispatched = 0
        for prio in self.band_configs:
            self._band(prio)

    # ---- bands ----------------------------------------------------------------------------
    def _band(self, priority: int) -> Band:
        b = self.bands.get(priority)
        if b is None:
            cfg = self.band_configs.get(priority)
            if cfg is None:
                cfg = self.default_negative_band if priority < 0 and self.default_negative_band else self.default_band
            b = self.bands[priority] = Band(priority, cfg.policy if cfg.policy is not None else GlobalStrictFairness(),
                                            cfg.max_requests)
            self.bands = dict(sorted(self.bands.items(), key=lambda kv: -kv[0]))
        return b

    def policies(self) -> list:
        """The distinct policy objects of the configured and provisioned bands."""
        out: list = []
        for pol in [b.policy for b in self.bands.values()] + [
                c.policy for c in (self.default_band, self.default_negative_band, *self.band_configs.values())
                if c is not None and c.policy is not None]:
            if all(pol is not p for p in out):
                out.append(pol)
        return out

    # ---- the request path -----------------------------------------------------------------
    def enqueue(self, request_id: str, fairness_id: str, priority: int = 0,
                payload: Any = None) -> tuple[FlowItem | None, str]:
        """(item, "") when queued; (None, reason) when rejected for capacity."""
        band = self._band(priority)
        if band.size >= band.max_requests or (self.max_requests and self.size >= self.max_requests):
            self.rejected[REJECTED_CAPACITY] += 1
            return None, REJECTED_CAPACITY
        item = FlowItem(request_id, fairness_id or DEFAULT_FLOW, priority, self.clock(), payload)
        band.queues.setdefault(item.fairness_id, collections.deque()).append(item)
        band.size += 1
        self.size += 1
        return item, ""

    def dispatch_next(self, saturation: float) -> FlowItem | None:
        if self.size == 0 or saturation >= USAGE_LIMIT:
            return None
        for band in self.bands.values():
            if band.size == 0:
                continue
            views = [QueueView(fid, len(q), q[0].enqueued_at) for fid, q in band.queues.items()]
            chosen = band.policy.pick(views)
            if chosen is None:
                continue
            item = self._pop(band, chosen.fairness_id)
            on_dispatch = getattr(band.policy, "on_dispatch", None)
            if on_dispatch is not None:
                on_dispatch(item.fairness_id)
            self.dispatched += 1
            return item
        return None

    def _pop(self, band: Band, fid: str) -> FlowItem:
        q = band.queues[fid]
        item = q.popleft()
        if not q:
            del band.queues[fid]
        band.size -= 1
        self.size -= 1
        return item

    def remove(self, item: FlowItem) -> bool:
        """Take a queued request out (client gone). False when it is no longer queued."""
        band = self.bands.get(item.priority)
        if band is None:
            return False
        q = band.queues.get(item.fairness_id)
        if q is None or item not in q:
            return False
        q.remove(item)
        if not q:
            del band.queues[item.fairness_id]
        band.size -= 1
        self.size -= 1
        return True

    def expire(self) -> list[FlowItem]:
        """Requests that have waited longer than the TTL, removed (each one is a 429 ``rejected-ttl-expired``)."""
        if self.request_ttl_s <= 0 or self.size == 0:
            return []
        now = self.clock()
        out = []
        for band in self.bands.values():
            for q in list(band.queues.values()):
                while q and now - q[0].enqueued_at >= self.request_ttl_s:
                    out.append(q[0])
                    self.remove(q[0])
        self.rejected[REJECTED_TTL] += len(out)
        return out

    def next_expiry(self) -> float | None:
        """When the oldest queued request expires (None: nothing queued or no TTL)."""
        if self.request_ttl_s <= 0 or self.size == 0:
            return None
        return min(q[0].enqueued_at for b in self.bands.values() for q in b.queues.values()) + self.request_ttl_s

    def on_complete(self, fairness_id: str, prompt_tokens: int, completion_tokens: int, priority: int = 0) -> None:
        """End of a dispatched request: its band's policy may keep per-program state."""
        cb = getattr(self._band(priority).policy, "on_complete", None)
        if cb is not None:
            cb(fairness_id or DEFAULT_FLOW, prompt_tokens, completion_tokens)

    def queue_sizes(self) -> dict[tuple[int, str], int]:
        return {(b.priority, fid): len(q) for b in self.bands.values() for fid, q in b.queues.items()}
