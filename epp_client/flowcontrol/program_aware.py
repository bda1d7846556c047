"""``program-aware-fairness``: per-program metrics and two strategies, LAS and turn-priority.

A program is a fairness id (``default-flow`` when empty). Per program the policy keeps
the dispatched count, the requests in flight, the last completion time (initialised to
the creation time), the running mean queue wait and, for LAS, the attained service.
Time comes only from ``clock`` (seconds); the eviction sweep runs lazily, at the first
call once ``eviction_sweep_s`` have passed since the last sweep.

* ``las``: at completion ``cost = prompt_tokens + 2 x completion_tokens`` is added to the
  program's attained service S, which decays lazily as ``S <- S x 2^(-dt/halfLife)``
  (pending decay folded in before new cost is added; no decay when halfLife is 0). Pick
  scores every waiting flow ``wS x (1 - norm(S)) + wW x norm(headWaitMs)`` with
  ``norm(v) = (v - min)/(max - min)`` over the waiting flows (0.5 when max = min); the
  highest wins, ties go to the first flow given.
* ``turn-priority``: scoring engages only under contention. No waiting flow -> None; one
  -> that flow without scoring; two or more -> ``turn_number + timeWeight x
  headWaitSeconds``, highest first (ties: first given), where ``turn_number`` is the
  program's dispatched count + 1. The count is reset when the idle program is evicted
  (no request in flight, last completion older than ``evictionTtlSeconds``).

Metrics (``jains_index``, ``avg_wait_ms``, ``attained_service``): Jain's index
``(sum x)^2 / (n sum x^2)`` over the per-program mean waits (1 when n <= 1 or sum x^2 = 0).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass

from epp_client.flowcontrol.policies import DEFAULT_FLOW, QueueView, waiting
from epp_client.framework.params import Plugin, ge, gt, one_of, param

STRATEGIES = ("las", "turn-priority")


@dataclass
class ProgramMetrics:
    created: float
    dispatched: int = 0
    in_flight: int = 0
    last_completion: float = 0.0
    wait_sum_ms: float = 0.0
    wait_n: int = 0
    service: float = 0.0          # attained service (weighted tokens) as of ``service_at``
    service_at: float = 0.0

    @property
    def mean_wait_ms(self) -> float:
        return self.wait_sum_ms / self.wait_n if self.wait_n else 0.0


def jains_index(values: Sequence[float]) -> float:
    n = len(values)
    sq = sum(x * x for x in values)
    if n <= 1 or sq == 0:
        return 1.0
    return sum(values) ** 2 / (n * sq)


class ProgramAwareFairness(Plugin):
    TYPE = "program-aware-fairness"

    _: KW_ONLY
    strategy: str = param("strategy", default="las", check=one_of(*STRATEGIES))
    eviction_ttl_s: float = param("evictionTtlSeconds", default=3600.0, check=ge(0.0))
    eviction_sweep_s: float = param("evictionSweepSeconds", default=300.0, check=gt(0.0))
    las_weight_service: float = param("lasWeightService", default=0.8, check=ge(0.0))
    las_weight_head_wait: float = param("lasWeightHeadWait", default=0.2, check=ge(0.0))
    las_half_life_s: float = param("lasHalfLifeSeconds", default=60.0, check=ge(0.0))
    turn_priority_time_weight: float = param("turnPriorityTimeWeight", default=0.5, check=ge(0.0))
    clock: Callable[[], float] = time.monotonic

    def setup(self) -> None:
        self.programs: dict[str, ProgramMetrics] = {}
        self._picked: dict[str, float] = {}     # program -> enqueue time of the head Pick chose
        self._last_sweep = self.clock()
        self.evicted = 0

    # ---- bookkeeping --------------------------------------------------------------------
    def _now(self) -> float:
        now = self.clock()
        if now - self._last_sweep >= self.eviction_sweep_s:
            self._last_sweep = now
            self._sweep(now)
        return now

    def _sweep(self, now: float) -> None:
        if self.eviction_ttl_s <= 0:
            return
        for pid in [p for p, m in self.programs.items()
                    if m.in_flight == 0 and now - m.last_completion > self.eviction_ttl_s]:
            del self.programs[pid]
            self._picked.pop(pid, None)
            self.evicted += 1

    def _program(self, pid: str, now: float) -> ProgramMetrics:
        pid = pid or DEFAULT_FLOW
        m = self.programs.get(pid)
        if m is None:
            m = self.programs[pid] = ProgramMetrics(created=now, last_completion=now, service_at=now)
        return m

    def _decayed(self, m: ProgramMetrics, now: float) -> float:
        if self.las_half_life_s > 0 and now > m.service_at:
            m.service *= 2.0 ** (-(now - m.service_at) / self.las_half_life_s)
        m.service_at = max(m.service_at, now)
        return m.service

    def turn_number(self, pid: str) -> int:
        m = self.programs.get(pid or DEFAULT_FLOW)
        return 1 if m is None else m.dispatched + 1

    # ---- the fairness-policy interface --------------------------------------------------
    def pick(self, queues: Sequence[QueueView]) -> QueueView | None:
        now = self._now()
        ready = waiting(queues)
        if not ready:
            return None
        if self.strategy == "las":
            chosen = self._pick_las(ready, now)
        else:
            chosen = ready[0] if len(ready) == 1 else self._pick_turn(ready, now)
        self._picked[chosen.fairness_id or DEFAULT_FLOW] = chosen.head_enqueued_at
        return chosen

    def _pick_las(self, ready: list[QueueView], now: float) -> QueueView:
        service = []
        for q in ready:
            m = self.programs.get(q.fairness_id or DEFAULT_FLOW)
            service.append(self._decayed(m, now) if m is not None else 0.0)
        waits = [max(0.0, now - q.head_enqueued_at) * 1000.0 for q in ready]
        s_lo, s_hi, w_lo, w_hi = min(service), max(service), min(waits), max(waits)
        best, best_score = ready[0], float("-inf")
        for q, s, w in zip(ready, service, waits):
            score = (self.las_weight_service * (1.0 - _norm(s, s_lo, s_hi))
                     + self.las_weight_head_wait * _norm(w, w_lo, w_hi))
            if score > best_score:
                best, best_score = q, score
        return best

    def _pick_turn(self, ready: list[QueueView], now: float) -> QueueView:
        best, best_score = ready[0], float("-inf")
        for q in ready:
            score = (self.turn_number(q.fairness_id)
                     + self.turn_priority_time_weight * max(0.0, now - q.head_enqueued_at))
            if score > best_score:
                best, best_score = q, score
        return best

    def on_dispatch(self, fairness_id: str) -> None:
        """The request Pick chose leaves the queue (PreRequest): count it, record its wait."""
        now = self._now()
        pid = fairness_id or DEFAULT_FLOW
        m = self._program(pid, now)
        m.dispatched += 1
        m.in_flight += 1
        enq = self._picked.pop(pid, None)
        if enq is not None:
            m.wait_sum_ms += max(0.0, now - enq) * 1000.0
            m.wait_n += 1

    def on_complete(self, fairness_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        """End of stream: one fewer in flight; LAS adds ``prompt + 2 x completion`` after decay."""
        now = self._now()
        m = self._program(fairness_id, now)
        m.in_flight = max(0, m.in_flight - 1)
        m.last_completion = now
        if self.strategy == "las":
            self._decayed(m, now)
            m.service += max(0, prompt_tokens) + 2.0 * max(0, completion_tokens)

    # ---- metrics ------------------------------------------------------------------------
    def jains_index(self) -> float:
        return jains_index([m.mean_wait_ms for m in self.programs.values() if m.wait_n])

    def avg_wait_ms(self) -> dict[str, float]:
        return {p: m.mean_wait_ms for p, m in self.programs.items() if m.wait_n}

    def attained_service(self) -> dict[str, float]:
        """Per program as of its last completion (the gauge upstream writes at EOS)."""
        return {p: m.service for p, m in self.programs.items()} if self.strategy == "las" else {}


def _norm(v: float, lo: float, hi: float) -> float:
    return 0.5 if hi == lo else (v - lo) / (hi - lo)
