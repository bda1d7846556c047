"""``simulate --trace FILE``: a user's own trace as a scenario (``docs/trace-replay.md``).

The format is detected from the file (Mooncake JSONL or Azure LLM inference CSV, plain or
.gz) and read by the same loaders as the built-in scenarios (``workloads.load_mooncake`` /
``workloads.load_azure`` with a path). The scenario's name is the file's stem (``.gz`` and
the format's suffix removed); its pool is ``servers`` x one server preset
(``stepmodel.PRESETS``), its SLO the standard one. ``native_load`` is the share of the
pool's capacity at which the trace's own timestamps replay it (``--load native``).
"""
from __future__ import annotations

from pathlib import Path

from . import workloads as W
from .scenarios import STANDARD_SLO, Scenario
from .stepmodel import get_preset
from .workloads import AZURE_COLUMNS, Arrival, TraceError, open_trace

DEFAULT_PRESET = "llama3-8b-a100"
DEFAULT_SERVERS = 8


def trace_format(path: Path) -> str:
    """``"mooncake"`` (JSONL: the first non-blank line is a JSON object) or ``"azure"`` (CSV
    whose header names TIMESTAMP); anything else is a ``TraceError``."""
    with open_trace(path) as f:
        try:
            first = next(((n, line) for n, line in enumerate(f, 1) if line.strip()), None)
        except (UnicodeDecodeError, EOFError, OSError) as e:
            raise TraceError(f"{path}: not a text trace ({e})") from None
        if first is None:
            raise TraceError(f"{path}: empty file")
    lineno, line = first
    if line.lstrip().startswith("{"):
        return "mooncake"
    if "TIMESTAMP" in [c.strip() for c in line.split(",")]:
        return "azure"
    raise TraceError(f"{path}: line {lineno}: neither Mooncake JSONL (one JSON object per line) nor an Azure CSV "
                     f"header ({','.join(AZURE_COLUMNS)})")


def load_trace(path: Path, seed: int = 0, limit: int | None = None) -> list[Arrival]:
    """A user's trace in either format (``trace_format``), at its own timestamps from 0."""
    path = Path(path)
    fmt = trace_format(path)
    arrivals = W.load_mooncake(path=path, seed=seed, limit=limit) if fmt == "mooncake" else \
        W.load_azure(path=path, seed=seed, limit=limit)
    if not arrivals:
        raise TraceError(f"{path}: no usable request")
    return arrivals


def trace_name(path: Path) -> str:
    """``runs/my-trace.jsonl.gz`` -> ``my-trace``."""
    name = Path(path).name
    for suffix in (".gz", ".jsonl", ".json", ".csv"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[:-len(suffix)]
    return name


def trace_scenario(path: Path, servers: int = DEFAULT_SERVERS, preset: str = DEFAULT_PRESET) -> Scenario:
    """The trace as a scenario; reads it once now so that a malformed file fails before any run."""
    path = Path(path)
    if servers < 1:
        raise ValueError(f"--servers: must be >= 1, got {servers}")
    spec = get_preset(preset)
    fmt = trace_format(path)
    n = len(load_trace(path))
    prefixes = "real prefix-block hashes" if fmt == "mooncake" else \
        "prefixes are SYNTHETIC: shared system prompts, the format has none"
    return Scenario(trace_name(path), f"user trace {path} ({fmt} format, {n:,} requests; {prefixes}) on "
                    f"{servers} {preset} servers", lambda seed: load_trace(path, seed=seed),
                    tuple(spec for _ in range(servers)), slo_classes=STANDARD_SLO)


def native_load(arrivals, capacity_rps: float) -> float:
    """The load (fraction of capacity) at which ``scale_to_rate`` keeps the trace's own pace."""
    rate = W.native_rate(arrivals)
    if rate <= 0:
        raise ValueError("--load native: every request of the trace has the same timestamp")
    return rate / capacity_rps
