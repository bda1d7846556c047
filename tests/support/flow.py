"""Flow-control helpers: a manual clock, a turn-priority policy on it, and serving a program's requests."""
from __future__ import annotations

from epp_client.flowcontrol import (
    ProgramAwareFairness,
)


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def tp(clock, **kw):
    return ProgramAwareFairness(strategy="turn-priority", clock=clock, **kw)


def serve(policy, pid, n=1, prompt=100, completion=10):
    for _ in range(n):
        policy.on_dispatch(pid)
        policy.on_complete(pid, prompt, completion)
