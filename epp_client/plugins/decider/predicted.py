"""``predicted-pd-decider`` (this project's; none exists upstream): disaggregate when the
predictions say it pays.

With ``d`` the decode pick and ``U`` the prompt tokens not cached on ``d`` (the KV the
decode side must receive), and ``transfer_ms(U) = transfer_latency_ms +
U x kv_bytes_per_token / (transfer_bandwidth_gbps x 1e9) x 1000``:

1. **TTFT rule**: yes when the predicted TTFT through the prefill endpoint ``p`` is below
   ``ttft(d)`` (prefilling locally on ``d``). ``p`` is the endpoint the request would
   really use: with ``judgePrefillPick`` (default) ``disagg-profile-handler`` runs the
   prefill profile before asking and passes its pick as the only candidate (the profile
   picks by its own scorers, often not the best predicted endpoint; ``docs/pd.md``).
   Without it, or when called with several candidates, ``p`` is the best (lowest
   predicted TTFT) prefill-capable candidate other than ``d``. TTFT is the client's
   (first token on the wire) and a disaggregated request's TTFT sample is its prefill
   endpoint's row, so for an endpoint that cannot decode (role ``prefill`` or
   ``encode-prefill``: every TTFT it was trained on is prefill + KV transfer + first
   decode step) ``ttft(p)`` already contains the transfer and is taken as is; for an
   endpoint that also decodes (``prefill-decode``, ``both``), whose samples are mostly
   local prefills, the path through it costs ``ttft(p) + transfer_ms(U)``.
2. **TPOT rule**: yes when ``d`` has running requests (the larger of its reported running
   requests and this router's in-flight count there) and a local prefill would push them
   past their TPOT budget: ``tpot(d) + (stall(d) + ttft(d)) / tpot_window_tokens`` exceeds
   the budget, i.e. the prefill stall of about ``ttft(d)`` is spread over the
   ``tpot_window_tokens`` tokens a TPOT is averaged over, on top of ``stall(d)``: the
   stalls of the local prefills this decider already kept on ``d``, each decayed by
   ``exp(-age / (tpot_window_tokens x tpot(d)))`` (the time the running requests take
   for that many tokens). Without ``stall(d)`` every request judged its own stall as if
   it were the only one, and a decode endpoint accepted local prefills until its
   requests' TPOT (which the predictions learn only later) was far past the budget. The
   budget is ``tpot(d) + tpot_headroom(d)`` when the producer computed a headroom
   (streaming mode: against the strictest running request's SLO), else the request's own
   TPOT SLO; without either the rule is off. The remote path must then still meet the
   request's TTFT SLO (when it has one): if it would not, the prefill stays local, but
   only while ``tpot(d) + stall(d) / tpot_window_tokens`` is within the budget (the
   prefills already kept there leave room). Without that limit, at full load, every
   request the prefill pool would make late was kept on the decode endpoints, which
   collapsed.

Predictions are the producer's (``Endpoint.prediction``, written once for all candidates
before the profiles run). No prediction for ``d``, no prefill-capable candidate with a
prediction, or a prompt shorter than ``min_prompt_tokens``: no.

Defaults: ``kvBytesPerToken`` 131072 = 2 (K and V) x 32 layers x 8 KV heads x 128 head
dim x 2 bytes (bf16), Llama-3.1-8B's config.json; ``transferBandwidthGBps`` 25 = one
200 Gb/s RDMA NIC (ConnectX-6/7 class) as NIXL uses for KV transfer between nodes.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

from epp_client.framework.params import ge, gt, param
from epp_client.framework.protocols import PDDecider
from epp_client.framework.registry import plugin
from epp_client.plugins.decider.base import DeciderBase
from epp_client.plugins.filter.decode import DecodeFilter
from epp_client.plugins.filter.prefill import PrefillFilter
from epp_client.types import Endpoint, InferenceRequest

_PREFILL = PrefillFilter()
_DECODE = DecodeFilter()


def kv_transfer_ms(tokens: int, kv_bytes_per_token: float, bandwidth_gbps: float, latency_ms: float = 0.0) -> float:
    """Time to move the KV cache of ``tokens`` tokens over a link of ``bandwidth_gbps`` GB/s."""
    return latency_ms + max(0, tokens) * kv_bytes_per_token / (bandwidth_gbps * 1e9) * 1000.0


@plugin("predicted-pd-decider", PDDecider)
class PredictedPDDecider(DeciderBase):
    """``predicted-pd-decider``: disaggregate when the predictions say it pays."""

    kv_bytes_per_token: float = param("kvBytesPerToken", default=131072.0, check=gt(0.0),
                                      doc="KV-cache bytes per token")
    transfer_bandwidth_gbps: float = param("transferBandwidthGBps", default=25.0, check=gt(0.0),
                                           doc="KV transfer bandwidth, GB/s")
    transfer_latency_ms: float = param("transferLatencyMs", default=0.0, check=ge(0.0),
                                       doc="fixed cost of a KV transfer, ms")
    tpot_window_tokens: int = param("tpotWindowTokens", default=64, check=gt(0),
                                    doc="tokens a local prefill stall is spread over (TPOT rule); "
                                        "kept stalls decay over that many tokens")
    min_prompt_tokens: int = param("minPromptTokens", default=0, check=ge(0),
                                   doc="shortest prompt that may disaggregate")
    judges_prefill_pick: bool = param("judgePrefillPick", default=True,
                                      doc="judge the prefill profile's pick (the handler runs that profile "
                                          "first); false: the best predicted prefill candidate")

    clock: Callable[[], float] = time.monotonic

    def setup(self) -> None:
        super().setup()
        self.reasons: dict[str, int] = {"ttft": 0, "tpot": 0}
        self._stalls: dict[str, tuple[float, float]] = {}  # decode endpoint -> (stall ms, at s)

    def stall_ms(self, endpoint: str, tpot_ms: float, now: float) -> float:
        """The recent local prefills' stall on ``endpoint`` still felt by its running requests:
        each decays over the time they take for ``tpot_window_tokens`` tokens."""
        ms, at = self._stalls.get(endpoint, (0.0, now))
        horizon_s = self.tpot_window_tokens * max(tpot_ms, 1e-3) / 1000.0
        return ms * math.exp(-max(0.0, now - at) / horizon_s)

    def _keep_local(self, endpoint: str, ttft_ms: float, tpot_ms: float, now: float) -> bool:
        self._stalls[endpoint] = (self.stall_ms(endpoint, tpot_ms, now) + max(0.0, ttft_ms), now)
        return False

    def transfer_ms(self, tokens: int) -> float:
        return kv_transfer_ms(tokens, self.kv_bytes_per_token, self.transfer_bandwidth_gbps, self.transfer_latency_ms)

    def remote_ttft_ms(self, candidate: Endpoint, uncached_tokens: int) -> float:
        """Predicted TTFT of prefilling on ``candidate`` and decoding elsewhere. A prefill-only
        endpoint's TTFT is learned from disaggregated requests' TTFTs, which include the KV
        transfer and the first decode step: adding the transfer again would count it twice.
        ``candidate`` must carry a prediction."""
        if candidate.prediction is None:
            raise ValueError(f"endpoint {candidate.name!r} has no latency prediction")
        ttft = candidate.prediction.ttft_ms
        return ttft if not _DECODE.accepts(candidate) else ttft + self.transfer_ms(uncached_tokens)

    def _decide(self, request: InferenceRequest, endpoint: Endpoint | None, candidates: list[Endpoint]) -> bool:
        if endpoint is None or endpoint.prediction is None:
            return False
        prompt = max(0, int(request.input_tokens))
        if prompt < self.min_prompt_tokens or prompt == 0:
            return False
        pm = endpoint.prefix_match
        uncached = prompt - (pm.match_blocks * pm.block_size_tokens if pm is not None else 0)
        remote = [self.remote_ttft_ms(c, uncached) for c in candidates
                  if c.name != endpoint.name and c.prediction is not None and _PREFILL.accepts(c)]
        if not remote:
            return False
        remote_ttft = min(remote)
        pred = endpoint.prediction
        local_ttft = pred.ttft_ms
        if remote_ttft < local_ttft:
            self.reasons["ttft"] += 1
            return True
        now = self.clock()
        # who a local prefill would stall: what the server reports running, or what this
        # router has in flight there when that is more recent
        running = max(endpoint.metrics.running_requests_size if endpoint.metrics is not None else 0,
                      endpoint.inflight.requests if endpoint.inflight is not None else 0)
        if running <= 0:
            return self._keep_local(endpoint.name, local_ttft, pred.tpot_ms, now)
        budget = pred.tpot_ms + pred.tpot_headroom_ms if pred.tpot_headroom_ms else request.tpot_slo_ms
        kept = self.stall_ms(endpoint.name, pred.tpot_ms, now)
        if budget <= 0 or pred.tpot_ms + (kept + local_ttft) / self.tpot_window_tokens <= budget:
            return self._keep_local(endpoint.name, local_ttft, pred.tpot_ms, now)
        ttft_slo = request.ttft_slo_ms
        if ttft_slo > 0 and remote_ttft >= ttft_slo and pred.tpot_ms + kept / self.tpot_window_tokens <= budget:
            return self._keep_local(endpoint.name, local_ttft, pred.tpot_ms, now)
        self.reasons["tpot"] += 1
        return True
