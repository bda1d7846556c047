"""``prefix-based-pd-decider`` (B4.7): run the prefill stage when enough of the prompt is not
cached on the decode pick."""
from __future__ import annotations

from epp_client.framework.params import ge, param
from epp_client.framework.protocols import PDDecider
from epp_client.framework.registry import plugin
from epp_client.plugins.decider.base import DeciderBase
from epp_client.types import Endpoint, InferenceRequest


@plugin("prefix-based-pd-decider", PDDecider)
class PrefixBasedPDDecider(DeciderBase):
    """``prefix-based-pd-decider``: yes iff the prompt is at least ``prompt_tokens`` long
    (0 = no gate) and its part not cached on the decode endpoint is at least
    ``non_cached_tokens``; ``non_cached_tokens = 0`` (the default) never disaggregates,
    and a decode endpoint without prefix match information is never disaggregated."""

    non_cached_tokens: int = param("nonCachedTokens", default=0, check=ge(0),
                                   doc="uncached prompt tokens on the decode endpoint that disaggregate (0: never)")
    prompt_tokens: int = param("promptTokens", default=0, check=ge(0),
                               doc="shortest prompt that may disaggregate (0: no gate)")

    def _decide(self, request: InferenceRequest, endpoint: Endpoint | None, candidates: list[Endpoint]) -> bool:
        if self.non_cached_tokens == 0 or endpoint is None:
            return False
        prompt = max(0, int(request.input_tokens))
        if self.prompt_tokens > 0 and prompt < self.prompt_tokens:
            return False
        if prompt < self.non_cached_tokens:
            return False
        pm = endpoint.prefix_match
        if pm is None:
            return False
        uncached = prompt - pm.match_blocks * pm.block_size_tokens
        return uncached >= self.non_cached_tokens
