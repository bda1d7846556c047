"""EndpointPickerConfigs the gateway soak and the gateway tests run: llm-d's concurrency gate in
front of the queue scorer, as YAML text (docs/flow-control.md, "The gate")."""
from __future__ import annotations

from collections.abc import Iterable

_ROUTER = "- type: queue-scorer\n- type: max-score-picker\n"
_FAIRNESS = "fairnessPolicyRef: global-strict-fairness-policy"
#: the plain router without flow control: the queue scorer and the max-score picker
PLAIN_CONFIG = "plugins:\n" + _ROUTER


def concurrency_gate_config(max_concurrency: int, ttl: str, priority_bands: Iterable[int] = ()) -> str:
    """YAML text: ``concurrency-detector`` (``maxConcurrency`` requests per endpoint) gating the
    queue scorer and the max-score picker; flow control drops a queued request after ``ttl`` (a
    duration such as ``"30s"``); the default band and one band per ``priority_bands`` entry use
    ``global-strict-fairness-policy``."""
    bands = ", ".join(f"{{priority: {p}, {_FAIRNESS}}}" for p in priority_bands)
    return (f"plugins:\n- type: concurrency-detector\n  parameters: {{maxConcurrency: {max_concurrency}}}\n{_ROUTER}"
            f"flowControl:\n  defaultRequestTTL: {ttl}\n  defaultPriorityBand: {{{_FAIRNESS}}}\n"
            + (f"  priorityBands: [{bands}]\n" if bands else ""))
