"""Discrete-event simulation of a cluster of model servers behind one router.

No per-token events: servers advance by engine steps; idle time is skipped. Events are
step ends (heap), timers (``call_at``, e.g. a KV transfer finishing), arrivals (a sorted
list), metric scrapes and router ticks (fixed intervals, only while arrivals remain). Ties
are broken deterministically: step ends, then timers, then client deadlines, then scrapes,
then ticks, then router wake-ups, then arrivals, each in index order.

With ``ClusterConfig.realism`` (``realism.Realism``; the default of every scenario run) each
server is scraped on its own schedule and each scrape is delivered late, so the router's
view is per-server stale; step times carry the servers' noise; the router is told the
gateway's estimate of each prompt's length; and each request is abandoned at its client
deadline: its server frees its slot and KV blocks at once (vLLM aborts a request whose
client disconnected, queued or running), the router hears ``on_finish`` (or ``on_abandon``
if it still holds the request), and the request counts as ``abandoned``. The last event is
then the last arrival's deadline: nothing drains after it.

``stop_after_misses`` (capacity probes, ``capacity.py``) ends a run early once more requests
are known to miss their SLO (a late first token, a completion over an SLO, an abandoned or
shed request) than that: the run's attainment is then certainly below the threshold it was
derived from, and ``SimResult.extra`` says so (``decided_at``: the share of arrivals routed,
``known_misses``).

Two hooks serve routers that hold requests back (flow control) and closed-loop workloads:
``route`` may return ``DEFERRED`` (the router keeps the request and later calls
``sim.dispatch``; ``sim.wake(t)`` asks for an ``on_wake(t)`` call), and ``sim.inject(req)``
adds an arrival during the run (a program's next turn). Scrapes and ticks continue while
injected arrivals or wake-ups are pending.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .adapters import AdapterSlots, LoraSpec
from .realism import Realism
from .request import SimRequest
from .server import Metrics, ModelServer
from .stepmodel import ServerSpec

#: ``Router.route`` result: the router keeps the request and dispatches it later itself.
DEFERRED = -1


class Router(Protocol):
    """The engine's events, as the ASGI calls are the gateway's: routing policies implement
    epp_client's request lifecycle and are driven by ``driver.LifecycleRouter``."""

    name: str

    def bind(self, sim: Simulation) -> None: ...
    def route(self, req: SimRequest, now: float) -> int | None: ...
    def on_dispatch(self, req: SimRequest, idx: int, now: float) -> None: ...
    def on_first_token(self, req: SimRequest, now: float) -> None: ...
    def on_finish(self, req: SimRequest, now: float) -> None: ...
    def on_tick(self, now: float) -> None: ...
    def on_wake(self, now: float) -> None: ...


@dataclass
class ClusterConfig:
    servers: Sequence[ServerSpec]
    scrape_interval_s: float = 0.05     # how often the router's metrics view is refreshed
    scrape_delay_s: float = 0.0         # extra staleness: a scrape becomes visible this much later
    prefix_caching: bool = True
    lora: LoraSpec | None = None         # adapter slots on every server (``adapters``); None: no LoRA
    realism: Realism | None = None       # what a real EPP lives with (``realism``); None: the idealised world

    def __post_init__(self) -> None:
        if not self.servers:
            raise ValueError("cluster needs at least one server")
        if self.scrape_interval_s <= 0 or self.scrape_delay_s < 0:
            raise ValueError("scrape_interval_s must be > 0 and scrape_delay_s >= 0")
        if self.realism is not None:    # realism owns the scrapes: per server, its interval, late
            self.scrape_interval_s, self.scrape_delay_s = self.realism.scrape_interval_s, 0.0


@dataclass
class SimResult:
    requests: list
    busy_time: list
    duration_s: float
    steps: int
    preemptions: int
    prompt_tokens: int
    hit_tokens: int
    extra: dict = field(default_factory=dict)


class Simulation:
    def __init__(self, cluster: ClusterConfig, requests: list[SimRequest], router,
                 tick_interval_s: float = 0.0, progress: Callable[[float], None] | None = None,
                 stop_after_misses: int | None = None) -> None:
        self.cluster = cluster
        # a Sequence: a subclass may hold a subclass of ModelServer (PDSimulation: PDModelServer)
        self.servers: Sequence[ModelServer] = [ModelServer(i, s, cluster.prefix_caching)
                                               for i, s in enumerate(cluster.servers)]
        if cluster.lora is not None:
            for srv in self.servers:
                srv.adapters = AdapterSlots(cluster.lora)
        self.requests = requests
        self.router = router
        self.now = 0.0
        self.scraped: list[Metrics] = [s.metrics(0.0) for s in self.servers]
        self.tick_interval_s = tick_interval_s
        self.progress = progress
        self._heap: list = []
        self._seq = 0
        self._busy = [False] * len(self.servers)
        self._pending_scrapes: list = []   # (visible_at, snapshot list)
        self._injected: list = []          # (arrival, seq, request) added during the run
        self._wakes: list = []             # router wake-up times
        self.injected: list[SimRequest] = []
        self._timers: list = []            # heap of (time, seq, callback(now))
        self.realism = cluster.realism
        self._deadlines: list = []         # heap of (client deadline, request id, request) (realism)
        self._scrape_at: list = []         # heap of (next scrape, server) (realism: per-server phases)
        self._scrape_delays: list = []     # per server: its scrapes' delivery delays (realism)
        self._deliveries = 0               # tie-breaker of pending scrapes
        self.stop_after_misses = stop_after_misses
        self._missed: set[int] | None = set() if stop_after_misses is not None else None   # known misses (rid)
        self._decided = False              # more known misses than stop_after_misses: the run stops

    def _miss(self, req: SimRequest) -> None:
        """Count ``req`` as a known miss (once) when the run stops on misses."""
        missed = self._missed
        if missed is not None and req.rid not in missed:
            missed.add(req.rid)
            if len(missed) > (self.stop_after_misses or 0):
                self._decided = True

    def _counting(self, first_cb, fin_cb):
        """The router's first-token and finish callbacks, counting the misses they reveal."""
        def first(req: SimRequest, t: float) -> None:
            if 0 < req.ttft_slo_ms < (t - req.arrival) * 1000.0:
                self._miss(req)
            first_cb(req, t)

        def fin(req: SimRequest, t: float) -> None:
            if not req.meets_slo():
                self._miss(req)
            fin_cb(req, t)
        return first, fin

    def call_at(self, t: float, fn: Callable[[float], None]) -> None:
        """Run ``fn(t)`` at simulated time ``t`` (after the step ends due then)."""
        self._seq += 1
        heapq.heappush(self._timers, (t, self._seq, fn))

    def start_server(self, idx: int, now: float) -> None:
        """Start the server's next step if it is idle (after adding work outside an arrival)."""
        if not self._busy[idx]:
            self._start(idx, now)

    # -- helpers for routers --------------------------------------------------------------
    def metrics(self) -> list[Metrics]:
        return self.scraped

    def inject(self, req: SimRequest) -> None:
        """A new arrival at ``req.arrival`` (>= now), e.g. a program's next turn."""
        self._seq += 1
        heapq.heappush(self._injected, (req.arrival, self._seq, req))
        self.injected.append(req)
        if self.realism is not None:
            self._prepare(req)

    def wake(self, t: float) -> None:
        """Call ``router.on_wake(t)`` at time ``t`` (>= now)."""
        heapq.heappush(self._wakes, t)

    def dispatch(self, req: SimRequest, idx: int, t: float) -> None:
        """Send ``req`` to server ``idx`` now (a request that can never fit there is shed)."""
        srv = self.servers[idx]
        if req.abandoned:       # its client left while a router held it (a router without on_abandon)
            return
        if -(-(req.input_len + req.output_len) // srv.bs) > srv.kv.num_blocks:
            req.shed = True     # can never fit on this server
            self._miss(req)
            return
        req.dispatch_t = t
        srv.add(req, t)
        self.router.on_dispatch(req, idx, t)
        if not self._busy[idx]:
            self._start(idx, t)

    def _start(self, idx: int, now: float) -> None:
        srv = self.servers[idx]
        while srv.has_work():
            dur = srv.plan_step(now)
            if dur > 0:
                srv.busy_until = now + dur
                self._seq += 1
                heapq.heappush(self._heap, (now + dur, self._seq, idx))
                self._busy[idx] = True
                return
            # nothing schedulable and nothing running: the head can never fit; drop it
            if srv.running or not srv.waiting:
                break
            req = srv.waiting.popleft()
            req.shed = True
            self._miss(req)
            self.router.on_finish(req, now)
        self._busy[idx] = False

    def _scrape(self, t: float) -> float:
        """Scrape what is due at ``t``; return the time of the next scrape."""
        if self.realism is not None:
            _, idx = heapq.heappop(self._scrape_at)
            self._deliveries += 1
            heapq.heappush(self._pending_scrapes, (t + next(self._scrape_delays[idx]), self._deliveries, idx,
                                                   self.servers[idx].metrics(t)))
            heapq.heappush(self._scrape_at, (t + self.cluster.scrape_interval_s, idx))
            return self._scrape_at[0][0]
        snap = [s.metrics(t) for s in self.servers]
        if self.cluster.scrape_delay_s > 0:
            self._deliveries += 1
            heapq.heappush(self._pending_scrapes, (t + self.cluster.scrape_delay_s, self._deliveries, -1, snap))
        else:
            self.scraped = snap
        return t + self.cluster.scrape_interval_s

    def _deliver_scrape(self) -> None:
        _, _, idx, m = heapq.heappop(self._pending_scrapes)
        if idx < 0:
            self.scraped = m
        elif m.time >= self.scraped[idx].time:     # never replace a newer view with an older one
            scraped = list(self.scraped)
            scraped[idx] = m
            self.scraped = scraped

    # -- realism: per-server scrapes, noise, what the router is told, client deadlines -----------
    def _start_realism(self, realism: Realism) -> None:
        for srv in self.servers:
            srv.noise = realism.step_noise(srv.index)
        self._scrape_at = [(realism.scrape_phase(i), i) for i in range(len(self.servers))]
        heapq.heapify(self._scrape_at)
        self._scrape_delays = [realism.scrape_delays(i) for i in range(len(self.servers))]
        for req in self.requests:
            self._prepare(req)

    def _prepare(self, req: SimRequest) -> None:
        realism = self.realism
        assert realism is not None
        req.seg_bytes = realism.segment_bytes(req.segments)
        req.est_input_len = realism.estimated_tokens(req.input_len, req.seg_bytes)
        if realism.deadline_s > 0:
            req.deadline = req.arrival + realism.deadline_s
            heapq.heappush(self._deadlines, (req.deadline, req.rid, req))

    def _abandon(self, req: SimRequest, now: float) -> None:
        """The client of ``req`` gives up: the engine frees what the request holds."""
        if req.finish_t >= 0 or req.shed or req.abandoned:
            return
        req.abandoned = True
        self._miss(req)
        if req.dispatch_t >= 0:
            idx = req.server
            self.servers[idx].abandon(req)
            self.router.on_finish(req, now)
            self.start_server(idx, now)
        else:
            hook = getattr(self.router, "on_abandon", None)
            if hook is not None:
                hook(req, now)

    # -- main loop ------------------------------------------------------------------------
    def run(self) -> SimResult:
        reqs = self.requests
        n = len(reqs)
        router = self.router
        router.bind(self)
        heap = self._heap
        servers = self.servers
        inf = math.inf
        if self.realism is not None:
            self._start_realism(self.realism)
        next_scrape = self._scrape_at[0][0] if self._scrape_at else 0.0
        tick = self.tick_interval_s
        next_tick = tick if tick > 0 else inf
        ai = 0
        first_cb = router.on_first_token
        fin_cb = router.on_finish
        if self._missed is not None:
            first_cb, fin_cb = self._counting(first_cb, fin_cb)
        last_progress = -1
        injected, wakes, timers, deadlines = self._injected, self._wakes, self._timers, self._deadlines
        pending = self._pending_scrapes
        realistic = self.realism is not None
        while not self._decided:
            t_step = heap[0][0] if heap else inf
            t_arr = reqs[ai].arrival if ai < n else inf
            t_inj = injected[0][0] if injected else inf
            t_wake = wakes[0] if wakes else inf
            t_timer = timers[0][0] if timers else inf
            t_dead = deadlines[0][0] if deadlines else inf
            if (t_step == inf and t_arr == inf and t_inj == inf and t_wake == inf and t_timer == inf
                    and t_dead == inf):
                break
            more = ai < n or injected or wakes
            if t_inj < t_arr:
                t_arr = t_inj
            if realistic and pending:       # a late scrape arrives in time order with everything else
                t_del = pending[0][0]
                if (t_del <= t_step and t_del <= t_arr and t_del <= t_wake and t_del <= t_timer and t_del <= t_dead
                        and (not more or (t_del <= next_scrape and t_del <= next_tick))):
                    self.now = t_del
                    self._deliver_scrape()
                    continue
            if (t_timer < t_step and t_timer <= t_arr and t_timer <= t_wake and t_timer <= t_dead
                    and (not more or (t_timer <= next_scrape and t_timer <= next_tick))):
                t, _, fn = heapq.heappop(timers)
                self.now = t
                fn(t)
                continue
            if (t_dead < t_step and t_dead < t_timer and t_dead <= t_arr and t_dead <= t_wake
                    and (not more or (t_dead <= next_scrape and t_dead <= next_tick))):
                t, _, req = heapq.heappop(deadlines)
                self.now = t
                self._abandon(req, t)
                continue
            t_scr = next_scrape if more else inf
            t_tick = next_tick if more else inf
            if not realistic and pending and pending[0][0] <= min(t_step, t_arr):
                self._deliver_scrape()
                continue
            # a router's wake-up in time order; the idealised world keeps its historical order (a
            # wake-up waits for the next arrival or tick), except where that order would scrape forever
            w = t_wake if realistic or (t_step == inf and t_arr == inf and t_timer == inf and t_tick == inf) else inf
            if t_step <= t_scr and t_step <= t_tick and t_step <= t_arr and t_step <= w:
                t, _, idx = heapq.heappop(heap)
                self.now = t
                servers[idx].finish_step(t, first_cb, fin_cb)
                self._start(idx, t)
            elif t_scr <= t_tick and t_scr <= t_arr and t_scr <= w:
                self.now = t_scr
                next_scrape = self._scrape(t_scr)
            elif t_tick <= t_arr and t_tick <= t_wake:
                self.now = t_tick
                router.on_tick(t_tick)
                next_tick = t_tick + tick
            elif t_wake <= t_arr:
                self.now = heapq.heappop(wakes)
                while wakes and wakes[0] <= self.now:
                    heapq.heappop(wakes)
                router.on_wake(self.now)
            else:
                if t_inj <= t_arr and injected:
                    req = heapq.heappop(injected)[2]
                else:
                    req = reqs[ai]
                    ai += 1
                self.now = t = req.arrival
                idx = router.route(req, t)
                if idx is None:
                    req.shed = True
                    self._miss(req)
                elif idx != DEFERRED:
                    self.dispatch(req, idx, t)
                if self.progress is not None and n:
                    pct = (100 * ai) // n
                    if pct != last_progress:
                        last_progress = pct
                        self.progress(ai / n)
        extra = {"decided_at": ai / n if n else 1.0, "known_misses": len(self._missed or ())} if self._decided else {}
        return SimResult(
            requests=reqs + self.injected if self.injected else reqs, busy_time=[s.busy_time for s in servers],
            duration_s=self.now,
            steps=sum(s.steps for s in servers), preemptions=sum(s.preemptions for s in servers),
            prompt_tokens=sum(s.prompt_tokens for s in servers), hit_tokens=sum(s.hit_tokens for s in servers),
            extra=extra,
        )
