"""Flow control in the simulator: epp_client's FlowController in front of any router, on
simulated time.

``FlowSimRouter`` wraps a router. Without flow control it only forwards (and tells a
closed-loop workload driver when a request ends). With flow control every arrival is
enqueued (one FIFO per fairness id = the request's program, bands by priority); while
the pool is saturated requests wait, otherwise the fairness policy picks the flow that
dispatches next and the inner router picks its endpoint. Saturation is read again after
every dispatch, by llm-d's utilization detector (the scraped metrics) or its concurrency
detector (the inner policy's in-flight accounting, which a dispatch updates at once).
Waiting requests are re-examined at every completion and at
every scrape interval; a request that waits longer than the TTL, or finds its band full,
is rejected (shed) with upstream's reason. Policy names: ``<router>+<ordering>``, e.g.
``token-load+turn-priority`` (router ``token-load`` = ``llmd-token-load``).
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from epp_client.flowcontrol import (
    REJECTED_TTL,
    BandConfig,
    ConcurrencyDetector,
    EndpointLoad,
    FlowControl,
    FlowController,
    FlowItem,
    GlobalStrictFairness,
    ProgramAwareFairness,
    RoundRobinFairness,
    UtilizationDetector,
    build_flow_control,
    make_detector,
)
from epp_client.flowcontrol.program_aware import STRATEGIES

from .engine import DEFERRED
from .request import SimRequest

if TYPE_CHECKING:
    from .engine import Simulation

ORDERINGS = ("fcfs", "round-robin", "las", "turn-priority")
BASE_ALIASES = {"token-load": "llmd-token-load", "default": "llmd-default"}
ADMISSION_DENIED = "rejected-admission"
NEVER_FITS = "rejected-too-large"


def flow_id(req: SimRequest) -> str:
    """The fairness id a simulated request carries: its program (session), else ``default-flow``."""
    return f"program-{req.session}" if req.session >= 0 else "default-flow"


class FlowSimRouter:
    def __init__(self, inner, flow: FlowControl | None = None, driver=None, name: str | None = None,
                 description: str = "") -> None:
        self.inner = inner
        self.flow = flow
        self.driver = driver
        self.name = name or inner.name
        self.description = description or getattr(inner, "description", "")
        self.tick_interval_s = getattr(inner, "tick_interval_s", 0.0)
        self.sim: Simulation | None = None
        self.rejected: collections.Counter = collections.Counter()
        self._wake_at: float | None = None
        self._queued: dict[int, FlowItem] = {}    # request id -> its FlowItem while queued

    def now(self) -> float:
        return self.sim.now if self.sim is not None else 0.0

    def _sim(self) -> Simulation:
        if self.sim is None:
            raise RuntimeError(f"{self.name}: not bound to a simulation (bind() first)")
        return self.sim

    # ---- engine protocol ------------------------------------------------------------------
    def bind(self, sim) -> None:
        self.sim = sim
        self.inner.bind(sim)
        if self.driver is not None:
            self.driver.bind(sim)
        detector = getattr(self.flow, "detector", None)
        if isinstance(detector, UtilizationDetector):    # the gateway's staleness floor (gateway/flowgate.py)
            detector.metrics_staleness_s = max(detector.metrics_staleness_s, 2 * sim.cluster.scrape_interval_s)
        if isinstance(detector, ConcurrencyDetector) and self._tracker() is None:
            raise ValueError(f"{self.name}: concurrency-detector needs a router with in-flight accounting "
                             "(an llm-d policy), not " + type(self.inner).__name__)

    def _tracker(self):
        """The inner policy's in-flight accounting (``inflight-load-producer``), if it keeps one."""
        return getattr(getattr(self.inner, "lifecycle", None), "inflight", None)

    def route(self, req: SimRequest, now: float):
        if self.flow is None:
            self._send(req, now)
            return DEFERRED
        item, reason = self.flow.controller.enqueue(str(req.rid), flow_id(req), req.priority, payload=req)
        if item is None:
            self._reject(req, reason, now)
        else:
            self._queued[req.rid] = item
            self._pump(now)
        return DEFERRED

    def on_wake(self, now: float) -> None:
        self.inner.on_wake(now)             # requests the inner policy holds
        if self.flow is not None:
            self._wake_at = None
            self._pump(now)

    def on_dispatch(self, req: SimRequest, idx: int, now: float) -> None:
        self.inner.on_dispatch(req, idx, now)

    def on_first_token(self, req: SimRequest, now: float) -> None:
        self.inner.on_first_token(req, now)

    def on_finish(self, req: SimRequest, now: float) -> None:
        self.inner.on_finish(req, now)
        if self.flow is not None:
            self.flow.controller.on_complete(flow_id(req), req.input_len, req.generated, req.priority)
            if self.flow.controller.size:
                self._wake(now)         # after this step's bookkeeping, not inside it
        if self.driver is not None:
            self.driver.on_finish(req, now)

    def on_tick(self, now: float) -> None:
        self.inner.on_tick(now)

    def on_abandon(self, req: SimRequest, now: float) -> None:
        """The client of a request not dispatched yet left: out of its queue (or the inner policy's hold)."""
        item = self._queued.pop(req.rid, None)
        if item is None or self.flow is None or not self.flow.controller.remove(item):
            hook = getattr(self.inner, "on_abandon", None)
            if hook is not None:
                hook(req, now)
        if self.driver is not None:
            self.driver.on_finish(req, now)

    # ---- flow control ---------------------------------------------------------------------
    def _send(self, req: SimRequest, now: float) -> bool:
        idx = self.inner.route(req, now)
        if idx is None:
            self._reject(req, ADMISSION_DENIED, now)
            return False
        if idx == DEFERRED:     # the inner policy holds it and dispatches it itself (its on_wake)
            return True
        self._sim().dispatch(req, idx, now)
        if req.shed:
            self._reject(req, NEVER_FITS, now)
            return False
        return True

    def _pump(self, now: float) -> None:
        if self.flow is None:
            raise RuntimeError(f"{self.name}: no flow control to pump")   # only woken with flow control
        sim = self._sim()
        ctl, det = self.flow.controller, self.flow.detector
        for item in ctl.expire():
            self._queued.pop(item.payload.rid, None)
            self._reject(item.payload, REJECTED_TTL, now)
        while True:       # saturation again after every dispatch: in-flight counts change at once
            item = ctl.dispatch_next(det.saturation(self._loads(), now))
            if item is None:
                break
            self._queued.pop(item.payload.rid, None)
            if not self._send(item.payload, now):
                ctl.on_complete(item.fairness_id, 0, 0, item.priority)   # never reached a server
        if ctl.size:
            nxt = now + sim.cluster.scrape_interval_s
            exp = ctl.next_expiry()
            self._wake(min(nxt, exp) if exp is not None and exp > now else nxt)

    def _loads(self) -> list[EndpointLoad]:
        """Per server: its scraped metrics and the inner router's in-flight counts (when it keeps them)."""
        sim = self._sim()
        tracker = self._tracker()
        names = [e.name for e in getattr(self.inner, "endpoints", ())]
        if tracker is None or len(names) != len(sim.scraped):
            return [EndpointLoad(m.waiting, m.kv_cache_usage, m.time) for m in sim.scraped]
        out = []
        for m, name in zip(sim.scraped, names):
            ld = tracker.snapshot(name)
            out.append(EndpointLoad(m.waiting, m.kv_cache_usage, m.time, ld.requests, ld.tokens))
        return out

    def _wake(self, t: float) -> None:
        if self._wake_at is None or t < self._wake_at:
            self._wake_at = t
            self._sim().wake(t)

    def _reject(self, req: SimRequest, reason: str, now: float) -> None:
        req.shed = True
        self.rejected[reason] += 1
        if self.driver is not None:
            self.driver.on_finish(req, now)

    # ---- results ---------------------------------------------------------------------------
    def stats(self) -> dict:
        out = dict(self.inner.stats())
        out.update({f"flow_{k}": v for k, v in self.rejected.items()})
        if self.flow is not None:
            out["flow_dispatched"] = self.flow.controller.dispatched
            for pol in self.flow.controller.policies():
                if isinstance(pol, ProgramAwareFairness):
                    out["program_aware_jains_index"] = pol.jains_index()
                    out["program_aware_evicted"] = pol.evicted
        return out

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


def policy_params(params: dict | None) -> dict:
    """Check ``program-aware-fairness`` parameters given for the ``+las`` / ``+turn-priority``
    orderings (camelCase; ``strategy`` comes from the ordering); ConfigError names a bad one."""
    params = dict(params or {})
    if "strategy" in params:
        raise ValueError("program-aware-fairness.strategy: set by the policy name's ordering (+las, "
                         "+turn-priority), not by a parameter")
    ProgramAwareFairness.from_config(params)
    return params


def params_note(params: dict | None) -> str:
    """One line for reports: the program-aware-fairness parameters given (empty when none)."""
    if not params:
        return ""
    return ("program-aware-fairness parameters of the +las and +turn-priority policies: "
            + ", ".join(f"{k}={v}" for k, v in params.items()) + " (B4.5's defaults for the others)")


def _policy(ordering: str, clock, params: dict | None = None):
    if ordering == "fcfs":
        return GlobalStrictFairness()
    if ordering == "round-robin":
        return RoundRobinFairness()
    return ProgramAwareFairness.from_config({**policy_params(params), "strategy": ordering}, clock=clock)


def split(policy: str) -> tuple[str, str] | None:
    """``"token-load+las"`` -> ("llmd-token-load", "las"); None for a plain policy name."""
    if "+" not in policy:
        return None
    base, ordering = policy.split("+", 1)
    if ordering not in ORDERINGS:
        raise ValueError(f"unknown flow-control ordering {ordering!r} in {policy!r}; known: {', '.join(ORDERINGS)}")
    return BASE_ALIASES.get(base, base), ordering


def make(policy: str, inner, request_ttl_s: float = 60.0, detector: dict | None = None,
         params: dict | None = None) -> FlowSimRouter:
    """``<router>+<ordering>``: flow control with one default band using that ordering;
    ``detector``: the saturation detector's ``type`` (default ``utilization-detector``) and
    parameters (camelCase; llm-d's defaults otherwise); ``params``: program-aware-fairness
    parameters for the ``las`` and ``turn-priority`` orderings (B4.5's defaults otherwise;
    the other orderings have none and ignore them)."""
    parts = split(policy)
    if parts is None:
        raise ValueError(f"{policy!r} is not a flow-control policy (<router>+<ordering>)")
    _, ordering = parts
    router = FlowSimRouter(inner, None, name=policy)
    pol = _policy(ordering, router.now, params)
    router.flow = FlowControl(FlowController(BandConfig(pol), request_ttl_s=request_ttl_s, clock=router.now),
                              make_detector(detector))
    tuned = ", " + ", ".join(f"{k}={v}" for k, v in params.items()) if params and ordering in STRATEGIES else ""
    router.description = (f"flow control ({ordering}{tuned} across programs, request TTL {request_ttl_s:g} s, "
                          f"llm-d {router.flow.detector.TYPE} {_params(detector) or 'with its defaults'}) "
                          "in front of: " + router.description)
    return router


def _params(detector: dict | None) -> dict:
    return {k: v for k, v in (detector or {}).items() if k != "type"}


def from_config(inner, config_text: str) -> FlowSimRouter:
    """Flow control from an EndpointPickerConfig's ``flowControl`` section (unchanged router when absent)."""
    router = FlowSimRouter(inner)
    router.flow = build_flow_control(config_text, clock=router.now)
    return router
