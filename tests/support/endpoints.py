"""Endpoints, predictions and a request for the plugin tests."""
from __future__ import annotations

from epp_client import (
    Endpoint,
    EndpointMetrics,
    InferenceRequest,
    InFlightLoad,
    LatencyPrediction,
    PrefixMatch,
)

REQ = InferenceRequest()


def ep(name, kv=0.5, q=0, running=1, prefix=None, inflight=None, pred=None, labels=None, metrics=True):
    return Endpoint(name=name, labels=labels or {},
                    metrics=EndpointMetrics(kv_cache_usage=kv, waiting_queue_size=q, running_requests_size=running)
                    if metrics else None,
                    prefix_match=PrefixMatch(*prefix) if prefix else None,
                    inflight=InFlightLoad(*inflight) if inflight else None, prediction=pred)


def pred(ttft_h, tpot_h=0.0, ttft=100.0, tpot=10.0, valid=None, dispatched=1):
    v = (ttft_h > 0) if valid is None else valid
    return LatencyPrediction(ttft, tpot, ttft_h, tpot_h, v, tpot_h >= 0 if valid is None else valid, dispatched)


def names(eps):
    return [e.name for e in eps]
