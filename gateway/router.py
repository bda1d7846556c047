"""How the gateway asks for a routing decision, and tells the router what happened.

A router gets the request and the candidates (endpoint state + prefix match) and returns
a :class:`Decision`: the endpoints to try in order (the first is the pick, the rest are
used only for a retry before the first byte), or a denial. The lifecycle hooks mirror
the EPP's PreRequest / first body chunk / end of stream. ``BuiltinRouter`` needs nothing
but the gateway's own state; ``epp_router.EppRouter`` wraps the ``epp_client`` scheduler.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from .prefix import Match
from .scrape import EndpointState


@dataclass
class RequestInfo:
    request_id: str
    headers: dict[str, str]      # lower-case names
    priority: int
    input_tokens: int
    model: str
    streaming: bool
    max_tokens: int | None
    path: str


@dataclass
class Candidate:
    state: EndpointState
    prefix: Match


@dataclass
class Decision:
    order: list[Candidate]                 # try order; empty when denied
    admitted: bool = True
    status: int = 200
    reason: str = ""
    fallback: bool = False                 # predictions were unavailable
    predicted: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (ttft, tpot)
    model_version: str = ""
    handle: Any = None                     # router's per-request state


@dataclass
class Outcome:
    ok: bool                               # natural completion with a 2xx status
    status: int
    ttft_ms: float | None                  # from dispatch to the first token
    e2e_ms: float | None
    tokens: int                            # generated tokens (usage when reported)
    chunks: int                            # content events (streaming) or 1


class Router(Protocol):
    name: str

    async def schedule(self, req: RequestInfo, candidates: list[Candidate]) -> Decision: ...

    def on_dispatch(self, decision: Decision, cand: Candidate, req: RequestInfo, now: float) -> None: ...

    def on_first_chunk(self, decision: Decision, cand: Candidate, req: RequestInfo, now: float) -> None: ...

    def on_complete(self, decision: Decision, cand: Candidate, req: RequestInfo,
                    outcome: Outcome, now: float) -> None: ...

    async def aclose(self) -> None: ...


class BuiltinRouter:
    """Least in-flight load with prefix affinity: used without ``--config`` and as the
    fallback when the configured scheduler fails. Score = prefix score - normalised
    in-flight requests - normalised waiting queue; ties broken at random."""

    name = "builtin-least-load"

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()

    async def schedule(self, req: RequestInfo, candidates: list[Candidate]) -> Decision:
        return Decision(order=self.rank(candidates), fallback=True)

    def rank(self, candidates: list[Candidate]) -> list[Candidate]:
        if not candidates:
            return []
        max_inf = max(c.state.inflight_requests for c in candidates) or 1
        max_q = max((c.state.metrics.waiting or 0) for c in candidates) or 1

        def key(c: Candidate) -> tuple[float, float]:
            s = c.prefix.score - c.state.inflight_requests / max_inf - (c.state.metrics.waiting or 0) / max_q
            return (-s, self.rng.random())

        return sorted(candidates, key=key)

    def on_dispatch(self, decision, cand, req, now) -> None:
        pass

    def on_first_chunk(self, decision, cand, req, now) -> None:
        pass

    def on_complete(self, decision, cand, req, outcome, now) -> None:
        pass

    async def aclose(self) -> None:
        pass
