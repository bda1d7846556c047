"""Workloads: trace replay (Mooncake, Azure) and synthetic generators, scaled to a load.

A workload is a list of ``Arrival(time_s, input_len, output_len, segments)``; segments are
``(key, n_tokens)`` prompt pieces whose keys identify a prefix chain (see ``kvcache``).
Non-final segments are whole 512-token blocks, as in Mooncake's hash ids. SLOs and
priority classes are drawn per request from configuration by ``make_requests``.
"""
from __future__ import annotations

import calendar
import csv
import json
import math
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..data import data_root as data_dir  # noqa: F401  (the one data root; kept under its old name)
from ..data import open_data
from .request import SimRequest
from .stepmodel import ServerSpec

SEG = 512                      # tokens per prefix block (Mooncake's block size)
_SYS_KEY = 1 << 40             # key namespaces: Mooncake ids are small non-negative ints
_SESSION_KEY = 2 << 40
_UNIQUE_KEY = 3 << 40


class Arrival(NamedTuple):
    time_s: float
    input_len: int
    output_len: int
    segments: tuple


@dataclass(frozen=True)
class SloClass:
    """Per-request SLO (0 = none) and priority; ``share`` is the class's weight."""

    share: float = 1.0
    ttft_ms: float = 0.0
    ttft_ms_per_1k_input: float = 0.0   # TTFT SLO grows with the prompt: + this * input/1000
    ttft_slowdown: float = 0.0          # ... and/or with the prompt's prefill time on an idle server
    tpot_ms: float = 0.0
    priority: int = 0
    name: str = "default"

    def ttft_for(self, input_len: int, spec: ServerSpec | None = None) -> float:
        if self.ttft_ms <= 0 and self.ttft_ms_per_1k_input <= 0 and self.ttft_slowdown <= 0:
            return 0.0
        slo = self.ttft_ms + self.ttft_ms_per_1k_input * input_len / 1000.0
        if self.ttft_slowdown > 0 and spec is not None:
            slo += self.ttft_slowdown * isolated_prefill_ms(spec, input_len)
        return slo


def isolated_prefill_ms(spec: ServerSpec, input_len: int) -> float:
    """TTFT of a prompt alone on an idle server with an empty cache (chunked prefill)."""
    b = spec.max_num_batched_tokens
    t = 0.0
    done = 0
    while done < input_len:
        n = min(b, input_len - done)
        t += spec.step_ms(n, 0.0, 0, n * (done + n - n / 2.0))
        done += n
    return t


class _Keys:
    def __init__(self) -> None:
        self.n = 0

    def unique(self) -> int:
        self.n += 1
        return _UNIQUE_KEY + self.n


def _chunk(keys_for_blocks: Sequence[int], input_len: int) -> tuple:
    """Segments for a prompt whose 512-token blocks have the given keys."""
    segs = []
    for j, key in enumerate(keys_for_blocks):
        n = min(SEG, input_len - j * SEG)
        if n <= 0:
            break
        segs.append((key, n))
    return tuple(segs)


# -- trace replay ---------------------------------------------------------------------------
class TraceError(ValueError):
    """A trace file that cannot be read: the message names the file and the line."""


def _int_field(o: dict, key: str, where: str, lo: int = 0) -> int:
    if key not in o:
        raise TraceError(f"{where}: missing field {key!r}")
    v = o[key]
    try:
        n = int(float(v)) if not isinstance(v, bool) and float(v) == int(float(v)) else None
    except (TypeError, ValueError, OverflowError):
        n = None
    if n is None or n < lo:
        raise TraceError(f"{where}: {key} must be an integer >= {lo}, got {v!r}")
    return n


def load_mooncake(name: str = "conversation", limit: int | None = None, path: Path | None = None,
                  dequantize_s: float | None = None, seed: int = 0) -> list[Arrival]:
    """Mooncake FAST'25 JSONL trace (``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids`` of 512-token prefix blocks shared across requests); ``path`` reads any file
    in that format (plain or .gz; a missing ``hash_ids`` means no shared prefix). A row whose
    ``hash_ids`` do not cover its prompt, or with an empty prompt, is skipped, as in the
    published traces; a malformed row is a ``TraceError`` naming the file and line.

    The conversation trace's arrivals are quantised to ~3 s (about ten requests share a
    timestamp); ``dequantize_s`` (default 3 s for it, 0 for the others and for ``path``)
    spreads each request uniformly (seeded) over the quantisation step so that bursts are not
    an artefact of the rounding. Request order within the trace is kept.
    """
    if dequantize_s is None:
        dequantize_s = 3.0 if name == "conversation" and path is None else 0.0
    rng = random.Random(seed ^ 0x3A11)
    p = path or data_dir() / "mooncake-fast25" / f"{name}_trace.jsonl.gz"
    keys = _Keys()
    out = []
    with open_trace(p) as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            where = f"{p}: line {lineno}"
            try:
                o = json.loads(line)
            except ValueError as e:
                raise TraceError(f"{where}: not a JSON object ({e})") from None
            if not isinstance(o, dict):
                raise TraceError(f"{where}: not a JSON object")
            ts = o.get("timestamp")
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
                raise TraceError(f"{where}: timestamp must be a number of milliseconds, got {ts!r}")
            n_in = _int_field(o, "input_length", where)
            n_out = _int_field(o, "output_length", where)
            ids = o.get("hash_ids")
            if ids is None:
                ids = [keys.unique() for _ in range(math.ceil(n_in / SEG))]
            elif not isinstance(ids, list) or not all(isinstance(k, int) and k >= 0 for k in ids):
                raise TraceError(f"{where}: hash_ids must be a list of non-negative integers")
            if n_in < 1 or len(ids) != math.ceil(n_in / SEG):
                continue
            t = float(ts) / 1000.0 + (rng.random() * dequantize_s if dequantize_s > 0 else 0.0)
            out.append(Arrival(t, n_in, max(1, n_out), _chunk(ids, n_in)))
    out.sort(key=lambda a: a.time_s)
    return out


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_AZURE_TIME = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?")


def _azure_time(ts: str) -> float | None:
    """Seconds since the epoch of ``2023-11-16 18:15:46.6805900`` (optional ``T``, zone)."""
    m = _AZURE_TIME.fullmatch(ts.strip())
    if m is None:
        return None
    try:
        t = calendar.timegm(time.strptime(m.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None
    zone = m.group(3)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        t -= sign * (int(zone[1:3]) * 3600 + int(zone[-2:]) * 60)
    return t + float("0" + (m.group(2) or ""))


def load_azure(name: str = "code", limit: int | None = None, path: Path | None = None, seed: int = 0,
               n_system_prompts: int = 16, system_prompt_share: float = 0.8) -> list[Arrival]:
    """Azure LLM inference trace (Splitwise) CSV: ``TIMESTAMP``, ``ContextTokens``,
    ``GeneratedTokens``; ``path`` reads any file in that format (plain or .gz; a malformed
    row is a ``TraceError`` naming the file and line). It has no prefix information: a
    SYNTHETIC shared system prompt (one of ``n_system_prompts``, Zipf popularity, 512-2048
    tokens, never more than the prompt) is assigned to ``system_prompt_share`` of the requests."""
    p = path or data_dir() / "azure-llm-inference-2023" / f"AzureLLMInferenceTrace_{name}.csv.gz"
    rng = random.Random(seed)
    sys_lens = [SEG * rng.randint(1, 4) for _ in range(n_system_prompts)]
    weights = [1.0 / (k + 1) for k in range(n_system_prompts)]
    keys = _Keys()
    out = []
    t0 = None
    with open_trace(p) as f:
        reader = csv.DictReader(f)
        missing = [c for c in AZURE_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{p}: line 1: missing column(s) {', '.join(missing)} (an Azure trace's header names "
                             f"{', '.join(AZURE_COLUMNS)})")
        for row in reader:
            if limit is not None and len(out) >= limit:
                break
            where = f"{p}: line {reader.line_num}"
            t = _azure_time(row["TIMESTAMP"] or "")
            if t is None:
                raise TraceError(f"{where}: TIMESTAMP must look like 2023-11-16 18:15:46.680, got {row['TIMESTAMP']!r}")
            t0 = t if t0 is None else t0
            n_in = max(1, _int_field(row, "ContextTokens", where))
            n_out = max(1, _int_field(row, "GeneratedTokens", where))
            blocks = []
            if rng.random() < system_prompt_share:
                k = rng.choices(range(n_system_prompts), weights)[0]
                nsys = min(sys_lens[k], (n_in // SEG) * SEG)
                blocks = [_SYS_KEY + k * 1000 + j for j in range(nsys // SEG)]
            nblocks = math.ceil(n_in / SEG)
            blocks += [keys.unique() for _ in range(nblocks - len(blocks))]
            out.append(Arrival(t - t0, n_in, n_out, _chunk(blocks, n_in)))
    out.sort(key=lambda a: a.time_s)
    return out


def open_trace(p: Path):
    try:
        return open_data(p)
    except OSError as e:
        raise TraceError(f"{p}: cannot read ({e.strerror or e})") from None


# -- synthetic ------------------------------------------------------------------------------
def _lognormal_int(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma)))))


def synthetic_poisson(n: int, rate: float = 1.0, seed: int = 0, input_median: int = 2000, input_sigma: float = 0.8,
                      output_median: int = 200, output_sigma: float = 0.7, n_system_prompts: int = 8,
                      system_prompt_share: float = 0.5, system_prompt_blocks: int = 4, max_input: int = 32_000,
                      max_output: int = 2000) -> list[Arrival]:
    """Poisson arrivals, log-normal lengths, optional shared system prompts (Zipf)."""
    rng = random.Random(seed)
    keys = _Keys()
    weights = [1.0 / (k + 1) for k in range(max(1, n_system_prompts))]
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(rate)
        n_in = _lognormal_int(rng, input_median, input_sigma, 16, max_input)
        n_out = _lognormal_int(rng, output_median, output_sigma, 1, max_output)
        blocks = []
        if n_system_prompts and rng.random() < system_prompt_share:
            k = rng.choices(range(n_system_prompts), weights)[0]
            nsys = min(system_prompt_blocks, n_in // SEG)
            blocks = [_SYS_KEY + k * 1000 + j for j in range(nsys)]
        blocks += [keys.unique() for _ in range(math.ceil(n_in / SEG) - len(blocks))]
        out.append(Arrival(t, n_in, n_out, _chunk(blocks, n_in)))
    return out


def synthetic_sessions(n_sessions: int, rate: float = 0.2, seed: int = 0, turns_mean: float = 4.0,
                       think_s: float = 20.0, system_blocks: int = 2, first_median: int = 1500,
                       user_median: int = 300, output_median: int = 250, max_context: int = 64_000) -> list[Arrival]:
    """Multi-turn chat sessions: each turn's prompt is the whole previous context (previous
    prompt + answer) plus a new user message, so context grows and prefixes repeat.
    Open loop: a turn arrives a think time after the previous turn's arrival."""
    rng = random.Random(seed)
    keys = _Keys()
    out = []
    t = 0.0
    for s in range(n_sessions):
        t += rng.expovariate(rate)
        turns = 1 + int(rng.expovariate(1.0 / max(1e-9, turns_mean - 1)))
        ctx = system_blocks * SEG + _lognormal_int(rng, first_median, 0.7, 16, 16_000)
        ta = t
        for _ in range(turns):
            if ctx > max_context:
                break
            n_out = _lognormal_int(rng, output_median, 0.6, 1, 2000)
            full = ctx // SEG
            # system blocks are shared by all sessions; the rest are the session's own chain
            blocks = [_SYS_KEY + 999_000 + j for j in range(min(system_blocks, full))]
            blocks += [_SESSION_KEY + s * 1000 + j for j in range(len(blocks), full)]
            if ctx % SEG:
                blocks.append(keys.unique())   # partial last block: content changes next turn
            out.append(Arrival(ta, ctx, n_out, _chunk(blocks, ctx)))
            ctx += n_out + _lognormal_int(rng, user_median, 0.8, 4, 8000)
            ta += rng.expovariate(1.0 / think_s)
    out.sort(key=lambda a: a.time_s)
    return out


def synthetic_ramp(n: int, seed: int = 0, start: float = 0.5, end: float = 1.4, **kw) -> list[Arrival]:
    """Chat-like requests (as :func:`synthetic_poisson`, ``kw`` passed on) whose arrival rate
    rises linearly from ``start`` to ``end`` x the mean rate over the run: scaled to a load of
    ``(start + end) / 2`` of capacity, the load ramps from ``start`` to ``end`` (queues and KV
    pressure building past anything seen earlier in the trace). Deterministic in ``seed``."""
    base = synthetic_poisson(n, rate=1.0, seed=seed, **kw)   # unit-rate arrival times, lengths
    span = base[-1].time_s
    mean = (start + end) / 2.0
    a, b = start / mean, (end - start) / mean / span          # rate(t) = a + b t, mean 1 over the span
    out = []
    for arr in base:                                          # invert the cumulative rate a t + b t^2 / 2
        u = arr.time_s
        t = (-a + math.sqrt(a * a + 2.0 * b * u)) / b if b > 0 else u / a
        out.append(arr._replace(time_s=t))
    return out


# -- load scaling ---------------------------------------------------------------------------
def ideal_hit_tokens(arrivals: Sequence[Arrival]) -> list[int]:
    """Prompt tokens each request could reuse from an infinite cache shared by all earlier requests."""
    seen: set = set()
    out = []
    for a in arrivals:
        hit = 0
        for key, n in a.segments:
            if key in seen and n == SEG:
                hit += n
            else:
                break
        out.append(min(hit, a.input_len - 1))
        seen.update(k for k, n in a.segments if n == SEG)
    return out


def request_work_ms(spec: ServerSpec, input_len: int, output_len: int, hit: int) -> float:
    """GPU time one request costs a saturated server (full token-budget steps)."""
    return spec.request_work_ms(input_len, output_len, hit)


def capacity_rps(arrivals: Sequence[Arrival], servers: Sequence[ServerSpec], prefix_reuse: bool = False) -> float:
    """Requests/s the cluster can serve at 100% load: per server shape (a spec at speed 1), the
    shape's speed-weighted GPU time over its mean per-request work on saturated servers (full
    token-budget steps), without prefix reuse by default (``prefix_reuse=True``: with an ideal
    shared cache). Prefix hits won by routing make room below this bound; partial steps and
    preemptions use it up."""
    hits = ideal_hit_tokens(arrivals) if prefix_reuse else [0] * len(arrivals)
    shapes: dict[ServerSpec, float] = {}
    for s in servers:
        shape = s.with_overrides({"speed": 1.0})
        shapes[shape] = shapes.get(shape, 0.0) + s.speed
    total = 0.0
    for shape, speed in shapes.items():
        mean_work = sum(request_work_ms(shape, a.input_len, a.output_len, h)
                        for a, h in zip(arrivals, hits)) / max(1, len(arrivals))
        total += speed * 1000.0 / mean_work
    return total


def native_rate(arrivals: Sequence[Arrival]) -> float:
    """Mean arrival rate (requests/s) of a workload at its own timestamps (0 if they coincide)."""
    span = arrivals[-1].time_s - arrivals[0].time_s if arrivals else 0.0
    return (len(arrivals) - 1) / span if span > 0 else 0.0


def scale_to_rate(arrivals: Sequence[Arrival], target_rps: float) -> list[Arrival]:
    """Compress or stretch time so the mean arrival rate is ``target_rps`` (order kept)."""
    if not arrivals:
        return []
    t0 = arrivals[0].time_s
    native = native_rate(arrivals)
    if native <= 0:
        return list(arrivals)
    f = native / target_rps
    return [a._replace(time_s=(a.time_s - t0) * f) for a in arrivals]


def make_requests(arrivals: Sequence[Arrival], slo_classes: Sequence[SloClass], seed: int,
                  spec: ServerSpec | None = None) -> list[SimRequest]:
    """Fresh request objects (one set per policy run) with SLO classes drawn per request."""
    rng = random.Random(seed ^ 0x5105)
    classes = list(slo_classes) or [SloClass()]
    weights = [c.share for c in classes]
    block_size = spec.block_size if spec is not None else 16
    out = []
    for i, a in enumerate(arrivals):
        c = classes[0] if len(classes) == 1 else rng.choices(classes, weights)[0]
        out.append(SimRequest(i, a.time_s, a.input_len, a.output_len, a.segments,
                              ttft_slo_ms=c.ttft_for(a.input_len, spec), tpot_slo_ms=c.tpot_ms, priority=c.priority,
                              block_size=block_size))
    return out
