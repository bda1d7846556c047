"""What the ``predicted-latency-producer`` sends: the feature row of each candidate (the
predictor is asked with it at scheduling time) and the training entries built from that row
when the request completes (``actual_*``, ``timestamp`` from ``wall_clock``, the prediction of
the chosen endpoint, A.2.4). ``pod_type`` is sent only for the label values the wire contract
knows (``prefill``, ``decode``); other role values are omitted. A row of an endpoint without
scraped metrics is marked ``_no_metrics``: it is predicted (without the mark) and never trained on.
The TPOT entry carries the engine twin's view of the request at dispatch (the ``engine_*``
fields, docs/wire-api.md §1.3) when a ``decode-harm`` plugin gave one: sent when the request
ends, so its sums use the prompt's true length when the response reported it.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from epp_client.plugins.producer.request_state import RequestContext
from epp_client.types import Endpoint
from features.schema import ENGINE_ACTUAL_TTFT_FIELD, ENGINE_FEATURE_FIELDS, ENGINE_TTFT_FIELD

_ENGINE_SUMS = tuple(f.name for f in ENGINE_FEATURE_FIELDS)

_KNOWN_POD_TYPES = ("prefill", "decode")
#: the mark of a row whose endpoint has no scraped metrics
NO_METRICS = "_no_metrics"


def feature_rows(ctx: RequestContext, endpoints: list[Endpoint], *, use_encoder_cache_features: bool,
                 endpoint_role_label: str) -> list[dict]:
    """The request's feature row on each endpoint, in order (the wire's prediction fields)."""
    encoder_input = 0
    if use_encoder_cache_features:
        for e in endpoints:
            if e.encoder_match is not None:
                encoder_input = e.encoder_match.input_size  # request-level: the last one sets it
    rows = []
    for e in endpoints:
        m = e.metrics
        pm = e.prefix_match
        prefix = pm.score if pm is not None else 0.0
        if e.inflight is not None:
            tokens, running = e.inflight.tokens, e.inflight.requests
        else:
            tokens, running = 0, (m.running_requests_size if m is not None else 0)
        row: dict[str, Any] = {
            "kv_cache_percentage": m.kv_cache_usage if m is not None else 0.0,
            "input_token_length": ctx.input_tokens,
            "num_request_waiting": m.waiting_queue_size if m is not None else 0,
            "num_request_running": running,
            "num_tokens_generated": 0,  # A.2.5
            "prefix_cache_score": prefix,
            "prefill_tokens_in_flight": tokens,
            "decode_tokens_in_flight": 0,
            "encoder_input_size": encoder_input,
            "encoder_matched_size": min(e.encoder_match.matched_size, encoder_input)
            if use_encoder_cache_features and e.encoder_match is not None else 0,
        }
        pod = (e.labels.get(endpoint_role_label, "") or "") if endpoint_role_label else ""
        if pod in _KNOWN_POD_TYPES:
            row["pod_type"] = pod
        if m is None:
            row[NO_METRICS] = True
        rows.append(row)
    return rows


def rows_for_predictor(rows: list[dict]) -> list[dict]:
    """The rows as the predictor takes them (without the ``_no_metrics`` mark)."""
    if any(NO_METRICS in r for r in rows):
        return [{k: v for k, v in r.items() if k != NO_METRICS} for r in rows]
    return rows


class SampleEmitter:
    """Builds the training entries of completed requests and adds them to ``sink``
    (``sink.add(list[dict])``, :mod:`epp_client.training`); counts them in ``counters``."""

    def __init__(self, sink: Any, wall_clock: Callable[[], float], counters: dict[str, int]) -> None:
        self.sink, self.wall_clock, self.counters = sink, wall_clock, counters

    def _timestamp(self) -> str:
        return datetime.fromtimestamp(self.wall_clock(), UTC).isoformat().replace("+00:00", "Z")

    def _entry(self, ctx: RequestContext, endpoint: str, row: dict, ttft: float, tpot: float) -> dict:
        entry = {k: v for k, v in row.items() if k != NO_METRICS}
        entry["actual_ttft_ms"] = ttft
        entry["actual_tpot_ms"] = tpot
        entry["timestamp"] = self._timestamp()
        pred = ctx.predictions.get(endpoint)
        if pred is not None and math.isfinite(pred[0]) and math.isfinite(pred[1]):  # A.2.4
            entry["predicted_ttft_ms"] = max(0.0, pred[0])
            entry["predicted_tpot_ms"] = max(0.0, pred[1])
            entry["model_version"] = ctx.model_version
        return entry

    def ttft(self, ctx: RequestContext) -> None:
        """The TTFT sample of ``ctx`` (on its prefill target when disaggregated)."""
        name = ctx.prefill_target or ctx.target
        row = ctx.rows.get(name) if name is not None else None
        if name is None or row is None or NO_METRICS in row or self.sink is None or ctx.ttft_ms <= 0:
            self.counters["skipped_samples"] += 1
            return
        self.sink.add([self._entry(ctx, name, row, ctx.ttft_ms, 0.0)])
        self.counters["ttft_samples"] += 1
        if 0 < ctx.ttft_slo < ctx.ttft_ms:
            self.counters["ttft_slo_violations"] += 1

    def tpot(self, ctx: RequestContext, avg_tpot: float, prompt_tokens: int | None = None) -> None:
        """The TPOT sample of ``ctx`` (prefix and encoder features zeroed: decode does not use them),
        with the twin's view of the request when a decode-harm plugin gave one: its step sums for
        the prompt's true length ``prompt_tokens`` when the response reported it
        (``EngineView.for_prompt``), and the measured TTFT they go with."""
        target = ctx.target
        row = ctx.rows.get(target) if target is not None else None
        if target is None or row is None or NO_METRICS in row or self.sink is None:
            self.counters["skipped_samples"] += 1
            return
        row = dict(row, prefix_cache_score=0.0, encoder_input_size=0, encoder_matched_size=0)
        entry = self._entry(ctx, target, row, 0.0, avg_tpot)
        view = ctx.engine
        if view is not None and view.endpoint == target and ctx.ttft_ms >= 1:   # features.schema
            entry.update(zip(_ENGINE_SUMS, view.for_prompt(prompt_tokens)), engine_endpoint=view.endpoint,
                         engine_class=view.engine_class)
            entry[ENGINE_TTFT_FIELD.name] = min(view.ttft_ms, ENGINE_TTFT_FIELD.hi or view.ttft_ms)
            entry[ENGINE_ACTUAL_TTFT_FIELD.name] = ctx.ttft_ms
        self.sink.add([entry])
        self.counters["tpot_samples"] += 1
        if 0 < ctx.tpot_slo < avg_tpot:
            self.counters["tpot_slo_violations"] += 1
