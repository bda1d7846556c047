"""True latencies in place of predictions (``simulate --true-latencies``): how much better
predictions could give a profile.

:class:`TrueLatencyPredictor` answers the predicted-latency producer with what the
simulator knows: for each candidate, the oracle's forward probe
(:class:`~load.sim.routers.OracleScheduler`: the server's true state cloned, the request
added, simulated until its first token and a few decode steps, no later arrivals). The
profile then decides exactly as configured, with perfect myopic knowledge instead of the
models' answers: if a profile does not do better this way, better models will not make it
better either. The producer predicts for every endpoint of the pool in the driver's order,
so row ``i`` is server ``i``; anything else is an error, not a silent mismatch.
"""
from __future__ import annotations

import random
from typing import TYPE_CHECKING

from epp_client.predictor import BulkPrediction

from .routers import OracleScheduler

if TYPE_CHECKING:
    from .driver import LifecycleRouter

#: ``model_version`` / ``model_source`` of these answers (the producer records them in its samples)
VERSION = "true-latencies"


class TrueLatencyPredictor:
    """A predictor (``predict_bulk``) whose answers are the simulator's true per-endpoint latencies."""

    def __init__(self, decode_probe: int = 4) -> None:
        self.router: LifecycleRouter | None = None
        self.oracle = OracleScheduler(random.Random(0), decode_probe=decode_probe)
        self.calls = 0

    def bind(self, router: LifecycleRouter) -> None:
        """The router whose simulation and current request the answers come from."""
        self.router = router

    def predict_bulk(self, rows: list[dict]) -> BulkPrediction:
        router = self.router
        if router is None or router.sim is None or router.current is None:
            raise RuntimeError("true latencies: asked outside a scheduling decision of a bound router")
        sim, req = router.sim, router.current
        if len(rows) != len(sim.servers):
            raise RuntimeError(f"true latencies: {len(rows)} rows for a pool of {len(sim.servers)} servers; "
                               "the producer must predict for every endpoint in the driver's order")
        self.oracle.bind(sim, router)
        ttft, tpot = [], []
        for i in range(len(rows)):
            t, p = self.oracle.probe(i, req, sim.now)
            ttft.append(t)
            tpot.append(p)
        self.calls += 1
        return BulkPrediction(ttft, tpot, VERSION, VERSION)

    async def apredict_bulk(self, rows: list[dict]) -> BulkPrediction:
        return self.predict_bulk(rows)

    def close(self) -> None:
        pass
