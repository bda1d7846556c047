"""``prefix-cache-scorer`` (B4.3): more of the prompt cached, higher score."""
from __future__ import annotations

from epp_client.framework.params import Plugin, param, within
from epp_client.framework.protocols import Scorer
from epp_client.framework.registry import plugin
from epp_client.types import ConfigError, Endpoint, InferenceRequest


@plugin("prefix-cache-scorer", Scorer)
class PrefixCacheScorer(Plugin):
    """``prefix-cache-scorer``: w·min(1, matched tokens / scale)² + (1 - w)·match/total."""

    match_length_weight: float = param("matchLengthWeight", default=0.0, check=within(0.0, 1.0),
                                       doc="weight w of the matched length against the matched fraction")
    match_length_scale_tokens: float = param("matchLengthScaleTokens", default=8192.0,
                                             doc="matched tokens that score a full length (> 0 when w > 0)")

    def setup(self) -> None:
        if self.match_length_weight > 0 and self.match_length_scale_tokens <= 0:
            raise ConfigError(f"{self.TYPE}.matchLengthScaleTokens",
                              f"must be > 0 when matchLengthWeight > 0, got {self.match_length_scale_tokens!r}")

    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        w = self.match_length_weight
        out = {}
        for e in endpoints:
            pm = e.prefix_match
            if pm is None or pm.total_blocks <= 0:
                out[e.name] = 0.0
                continue
            ratio = pm.match_blocks / pm.total_blocks
            if w > 0:
                length = min(1.0, pm.match_blocks * pm.block_size_tokens / self.match_length_scale_tokens)
                out[e.name] = w * length * length + (1 - w) * ratio
            else:
                out[e.name] = ratio
        return out
