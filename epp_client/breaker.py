"""Per-server circuit breaker of the prediction client (A.2.8)."""
from __future__ import annotations

import time
from collections.abc import Callable


class CircuitBreaker:
    """Per server: opens after ``failure_threshold`` consecutive failures for ``open_s``;
    then half-open (calls allowed; one more failure reopens it, a success closes it)."""

    def __init__(self, failure_threshold: int = 3, open_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self.clock = clock
        self.consecutive = 0
        self.open_until = 0.0
        self.opened = 0  # how many times it opened

    def allows(self) -> bool:
        return self.consecutive < self.failure_threshold or self.clock() >= self.open_until

    @property
    def is_open(self) -> bool:
        return not self.allows()

    def success(self) -> None:
        self.consecutive = 0

    def failure(self) -> None:
        self.consecutive += 1
        if self.consecutive >= self.failure_threshold:
            self.open_until = self.clock() + self.open_s
            self.opened += 1
