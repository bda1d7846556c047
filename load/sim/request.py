"""A simulated request: its workload description plus its life on a server."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epp_client import InferenceRequest
    from epp_client.framework.lifecycle import SchedulingResult


class SimRequest:
    """Static fields come from the workload; the rest is filled in by the simulation."""

    __slots__ = (
        # workload
        "rid", "arrival", "input_len", "output_len", "segments", "full_pages", "ttft_slo_ms", "tpot_slo_ms",
        "priority", "lora", "session",
        # what the router is told (the gateway's estimate) and the client's deadline (realism)
        "est_input_len", "seg_bytes", "deadline", "abandoned",
        # server-side state
        "server", "target", "computed", "generated", "npages", "seg_pages", "held", "seg_ptr", "seg_base", "seg_done",
        "hit_tokens", "preemptions", "first_token_t", "finish_t", "admitted_t", "dispatch_t", "shed",
        # router-side bookkeeping (opaque to the engine)
        "ctx",
    )

    def __init__(self, rid: int, arrival: float, input_len: int, output_len: int, segments: tuple,
                 ttft_slo_ms: float = 0.0, tpot_slo_ms: float = 0.0, priority: int = 0, lora: str = "",
                 session: int = -1, block_size: int = 16) -> None:
        if input_len < 1 or output_len < 1:
            raise ValueError(f"request {rid}: input_len and output_len must be >= 1")
        if sum(n for _, n in segments) != input_len:
            raise ValueError(f"request {rid}: segments must add up to input_len")
        self.rid = rid
        self.arrival = arrival
        self.input_len = input_len
        self.output_len = output_len
        self.segments = segments
        self.full_pages = tuple(n // block_size for _, n in segments)
        self.ttft_slo_ms = ttft_slo_ms
        self.tpot_slo_ms = tpot_slo_ms
        self.priority = priority
        self.lora = lora
        self.session = session
        self.est_input_len = input_len
        self.seg_bytes: tuple[int, ...] | None = None   # the segments' UTF-8 bytes (realism; None: exact)
        self.deadline = math.inf
        self.abandoned = False
        self.server = -1
        self.dispatch_t = -1.0
        self.shed = False
        # the LifecycleRouter's (request, scheduling result, prompt block hashes or None) while in flight
        self.ctx: tuple[InferenceRequest, SchedulingResult, list | None] | None = None
        self.hit_tokens = -1
        self.preemptions = 0
        self.first_token_t = -1.0
        self.finish_t = -1.0
        self.admitted_t = -1.0
        self.generated = 0
        self.reset_progress()

    def reset_progress(self) -> None:
        """Start (or restart after a recompute preemption) the prefill from scratch."""
        self.target = self.input_len + self.generated  # tokens to prefill
        self.computed = 0       # tokens in the KV cache
        self.npages = 0         # pages the request's tokens occupy
        self.seg_pages = 0      # of which shared through segments
        self.held = []          # pinned segment keys
        self.seg_ptr = 0        # next segment to register pages of
        self.seg_base = 0       # its first token
        self.seg_done = 0       # its pages already processed

    def clone(self) -> SimRequest:
        c = SimRequest.__new__(SimRequest)
        for k in SimRequest.__slots__:
            setattr(c, k, getattr(self, k))
        c.held = list(self.held)
        return c

    # -- results ----------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.finish_t >= 0

    @property
    def ttft_ms(self) -> float:
        return (self.first_token_t - self.arrival) * 1000.0

    @property
    def e2e_ms(self) -> float:
        return (self.finish_t - self.arrival) * 1000.0

    @property
    def tpot_ms(self) -> float:
        """Mean time per output token after the first (0 for single-token outputs)."""
        if self.output_len <= 1:
            return 0.0
        return (self.finish_t - self.first_token_t) * 1000.0 / (self.output_len - 1)

    def meets_slo(self) -> bool:
        if not self.done:
            return False
        if self.ttft_slo_ms > 0 and self.ttft_ms > self.ttft_slo_ms:
            return False
        if self.tpot_slo_ms > 0 and self.tpot_ms > self.tpot_slo_ms:
            return False
        return True
