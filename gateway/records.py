"""The gateway's record of each finished request (``/gateway/requests``, the harness)."""
from __future__ import annotations

import collections
from dataclasses import asdict, dataclass


@dataclass
class RequestRecord:
    """One finished request."""

    request_id: str            # the gateway's own id (x-gateway-request-id)
    client_request_id: str     # the client's x-request-id, "" when it sent none
    endpoint: str
    status: int
    ok: bool
    streaming: bool
    input_tokens: int
    prefix_match_blocks: int
    prefix_total_blocks: int
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    tokens: int
    predicted_ttft_ms: float | None
    predicted_tpot_ms: float | None
    model_version: str
    fallback: bool
    decision: str              # the profile handler's: predicted / heuristic / warm-up (opt-in), P/D type
    attempts: int
    ttft_slo_ms: float
    tpot_slo_ms: float
    finished_at: float


@dataclass
class Measured:
    ttft_ms: float | None      # from dispatch to the first token (streaming) or the whole reply
    tpot_ms: float | None
    e2e_ms: float
    tokens: int
    chunks: int                # content events (streaming) or 1
    prompt_tokens: int | None = None   # usage.prompt_tokens, when the response reports it


def measure(obs, bobs, t0: float, t_first: float | None, t_end: float) -> Measured:
    """One request's latencies and tokens from its observer (``sse.StreamObserver`` when
    streaming, else ``sse.BodyObserver``) and its times (monotonic seconds)."""
    e2e = (t_end - t0) * 1000.0
    if obs is not None:
        tokens, chunks, prompt = obs.tokens, obs.content_events, obs.prompt_tokens
        ttft = (t_first - t0) * 1000.0 if t_first is not None else None
    else:
        tokens, chunks, prompt = bobs.tokens or 0, 1, bobs.usage("prompt_tokens")
        ttft = e2e  # E2E mode: the whole reply is the "first token"
    tpot = (e2e - ttft) / (tokens - 1) if ttft is not None and obs is not None and tokens > 1 else None
    return Measured(ttft, tpot, e2e, tokens, chunks, prompt)


class Records:
    """The last ``capacity`` records, numbered from 1 in finishing order."""

    def __init__(self, capacity: int) -> None:
        self.items: collections.deque[RequestRecord] = collections.deque(maxlen=capacity)
        self.seq = 0

    def append(self, rec: RequestRecord) -> None:
        self.seq += 1
        self.items.append(rec)

    def since(self, since: int, limit: int) -> dict:
        """Records numbered above ``since`` (at most ``limit``); ``next`` continues after them."""
        recs = list(self.items)
        first_seq = self.seq - len(recs)
        start = max(0, since - first_seq)
        page = recs[start:start + limit]
        return {"next": first_seq + start + len(page), "records": [asdict(r) for r in page]}
