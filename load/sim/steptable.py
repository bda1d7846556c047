"""Step times read from a published table, not from the simulator's formula: the ``splitwise``
foreign engine (``load/data/splitwise-perf-model/README.md``).

SplitwiseSim's profiling table gives, per model / GPU / tensor parallelism, the prefill time of
one prompt by its length (batch 1) and the decode-step time by the number of requests batched.
A step of continuous batching with ``D`` decodes and prefill chunks totalling ``n`` tokens that
end at context ``c`` (from the step's causal token pairs: ``c = pairs / n + n / 2``) takes::

    decode part   T(D)                             decode-step time at batch D
    prefill part  P(c) - P(c - n) + F*[c > n]      prefill time of the chunk's tokens on top of
                                                   the ones before it, each step paying its own
                                                   weight read F = T(1)
    mixed step    T(D) + prefill part - F          the weights are read once

``P`` and ``T`` are piecewise-linear interpolations of the table's medians (linear extrapolation
past the last point; ``P`` starts at ``(1, T(1))``: a one-token prompt is one decode-sized
pass). The decode step has no context term: the table's decode step hardly grows with the
context (grouped-query attention). Memory, token budget and ``max_num_seqs`` are the base
preset's; ``speed`` divides every step as for any server.
"""
from __future__ import annotations

import bisect
import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache

from load.data import data_root, open_data

from .stepmodel import ServerSpec

TABLE = data_root() / "splitwise-perf-model" / "perf_model.csv.gz"


def _interp(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    i = bisect.bisect_left(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@lru_cache(maxsize=8)
def splitwise_curves(model: str = "llama2-70b", hardware: str = "h100-80gb", tp: int = 4
                     ) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """(prompt tokens, prefill ms, batch sizes, decode-step ms): medians over the repetitions of
    the batch-1 prompt sweep and of the 512-token-prompt batch sweep (128 output tokens)."""
    prefill: dict[int, list[float]] = defaultdict(list)
    decode: dict[int, list[float]] = defaultdict(list)
    with open_data(TABLE) as f:
        for row in csv.DictReader(f):
            if (row["model"], row["hardware"], int(row["tensor_parallel"])) != (model, hardware, tp):
                continue
            prompt, batch, out = int(row["prompt_size"]), int(row["batch_size"]), int(row["token_size"])
            if batch == 1 and out == 128:
                prefill[prompt].append(float(row["prompt_time"]))
            if prompt == 512 and out == 128:
                decode[batch].append(float(row["token_time"]))
    if len(prefill) < 2 or len(decode) < 2:
        raise ValueError(f"splitwise table: no {model} / {hardware} / TP {tp} rows")
    px = tuple(float(k) for k in sorted(prefill))
    dx = tuple(float(k) for k in sorted(decode))
    return (px, tuple(statistics.median(prefill[int(k)]) for k in px),
            dx, tuple(statistics.median(decode[int(k)]) for k in dx))


@dataclass(frozen=True)
class TableSpec(ServerSpec):
    """A server whose step time interpolates a measured table (module docstring)."""

    prefill_tokens: tuple[float, ...] = ()
    prefill_ms: tuple[float, ...] = ()
    decode_batch: tuple[float, ...] = ()
    decode_ms: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        for xs, ys, what in ((self.prefill_tokens, self.prefill_ms, "prefill"),
                             (self.decode_batch, self.decode_ms, "decode")):
            if len(xs) < 2 or len(xs) != len(ys) or list(xs) != sorted(set(xs)):
                raise ValueError(f"{self.name}: the {what} table needs >= 2 strictly increasing points")

    def _decode(self, batch: float) -> float:
        return _interp(self.decode_batch, self.decode_ms, batch)

    def _prefill(self, tokens: float) -> float:
        """Cumulative prefill time of a prompt's first ``tokens`` tokens (0 for none)."""
        if tokens <= 0:
            return 0.0
        xs, ys = self.prefill_tokens, self.prefill_ms
        if tokens < xs[0]:
            return _interp((1.0, xs[0]), (self._decode(1), ys[0]), tokens)
        return _interp(xs, ys, tokens)

    def step_ms(self, n_tokens: int, decode_ctx_sum: float, n_decodes: int, prefill_pairs: float) -> float:
        if n_tokens <= 0:
            return 0.0
        n = n_tokens - n_decodes
        t = self._decode(n_decodes) if n_decodes else 0.0
        if n > 0:
            end = prefill_pairs / n + n / 2.0
            start = max(0.0, end - n)
            floor = self._decode(1)
            t += self._prefill(end) - self._prefill(start) + (floor if start > 0 else 0.0)
            if n_decodes:
                t -= floor
        return t / self.speed

    def request_work_ms(self, input_len: int, output_len: int, hit: int) -> float:
        """GPU time of one request on a saturated server: its prompt's prefill time past the
        cached tokens (the weight reads shared with the step's decodes) and its decodes at
        ``max_num_seqs``-wide decode steps."""
        prefill = self._prefill(input_len) - self._prefill(hit)
        per_decode = self._decode(self.max_num_seqs) / self.max_num_seqs
        return (prefill + per_decode * max(0, output_len - 1)) / self.speed
