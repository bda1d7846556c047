"""The engine's prompt tokens per token the router was told: a belief learned from responses.

The router schedules with the gateway's estimate of a prompt's length (UTF-8 bytes / 4,
``gateway.prompt``); the engine runs its tokenizer's count, which the response reports
(``usage.prompt_tokens``) at the end. For the latency models the estimate is the feature they
were trained with, and needs no correction; the engine twin is physics in the engine's tokens,
and a workload whose text runs at other than 4 bytes per token (code, markup, non-Latin
scripts) would shift every step it predicts by that ratio. :class:`PromptScale` learns it: the
median ratio over the newest ``window`` completed requests that reported their count, once
``min_samples`` did (1 until then, and with no response reporting usage), bounded to
``[lo, hi]`` so one odd workload cannot run it away.
"""
from __future__ import annotations

import math
from collections import deque


class PromptScale:
    def __init__(self, window: int = 256, min_samples: int = 32, lo: float = 0.25, hi: float = 4.0) -> None:
        if window < 1 or not 1 <= min_samples <= window or not 0 < lo <= 1.0 <= hi:
            raise ValueError("PromptScale: need window >= 1, 1 <= min_samples <= window, 0 < lo <= 1 <= hi")
        self._logs: deque[float] = deque(maxlen=window)
        self.min_samples, self.lo, self.hi = min_samples, lo, hi
        self.factor = 1.0      # engine tokens per estimated token, as learned so far
        self.samples = 0       # completions observed

    def observe(self, estimated: int, engine: int | None) -> None:
        """A completed request told ``estimated`` tokens whose response reported ``engine``
        prompt tokens (None or <= 0: not reported, nothing learned)."""
        if not engine or engine <= 0 or estimated <= 0:
            return
        self._logs.append(math.log(engine / estimated))
        self.samples += 1
        if len(self._logs) >= self.min_samples:
            logs = sorted(self._logs)
            n = len(logs)
            mid = logs[n // 2] if n % 2 else 0.5 * (logs[n // 2 - 1] + logs[n // 2])
            self.factor = min(self.hi, max(self.lo, math.exp(mid)))

    def tokens(self, estimated: int) -> int:
        """``estimated`` tokens in the engine's count (at least 1 of a non-empty prompt)."""
        return engine_tokens(estimated, self.factor)


def engine_tokens(estimated: int, factor: float) -> int:
    """``estimated`` tokens at ``factor`` engine tokens per estimated token (at least 1 of a
    non-empty prompt; unchanged at factor 1)."""
    if estimated <= 0 or factor == 1.0:
        return estimated
    return max(1, round(estimated * factor))
