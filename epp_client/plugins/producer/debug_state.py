"""The ``predicted-latency-producer``'s debug state (B1.8): its running requests per endpoint."""
from __future__ import annotations

import math
from typing import Any

from epp_client.plugins.producer.request_state import RunningQueue


def dump_state(running: RunningQueue, tracked_requests: int, max_endpoints: int = 100) -> dict:
    """The endpoints with the most running requests first (at most ``max_endpoints``), each with
    its lowest TPOT SLO, and the number of requests tracked."""
    eps: list[dict[str, Any]] = []
    for name in running.endpoints():
        mt = running.min_tpot(name)
        eps.append({"endpoint": name, "runningRequests": running.size(name),
                    "minTpotSlo": mt if math.isfinite(mt) else 0})
    eps.sort(key=lambda d: (-d["runningRequests"], d["endpoint"]))
    return {"endpoints": eps[:max_endpoints], "totalEndpoints": len(eps), "maxEndpoints": max_endpoints,
            "truncated": len(eps) > max_endpoints, "trackedRequests": tracked_requests}
