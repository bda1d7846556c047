"""Llama-3.1-70B server presets (A100 TP2, H100 TP2, H100 TP4) derived from published measurements.

Every coefficient comes from hardware facts, none from a serving run (derivation in
``load/data/step-time/README.md``, "Llama-3.1-70B presets"):

- ``c_lin``: Vidur's per-operator medians (``mlp.csv``), whole model, 80 layers: A100
  Meta-Llama-3-70B at TP2; H100 Llama-2-70B (same layer shapes) at TP2 and TP4;
- ``a_kv``, ``c_attn``: the Llama-3-8B decode-attention fit (2.41 ms per 1e6 B*L per layer
  at 4 KiB of KV per token and layer, 0.038 ms floor per layer) scaled to 80 layers, the
  KV bytes one GPU reads (8 KV heads split over TP) and memory bandwidth (H100/A100 2.8/1.7);
- ``a_att``: causal attention at half the fp16 peak (312 / 989 TFLOPs) split over TP;
- ``c_fix`` (per step) and ``c_tok`` (per token: tensor-parallel all-reduce): least squares,
  relative error, on Splitwise's end-to-end Llama-2-70B figures for the same GPU and TP
  (decode step at batch 1, prefill of 1k and 8k tokens);
- ``kv_capacity_tokens``: vLLM's memory budget, ``gpu_memory_utilization`` x 80 GiB per GPU,
  minus the weight shard (70.55e9 fp16 parameters / TP) and 2 GiB of runtime memory (CUDA
  context, NCCL buffers, activation peak, CUDA graphs), divided by the KV bytes per token per
  GPU (2 x 80 layers x 8 KV heads / TP x 128 x 2 bytes);
- ``max_num_batched_tokens`` 2048 and ``max_num_seqs`` 256: vLLM V1's defaults for the
  OpenAI server.

Splitwise's decode step at batch 32 is not used: it grows 17 ms from batch 1 on A100 TP2
where Vidur's profiles of vLLM's own kernels (linear layers and paged attention) grow 5; the
runs this preset stands for are vLLM's, Splitwise's serving framework is not recorded
(static batches). The model gives 60.5 / 40.0 / 31.7 ms at batch 32 against Splitwise's
72.2 / 52.3 / 36.9.
"""
from __future__ import annotations

from .stepmodel import ServerSpec

GIB = 1 << 30
#: Llama-3.1-70B: parameters, layers, KV heads, head size, hidden size
PARAMS_70B = 70.55e9
LAYERS, KV_HEADS, HEAD_DIM, HIDDEN = 80, 8, 128, 8192
GPU_MEMORY_GIB = 80.0
RUNTIME_GIB = 2.0
#: gpu_memory_utilization of llm-d-benchmark's deployments (vLLM's own default is 0.9)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.95

_N = (1, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: Vidur mlp.csv, whole-model non-attention ms per forward pass of N tokens
_LIN = {
    "a100-tp2": (45.5, 49.0, 51.0, 62.9, 88.6, 177.3, 353.0, 652.3, 1296.9),
    "h100-tp2": (25.7, 26.8, 27.0, 28.3, 32.9, 57.3, 116.4, 221.7, 442.2),
    "h100-tp4": (14.5, 15.5, 15.4, 16.2, 19.5, 30.6, 63.3, 114.6, 227.5),
}
#: Splitwise perf_model.csv medians, Llama-2-70B: decode step at batch 1 (prompt 512, 128
#: output tokens), prefill of 1,024 and 8,192 tokens (ms); what c_fix and c_tok are fitted to
SPLITWISE = {
    "a100-tp2": (54.9, 377.0, 2990.0),
    "h100-tp2": (37.0, 158.0, 1340.0),
    "h100-tp4": (29.7, 106.0, 954.0),
}
#: (c_fix ms per step, c_tok ms per token), least squares on SPLITWISE
_FIT = {
    "a100-tp2": (6.28, 0.0136),
    "h100-tp2": (9.07, 0.0367),
    "h100-tp4": (12.51, 0.0400),
}
_A_KV_8B = 2.41e-6 * 32           # ms per KV token, Llama-3-8B on A100 (4 KiB per token and layer)
_H100_BW = 1.7 / 2.8


def kv_capacity_tokens(tp: int, gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> int:
    """KV-cache tokens one replica holds (vLLM's memory budget after weights and runtime)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    free = gpu_memory_utilization * GPU_MEMORY_GIB * GIB - PARAMS_70B * 2 / tp - RUNTIME_GIB * GIB
    per_token = 2 * LAYERS * (KV_HEADS // tp) * HEAD_DIM * 2
    if free < per_token * 16:
        raise ValueError(f"gpu_memory_utilization {gpu_memory_utilization}: no memory left for the KV cache at TP{tp}")
    return int(free // per_token) // 16 * 16


def llama31_70b(gpu: str, tp: int, gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> ServerSpec:
    """The preset for Llama-3.1-70B on ``gpu`` ("a100" or "h100") at tensor parallel ``tp``."""
    key = f"{gpu}-tp{tp}"
    if key not in _LIN:
        raise ValueError(f"no Llama-3.1-70B preset for {gpu} TP{tp}; known: {', '.join(sorted(_LIN))}")
    bw = 1.0 if gpu == "a100" else _H100_BW
    peak = 312e12 if gpu == "a100" else 989e12
    c_fix, c_tok = _FIT[key]
    return ServerSpec(
        name=f"llama31-70b-{key}", lin_tokens=_N, lin_ms=_LIN[key],
        a_kv=_A_KV_8B * (LAYERS / 32) * (KV_HEADS / tp / 8) * bw, c_attn=0.038 * LAYERS * bw,
        a_att=4 * HIDDEN * LAYERS / (tp * peak / 2) * 1e3, c_fix=c_fix, c_tok=c_tok,
        kv_capacity_tokens=kv_capacity_tokens(tp, gpu_memory_utilization),
        max_num_batched_tokens=2048, max_num_seqs=256)


#: preset name -> (gpu, tensor parallel)
PRESETS_70B = {"llama31-70b-a100-tp2": ("a100", 2), "llama31-70b-h100-tp2": ("h100", 2),
               "llama31-70b-h100-tp4": ("h100", 4)}


def get_70b_preset(name: str, gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> ServerSpec:
    try:
        gpu, tp = PRESETS_70B[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS_70B))}") from None
    return llama31_70b(gpu, tp, gpu_memory_utilization)
