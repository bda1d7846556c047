"""Endpoint health: a circuit breaker over dispatch failures, as Envoy's outlier detection.

``threshold`` consecutive failures of an endpoint's own making (connect errors, 5xx,
first-byte and idle timeouts, a stream cut mid-way; never a 4xx, nor a request the gateway
refused itself) *eject* it for ``base_s`` x 2^(ejections so far), at most ``max_s``. When
that time is up the endpoint is *half-open*: a candidate again, and its next request is the
trial: a success closes the breaker (and forgets the ejections), a failure ejects it again
for twice as long. A good scrape after failed ones (the engine came back, e.g. restarted)
closes the breaker as well.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Breaker:
    threshold: int = 3
    base_s: float = 5.0
    max_s: float = 60.0
    failures: int = 0            # consecutive, since the last success
    ejections: int = 0           # consecutive ejections (the backoff's exponent)
    ejected_until: float = 0.0   # monotonic; 0: not ejected since the last success

    def ejected(self, now: float) -> bool:
        return now < self.ejected_until

    def half_open(self, now: float) -> bool:
        return self.ejected_until > 0.0 and now >= self.ejected_until

    def failure(self, now: float) -> bool:
        """Count one failure; True when it ejects the endpoint."""
        self.failures += 1
        if self.failures < self.threshold and not self.half_open(now):
            return False
        self.ejections += 1
        self.ejected_until = now + min(self.max_s, self.base_s * 2.0 ** (self.ejections - 1))
        self.failures = 0
        return True

    def success(self) -> None:
        self.failures = 0
        self.ejections = 0
        self.ejected_until = 0.0

    def remaining_s(self, now: float) -> float:
        return max(0.0, self.ejected_until - now)
