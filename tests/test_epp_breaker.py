"""epp_client.breaker: the circuit breaker's closed, open and half-open states on an injected clock."""
from __future__ import annotations

from epp_client.predictor import CircuitBreaker


def test_circuit_breaker_states():
    now = [0.0]
    b = CircuitBreaker(failure_threshold=2, open_s=5, clock=lambda: now[0])
    b.failure()
    assert b.allows()
    b.failure()
    assert not b.allows() and b.opened == 1
    now[0] = 5.0
    assert b.allows()
    b.success()
    b.failure()
    assert b.allows()
