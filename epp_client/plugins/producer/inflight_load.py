"""In-flight load accounting (``inflight-load-producer``, B4.4), as an object the router updates.

Per endpoint (per data-parallel rank), the requests and uncached prompt tokens this router
has dispatched and not yet released:

- ``pre_request(request, picks)``: for each profile's first endpoint, +1 request and
  + uncached prompt tokens (``(total-match)×block + max(0, input - total×block)``, or the
  input tokens without prefix info), plus the estimated output tokens when enabled.
  **Difference from upstream**: when the request is disaggregated (a ``prefill`` pick
  that is another endpoint), the other picks count no prompt tokens: their prompt is
  prefilled on the prefill endpoint and arrives as KV, so it is not prefill work queued
  there. Counting it (upstream) made a decode endpoint's ``prefill_tokens_in_flight``
  the prompts of every request being prefilled *for* it, and its predicted TTFT of a
  local prefill that of a server with that much prefill queued (``docs/pd.md``).
- ``on_first_chunk(request_id)``: releases the token portion of every entry (without
  estimated output tokens) and the ``prefill`` profile's entry completely.
- ``on_complete(request_id)``: releases whatever remains. Every decrement floors at 0.

``load(name)`` returns the live :class:`InFlightLoad` of an endpoint (mutated in place);
:class:`~epp_client.framework.scheduler.Scheduler` copies it onto each candidate at scheduling time.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from epp_client.framework.params import Plugin, ge, gt, param
from epp_client.framework.protocols import InFlightLoadProducer, RequestHooksBase
from epp_client.framework.registry import plugin
from epp_client.types import PREFILL_PROFILE, Endpoint, InferenceRequest, InFlightLoad, uncached_prompt_tokens


@dataclass
class _Entry:
    endpoint: str
    profile: str
    tokens: int
    requests: int = 1


@plugin("inflight-load-producer", InFlightLoadProducer)
class InFlightTracker(RequestHooksBase, Plugin):
    """What this router dispatched and has not yet released, per endpoint."""

    add_estimated_output_tokens: bool = param("addEstimatedOutputTokens", default=False,
                                              doc="also count the estimated output tokens")
    output_ratio: float = param("outputRatio", default=1.5, check=ge(0.0),
                                doc="estimated output tokens per input token")
    max_estimated_output_tokens: int = param("maxEstimatedOutputTokens", default=2**31 - 1, check=gt(0),
                                             doc="cap of the estimated output tokens")
    max_tracked_requests: int = 1_000_000

    def setup(self) -> None:
        self._loads: dict[str, InFlightLoad] = {}
        self._requests: OrderedDict[str, list[_Entry]] = OrderedDict()

    def load(self, name: str) -> InFlightLoad:
        """Live counters of an endpoint (created at zero on first use)."""
        ld = self._loads.get(name)
        if ld is None:
            ld = self._loads[name] = InFlightLoad()
        return ld

    def loads(self) -> dict[str, InFlightLoad]:
        """All live counters by endpoint name (a copy of the mapping)."""
        return dict(self._loads)

    def snapshot(self, name: str) -> InFlightLoad:
        ld = self._loads.get(name)
        return InFlightLoad(ld.tokens, ld.requests) if ld is not None else InFlightLoad()

    def pre_request(self, request: InferenceRequest, picks: Mapping[str, Endpoint], now: float | None = None) -> None:
        """``picks``: profile name -> that profile's first picked endpoint."""
        rid = request.request_id
        if rid in self._requests:
            self.on_complete(rid)  # a re-dispatch replaces the old accounting
        entries = []
        prefill = picks.get(PREFILL_PROFILE)
        for profile, e in picks.items():
            remote = prefill is not None and profile != PREFILL_PROFILE and e.name != prefill.name
            tokens = 0 if remote else uncached_prompt_tokens(e, request.input_tokens)
            if self.add_estimated_output_tokens:
                est = math.floor(request.input_tokens * self.output_ratio + 0.5)
                if request.max_tokens is not None and request.max_tokens >= 0:
                    est = min(est, request.max_tokens)
                tokens += min(est, self.max_estimated_output_tokens)
            ld = self.load(e.name)
            ld.requests += 1
            ld.tokens += tokens
            entries.append(_Entry(e.name, profile, tokens))
        self._requests[rid] = entries
        while len(self._requests) > self.max_tracked_requests:  # bounded: oldest forgotten
            _, old = self._requests.popitem(last=False)
            self._release(old, tokens_only=False)

    def on_first_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        entries = self._requests.get(request_id)
        if not entries:
            return
        for en in entries:
            if en.profile == PREFILL_PROFILE:
                self._release([en], tokens_only=False)
            elif not self.add_estimated_output_tokens:
                self._release([en], tokens_only=True)

    def on_complete(self, request_id: str, now: float | None = None, *, status: int = 200, aborted: bool = False,
                    output_tokens: int | None = None, prompt_tokens: int | None = None) -> None:
        entries = self._requests.pop(request_id, None)
        if entries:
            self._release(entries, tokens_only=False)

    def _release(self, entries: list[_Entry], tokens_only: bool) -> None:
        for en in entries:
            ld = self.load(en.endpoint)
            ld.tokens = max(0, ld.tokens - en.tokens)
            en.tokens = 0
            if not tokens_only:
                ld.requests = max(0, ld.requests - en.requests)
                en.requests = 0

    def tracked_requests(self) -> int:
        return len(self._requests)
