"""Engine step-time model of a simulated vLLM-like server (``load/data/step-time/README.md``).

One step of continuous batching (decode tokens of running requests plus prefill chunks)
takes::

    t = c_lin(N) + c_tok*N + a_kv*sum(L_i) + [decodes]*c_attn + a_att*sum(n_j*(c_j - n_j/2)) + c_fix

all in ms, divided by the server's speed factor. ``c_lin`` is the measured non-attention
time per forward pass (linear interpolation of a table, linear extrapolation past its end).
Every coefficient is configurable; presets reproduce the calibrated figures.
"""
from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, replace

#: Llama-3-8B decode attention: 0.038 ms + 2.41 ms per 1e6 B*L per layer, 32 layers (A100, 1.7 TB/s).
_A_KV_L3_8B_A100 = 2.41e-6 * 32          # ms per KV token read in decode
_C_ATTN_L3_8B_A100 = 0.038 * 32          # ms per step with any decode
_A100_TO_H100_BW = 1.7 / 2.8
#: causal prefill attention: 4 flops * hidden * layers per token pair at 50% of peak fp16
_A_ATT_7B_A100 = 4 * 4096 * 32 / 156e12 * 1e3      # ms per token pair (312 TFLOPs peak)
_A_ATT_7B_H100 = 4 * 4096 * 32 / 494e12 * 1e3      # (989 TFLOPs peak)
_A_ATT_70B_H100_TP4 = 4 * 8192 * 80 / (4 * 494e12) * 1e3


#: the order the running requests of a step are batched in (waiting prompts come after them):
#: ``default`` admission order (a prompt still prefilling is the last admitted, so decodes come
#: first unless a preempted request was re-admitted behind them); ``decode-first`` every decode
#: before any prefill chunk, always; ``prefill-first`` the running prompts' chunks before the
#: decodes, which get the budget they leave (a long prompt stalls the server's decodes)
BATCHING_ORDERS = ("default", "decode-first", "prefill-first")


@dataclass(frozen=True)
class ServerSpec:
    """Everything that defines one simulated model server (one endpoint)."""

    name: str
    lin_tokens: tuple[int, ...]          # N points of the c_lin table
    lin_ms: tuple[float, ...]            # c_lin(N) in ms
    a_kv: float                          # ms per context token read by a decode
    c_attn: float                        # ms added to a step that has decodes
    a_att: float                         # ms per causal token pair of prefill
    c_fix: float = 1.5                   # ms per step (launch floor, LM head, sampler, scheduler)
    c_tok: float = 0.0                   # ms per token in the step (e.g. tensor-parallel all-reduce)
    kv_capacity_tokens: int = 500_000
    block_size: int = 16
    max_num_batched_tokens: int = 2048   # per-step token budget (chunked prefill)
    max_num_seqs: int = 256
    speed: float = 1.0                   # >1 = faster GPU (all step times divided by it)
    batching_order: str = "default"      # which running requests get the step's budget first (BATCHING_ORDERS)
    engine: str = "default"              # the foreign engine this server runs (load/sim/engines.py)

    def __post_init__(self) -> None:
        if len(self.lin_tokens) != len(self.lin_ms) or len(self.lin_tokens) < 2:
            raise ValueError(f"{self.name}: c_lin table needs >= 2 matching points")
        if list(self.lin_tokens) != sorted(set(self.lin_tokens)):
            raise ValueError(f"{self.name}: c_lin token points must be strictly increasing")
        for k in ("a_kv", "c_attn", "a_att", "c_fix", "c_tok"):
            if getattr(self, k) < 0:
                raise ValueError(f"{self.name}: {k} must be >= 0")
        if self.speed <= 0:
            raise ValueError(f"{self.name}: speed must be > 0")
        if self.block_size <= 0 or self.kv_capacity_tokens < self.block_size:
            raise ValueError(f"{self.name}: kv_capacity_tokens must hold at least one block")
        if self.max_num_batched_tokens <= 0 or self.max_num_seqs <= 0:
            raise ValueError(f"{self.name}: token budget and max_num_seqs must be > 0")
        if self.batching_order not in BATCHING_ORDERS:
            raise ValueError(f"{self.name}: batching_order {self.batching_order!r} is not one of "
                             + ", ".join(BATCHING_ORDERS))

    @property
    def num_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    def c_lin(self, n: float) -> float:
        xs, ys = self.lin_tokens, self.lin_ms
        if n <= xs[0]:
            return ys[0]
        i = bisect.bisect_left(xs, n)
        if i >= len(xs):
            i = len(xs) - 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (n - x0) / (x1 - x0)

    def step_ms(self, n_tokens: int, decode_ctx_sum: float, n_decodes: int, prefill_pairs: float) -> float:
        """Duration of one step. ``prefill_pairs`` = sum over chunks of n*(c - n/2)."""
        if n_tokens <= 0:
            return 0.0
        t = self.c_lin(n_tokens) + self.c_tok * n_tokens + self.a_kv * decode_ctx_sum
        if n_decodes:
            t += self.c_attn
        t += self.a_att * prefill_pairs + self.c_fix
        return t / self.speed

    def request_work_ms(self, input_len: int, output_len: int, hit: int) -> float:
        """GPU time one request costs this server when saturated (full token-budget steps)."""
        b = self.max_num_batched_tokens
        per_token = (self.c_lin(b) + self.c_tok * b + self.c_fix) / b
        new = input_len - hit
        pairs = new * (hit + new / 2.0)
        decode_ctx = (output_len - 1) * (input_len + output_len / 2.0)
        return (per_token * (new + output_len - 1) + self.a_att * pairs + self.a_kv * decode_ctx) / self.speed

    def with_overrides(self, overrides: Mapping) -> ServerSpec:
        """Copy with some coefficients replaced (unknown keys are an error)."""
        known = set(self.__dataclass_fields__)
        bad = sorted(set(overrides) - known)
        if bad:
            raise ValueError(f"unknown server parameter(s): {', '.join(bad)}")
        vals = dict(overrides)
        for k in ("lin_tokens", "lin_ms"):
            if k in vals:
                vals[k] = tuple(vals[k])
        return replace(self, **vals)


_N = (1, 32, 128, 512, 1024, 4096)

PRESETS: dict[str, ServerSpec] = {
    "llama3-8b-a100": ServerSpec(
        name="llama3-8b-a100", lin_tokens=_N, lin_ms=(9.8, 11.0, 13.3, 34.9, 75.6, 275.3),
        a_kv=_A_KV_L3_8B_A100, c_attn=_C_ATTN_L3_8B_A100, a_att=_A_ATT_7B_A100,
        c_fix=1.5, kv_capacity_tokens=500_000, max_num_batched_tokens=2048),
    "llama2-7b-a100": ServerSpec(
        name="llama2-7b-a100", lin_tokens=_N, lin_ms=(9.3, 9.6, 12.3, 33.6, 68.4, 261.9),
        a_kv=_A_KV_L3_8B_A100 * 4, c_attn=_C_ATTN_L3_8B_A100, a_att=_A_ATT_7B_A100,
        c_fix=1.5, kv_capacity_tokens=120_000, max_num_batched_tokens=2048),
    "llama2-7b-h100": ServerSpec(
        name="llama2-7b-h100", lin_tokens=_N, lin_ms=(5.6, 5.9, 6.4, 12.1, 21.3, 84.3),
        a_kv=_A_KV_L3_8B_A100 * 4 * _A100_TO_H100_BW, c_attn=_C_ATTN_L3_8B_A100 * _A100_TO_H100_BW,
        a_att=_A_ATT_7B_H100, c_fix=1.0, kv_capacity_tokens=118_000, max_num_batched_tokens=8192),
    # c_lin from vidur mlp.csv (H100, TP4, 80 layers); c_tok (all-reduce) and c_fix fitted to
    # splitwise end-to-end figures (prefill 1k 106 ms / 8k 954 ms; decode 29.7 / 36.9 ms).
    "llama2-70b-h100-tp4": ServerSpec(
        name="llama2-70b-h100-tp4", lin_tokens=(1, 32, 128, 512, 1024, 2048, 4096),
        lin_ms=(14.5, 15.5, 16.2, 30.6, 63.3, 114.6, 227.5),
        a_kv=_A_KV_L3_8B_A100 * 2.5 * _A100_TO_H100_BW / 4, c_attn=0.038 * 80 * _A100_TO_H100_BW / 4,
        a_att=_A_ATT_70B_H100_TP4, c_fix=15.2, c_tok=0.04, kv_capacity_tokens=460_000,
        max_num_batched_tokens=8192),
}


def get_preset(name: str, **overrides) -> ServerSpec:
    try:
        spec = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown server preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
    return spec.with_overrides(overrides) if overrides else spec
