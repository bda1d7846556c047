"""Test support for the engine twin's learning: training entries with the engine fields from a known
step model and speeds; a profile with the decode-harm filter and a predictor with fixed answers."""
from __future__ import annotations

import math

import numpy as np

from epp_client.engine.twin import StepModel
from features.schema import ENGINE_FEATURE_FIELDS

TRUE = StepModel(fixed_ms=2.0, per_token_ms=0.08, per_context_token_ms=1e-4, decode_ms=9.0, per_prefill_pair_ms=4e-6)
SPEEDS = {"pod-0": 1.0, "pod-1": 1.05, "pod-2": 0.5, "pod-3": 0.52}


def with_engine_fields(entries: list[dict], seed: int = 0) -> list[dict]:
    """The recorded entries, each TTFT entry with random step sums on one of four endpoints and
    the TTFT the true step model gives them at the endpoint's speed (2% noise)."""
    rng = np.random.default_rng(seed)
    c = np.array([TRUE.fixed_ms, TRUE.per_token_ms, TRUE.per_context_token_ms, TRUE.decode_ms,
                  TRUE.per_prefill_pair_ms])
    out = []
    for e in entries:
        if e["actual_ttft_ms"] <= 0:
            out.append(e)
            continue
        pod = f"pod-{rng.integers(4)}"
        steps = float(rng.integers(1, 40))
        tokens = steps * rng.uniform(50, 2048)
        f = np.array([steps, tokens, steps * rng.uniform(0, 4e5), steps * rng.uniform(0.5, 1.0),
                      rng.uniform(0.1, 1.0) * tokens ** 2 / 2])
        f[3] = math.floor(f[3])
        y = float(c @ f) / SPEEDS[pod] * rng.lognormal(0, 0.02)
        out.append({**e, "actual_ttft_ms": y, "engine_endpoint": pod, "engine_class": "llama|a100",
                    **{fl.name: float(v) for fl, v in zip(ENGINE_FEATURE_FIELDS, f)}})
    return out


#: the streaming producer, the decode-harm filter and a picker: the twin's path through a scheduler
HARM_CONFIG = """
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- type: decode-harm-filter
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: decode-harm-filter
  - pluginRef: max-score-picker
"""


class FixedPredictor:
    """Fixed predictions (TTFT 100 ms, TPOT 20 ms, version v1), and ``section`` as the learned
    engine step model (none: nothing learned yet)."""

    def __init__(self, section: dict | None = None) -> None:
        self.section = section

    def predict_bulk(self, rows):
        from epp_client.predictor import BulkPrediction

        return BulkPrediction([100.0] * len(rows), [20.0] * len(rows), "v1", "learned")

    async def apredict_bulk(self, rows):
        return self.predict_bulk(rows)

    def engine_section(self):
        return None if self.section is None else ("v1", self.section)
