"""The request lifecycle: the one protocol through which a router drives a request.

The gateway (``gateway/``) and the simulator (``load/sim``) both drive every routing
policy through these calls, with real or simulated time::

    res = lc.schedule(request, endpoints, now)          # or: await lc.aschedule(...)
    if res.ok: lc.pre_request(request, res, now)        # dispatch to res.endpoint
    if res.held: ...                                    # schedule it again res.retry_after_s later,
                                                        # request.waited_ms = the time held so far
    lc.pre_request(request, res, now, endpoint=other)   # a retry elsewhere (gateway)
    lc.on_first_chunk(request.request_id, now, tokens)  # first token / body chunk
    lc.on_chunk(request.request_id, now, tokens)        # later chunks (optional)
    lc.on_complete(request.request_id, now, status=..., aborted=..., output_tokens=...,
                   prompt_tokens=...)                    # the response's usage, when reported

``inflight`` is the lifecycle's :class:`~epp_client.plugins.producer.inflight_load.InFlightTracker`, the one
count of the requests and uncached prompt tokens it has in flight per endpoint.
Implementations: :class:`~epp_client.framework.scheduler.Scheduler` (the EPP plugins) and the
heuristics of :mod:`epp_client.heuristics` (random, round-robin, least-requests, the
gateway's least-load).
"""
from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from epp_client.framework.protocols import InFlightLoadProducer
from epp_client.types import Admission, Endpoint, InferenceRequest


@dataclass
class ProfileResult:
    name: str
    picked: list
    scores: dict
    filtered: list = field(default_factory=list)


@dataclass
class SchedulingResult:
    request_id: str
    picked: list  # primary profile's picked endpoints (empty when not admitted / dropped)
    scores: dict  # primary profile's weighted scores of the filtered candidates
    admission: Admission
    profiles: dict = field(default_factory=dict)  # name -> ProfileResult
    candidates: list = field(default_factory=list)  # per-request clones, with predictions
    status: int = 200  # 200, or the HTTP status a gateway should answer
    reason: str = ""  # e.g. the admission reason or "rejected-saturated"
    decision: str = ""  # P/D decision with a disagg profile handler, e.g. "prefill-decode"
    retry_after_s: float = 0.0  # > 0: held (status 429, reason "held"): schedule it again this much later

    @property
    def held(self) -> bool:
        return self.retry_after_s > 0

    @property
    def ok(self) -> bool:
        return self.status == 200 and bool(self.picked)

    @property
    def endpoint(self) -> Endpoint | None:
        return self.picked[0] if self.picked else None

    @property
    def picks(self) -> dict[str, Endpoint]:
        """Profile name -> that profile's first picked endpoint (for PreRequest)."""
        return {name: pr.picked[0] for name, pr in self.profiles.items() if pr.picked}

    @property
    def predictions(self) -> dict[str, tuple[float, float]]:
        """Endpoint name -> (predicted TTFT ms, predicted TPOT ms), for the candidates that have one."""
        return {e.name: (e.prediction.ttft_ms, e.prediction.tpot_ms) for e in self.candidates
                if e.prediction is not None}

    @property
    def model_version(self) -> str:
        return next((e.prediction.model_version for e in self.candidates if e.prediction is not None), "")


class RequestLifecycle(Protocol):
    @property
    def inflight(self) -> InFlightLoadProducer | None:
        """The policy's in-flight accounting, if it keeps one (read-only here: an attribute or
        a property, of this type or a narrower one)."""

    def schedule(self, request: InferenceRequest, endpoints: Sequence[Endpoint],
                 now: float | None = None) -> SchedulingResult: ...

    async def aschedule(self, request: InferenceRequest, endpoints: Sequence[Endpoint],
                        now: float | None = None) -> SchedulingResult: ...

    def pre_request(self, request: InferenceRequest, result: SchedulingResult, now: float | None = None, *,
                    endpoint: Endpoint | None = None) -> None: ...

    def on_first_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None: ...

    def on_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None: ...

    def on_complete(self, request_id: str, now: float | None = None, *, status: int = 200, aborted: bool = False,
                    output_tokens: int | None = None, prompt_tokens: int | None = None) -> None: ...


def ensure_request_id(request: InferenceRequest) -> str:
    """``x-request-id``, generated when missing (as the director does)."""
    if not request.request_id:
        request.request_id = request.headers.get("x-request-id") or str(uuid.uuid4())
        request.headers["x-request-id"] = request.request_id
    return request.request_id


def candidates_for(endpoints: Sequence[Endpoint], inflight: InFlightLoadProducer | None) -> list[Endpoint]:
    """Per-request clones (the director snapshots its candidates): no prediction yet, and
    the tracker's in-flight load unless the caller supplied one."""
    clones = [e.clone() for e in endpoints]
    for c in clones:
        c.prediction = None
        if inflight is not None and c.inflight is None:
            c.inflight = inflight.snapshot(c.name)
    return clones
