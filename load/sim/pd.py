"""Prefill/decode disaggregation in the simulator: server roles, the KV transfer, and a
simulation in which a disaggregated request is prefilled on a prefill server, its KV
cache moved to the decode server, and only then admitted there (``docs/pd.md``).

Life of a disaggregated request (what llm-d's routing sidecar and vLLM's NIXL connector
do): the router picks a decode and a prefill server; the prefill server runs the prompt
with one output token (discarded); at its end the KV of the prompt tokens *not already
cached on the decode server* travels over the link, taking
``tokens x kv_bytes_per_token / bandwidth (+ a fixed latency)``; the decode server then
admits the request with its prompt already computed (its pages are allocated, the
received blocks join its prefix cache) and the first step produces the first token, so
``TTFT = prefill + transfer + first decode step`` (plus any queueing). A request
preempted on the decode server recomputes its prompt locally.

What the decode server pays for arriving KV (``KVLink.load``):
- ``async`` (vLLM's NIXL connector: the decode worker's RDMA reads run beside its steps):
  each GPU has one NIC, so a transfer occupies the sending and the receiving server's link
  and waits for both to be free (transfers into one decode server queue, FIFO); the step
  that admits the request pays the HBM writes of the received blocks,
  ``bytes / hbm_gbps``;
- ``in-step`` (a connector that loads the KV inside the decode server's forward pass, as
  LMCache's and vLLM's earlier PyNccl connector do): the request reaches the decode
  server when its prefill ends, and the step that admits it waits for the whole transfer,
  stalling every running decode for ``tokens x bytes / bandwidth``.

Routers for a ``PDSimulation`` return either a server index (not disaggregated) or a
tuple ``(decode_index, prefill_index or None)``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .engine import ClusterConfig, Simulation
from .request import SimRequest
from .server import Metrics, ModelServer

PREFILL, DECODE, BOTH = "prefill", "decode", "prefill-decode"
ROLES = (PREFILL, DECODE, BOTH)


@dataclass(frozen=True)
class KVShape:
    """What sets a model's KV-cache size per token (from its Hugging Face config.json)."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2   # bf16 / fp16

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes   # K and V


#: KV shapes of the step-model presets (num_hidden_layers, num_key_value_heads,
#: hidden_size / num_attention_heads in each model's config.json): Llama-3-8B 32 layers,
#: 8 KV heads (GQA), head dim 128 -> 128 KiB/token; Llama-2-7B 32 layers, 32 KV heads
#: (MHA), 128 -> 512 KiB/token; Llama-2-70B 80 layers, 8 KV heads, 128 -> 320 KiB/token.
KV_SHAPES: dict[str, KVShape] = {
    "llama3-8b-a100": KVShape(32, 8, 128),
    "llama2-7b-a100": KVShape(32, 32, 128),
    "llama2-7b-h100": KVShape(32, 32, 128),
    "llama2-70b-h100-tp4": KVShape(80, 8, 128),
}

#: Link bandwidths in GB/s (one direction). RDMA: one 200 Gb/s InfiniBand / RoCE NIC per
#: GPU (ConnectX-6 HDR in a DGX A100) = 25 GB/s, 400 Gb/s (ConnectX-7 NDR, DGX H100) = 50
#: GB/s; NVLink within a node: A100 NVLink 3 600 GB/s bidirectional = 300 GB/s per
#: direction, H100 NVLink 4 = 450 GB/s. NIXL moves the blocks with RDMA reads over these.
LINKS_GBPS = {"rdma-200g": 25.0, "rdma-400g": 50.0, "nvlink-a100": 300.0, "nvlink-h100": 450.0,
              # no GPUDirect path: staged through host memory over PCIe 4.0 x16 (32 GB/s raw, about
              # 25 GB/s for large copies) and sent over a 100 Gb/s TCP NIC (12.5 GB/s) at about 80%
              "pcie4-host": 25.0, "tcp-100g": 10.0}
#: HBM bandwidth in GB/s the received KV is written at: A100 80 GB SXM (HBM2e) 2,039; H100 SXM (HBM3) 3,350
HBM_GBPS = {"a100": 2039.0, "h100": 3350.0}
LOAD_MODES = ("async", "in-step")


@dataclass(frozen=True)
class KVLink:
    kv_bytes_per_token: float
    bandwidth_gbps: float = LINKS_GBPS["rdma-200g"]
    latency_ms: float = 0.0   # fixed cost per transfer (handshake, descriptor setup)
    load: str = "async"       # LOAD_MODES: how the decode server takes the KV in
    hbm_gbps: float = HBM_GBPS["a100"]

    def __post_init__(self) -> None:
        if self.kv_bytes_per_token <= 0 or self.bandwidth_gbps <= 0 or self.latency_ms < 0 or self.hbm_gbps <= 0:
            raise ValueError("KV link: bytes per token, bandwidth and HBM bandwidth must be > 0, latency >= 0")
        if self.load not in LOAD_MODES:
            raise ValueError(f"KV link: load must be one of {', '.join(LOAD_MODES)}, got {self.load!r}")

    def transfer_s(self, tokens: int) -> float:
        return self.latency_ms / 1000.0 + max(0, tokens) * self.kv_bytes_per_token / (self.bandwidth_gbps * 1e9)

    def decode_cost_s(self, tokens: int) -> float:
        """What the decode server's admitting step pays for ``tokens`` of received KV."""
        if tokens <= 0:
            return 0.0
        if self.load == "in-step":
            return self.transfer_s(tokens)
        return tokens * self.kv_bytes_per_token / (self.hbm_gbps * 1e9)

    @classmethod
    def for_preset(cls, preset: str, link: str = "rdma-200g", latency_ms: float = 0.0, load: str = "async") -> KVLink:
        try:
            shape, bw = KV_SHAPES[preset], LINKS_GBPS[link]
        except KeyError as e:
            raise ValueError(f"no KV shape or link named {e.args[0]!r}") from None
        return cls(shape.bytes_per_token, bw, latency_ms, load, HBM_GBPS["h100" if "h100" in preset else "a100"])


def cached_prefix_tokens(server: ModelServer, req: SimRequest) -> int:
    """Prompt tokens already in the server's prefix cache (a lookup; nothing is pinned)."""
    kv = server.kv
    if not kv.prefix_caching:
        return 0
    tok = 0
    for (key, ntok), fp in zip(req.segments, req.full_pages):
        c = kv.cached.get(key, 0)
        if c == 0:
            break
        if c >= fp:
            tok += ntok
            continue
        tok += c * server.bs
        break
    return min(tok, req.input_len)


class PDModelServer(ModelServer):
    """A model server that can admit a request whose prompt KV arrived from elsewhere."""

    def __init__(self, index: int, spec, prefix_caching: bool = True, role: str = BOTH,
                 link: KVLink | None = None) -> None:
        super().__init__(index, spec, prefix_caching)
        self.role = role
        self.link = link
        self.remote_kv: dict[int, int] = {}   # request id -> KV tokens received, until it is admitted
        self.kv_load_s = 0.0                  # step time spent taking received KV in

    def _admit_match(self, req: SimRequest) -> int:
        tok = super()._admit_match(req)
        if req.rid in self.remote_kv:
            tok = req.computed = req.target - 1   # the first step computes the next token only
        return tok

    def plan_step(self, now: float) -> float:
        before = len(self.running)
        dur = super().plan_step(now)
        if self.remote_kv and self.link is not None:
            extra = 0.0
            for req in self.running[before:]:      # admitted by this step
                tokens = self.remote_kv.pop(req.rid, None)
                if tokens is not None:
                    extra += self.link.decode_cost_s(tokens)
            if extra > 0 and dur > 0:
                dur += extra
                self.busy_time += extra
                self.kv_load_s += extra
        return dur

    def _preempt(self, req: SimRequest) -> None:
        self.remote_kv.pop(req.rid, None)   # recompute preemption: the prompt is recomputed here
        super()._preempt(req)


class _Handoff:
    """Sits between the engine and a P/D router: runs the prefill phase, then the transfer."""

    def __init__(self, router, sim: PDSimulation) -> None:
        self.inner = router
        self.sim = sim
        self.name = getattr(router, "name", "pd")
        self.tick_interval_s = getattr(router, "tick_interval_s", 0.0)
        self.pending: dict[int, tuple[int, int]] = {}   # rid -> (decode index, real output_len)

    def bind(self, sim) -> None:
        self.inner.bind(sim)

    def route(self, req: SimRequest, now: float):
        r = self.inner.route(req, now)
        if not isinstance(r, tuple):
            return r
        d, p = r
        if p is None or p == d:
            return d
        self.pending[req.rid] = (d, req.output_len)
        req.output_len = 1   # the prefill server's run: the prompt plus one (discarded) token
        return p

    def on_dispatch(self, req: SimRequest, idx: int, now: float) -> None:
        pend = self.pending.get(req.rid)
        self.inner.on_dispatch(req, pend[0] if pend is not None else idx, now)

    def on_first_token(self, req: SimRequest, now: float) -> None:
        if req.rid not in self.pending:
            self.inner.on_first_token(req, now)

    def on_finish(self, req: SimRequest, now: float) -> None:
        pend = self.pending.pop(req.rid, None)
        if pend is None:
            self.inner.on_finish(req, now)
            return
        d, out = pend
        req.output_len = out
        if req.shed or req.abandoned:
            self.inner.on_finish(req, now)
            return
        sim = self.sim
        decode = sim.servers[d]
        tokens = req.input_len - cached_prefix_tokens(decode, req)
        if sim.link.load == "in-step":       # the decode server's admitting step takes it in
            done = now
        else:                                # both servers' NICs are busy for the transfer, FIFO
            p = req.server
            start = max(now, sim.nic_free[p], sim.nic_free[d])
            done = sim.nic_free[p] = sim.nic_free[d] = start + sim.link.transfer_s(tokens)
        sim.transfers[req.rid] = (now, done - now, tokens)
        req.generated = 0
        req.first_token_t = req.finish_t = -1.0
        req.reset_progress()
        decode.remote_kv[req.rid] = tokens

        def deliver(t: float) -> None:
            if req.abandoned:       # the client left during the transfer
                decode.remote_kv.pop(req.rid, None)
                return
            decode.add(req, t)
            sim.start_server(d, t)

        sim.call_at(done, deliver)

    def on_tick(self, now: float) -> None:
        self.inner.on_tick(now)

    def on_abandon(self, req: SimRequest, now: float) -> None:
        hook = getattr(self.inner, "on_abandon", None)
        if hook is not None:
            hook(req, now)

    def stats(self) -> dict:
        return self.inner.stats() if hasattr(self.inner, "stats") else {}


class PDSimulation(Simulation):
    """A ``Simulation`` whose servers have roles (``prefill``, ``decode``, ``prefill-decode``)."""

    servers: list[PDModelServer]

    def __init__(self, cluster: ClusterConfig, requests: list[SimRequest], router, roles: Sequence[str],
                 link: KVLink, **kw) -> None:
        if len(roles) != len(cluster.servers) or any(r not in ROLES for r in roles):
            raise ValueError(f"roles: one of {', '.join(ROLES)} per server ({len(cluster.servers)})")
        if cluster.lora is not None:
            raise ValueError("P/D simulation does not model LoRA adapters")
        super().__init__(cluster, requests, None, **kw)
        self.router = _Handoff(router, self)
        self.roles = tuple(roles)
        self.link = link
        self.servers = [PDModelServer(i, s, cluster.prefix_caching, r, link)
                        for i, (s, r) in enumerate(zip(cluster.servers, roles))]
        self.scraped = [s.metrics(0.0) for s in self.servers]
        # rid -> (prefill end, seconds until the KV is on the decode server incl. waiting for a NIC, tokens)
        self.transfers: dict[int, tuple[float, float, int]] = {}
        self.nic_free = [0.0] * len(self.servers)   # when each server's link is free again

    def metrics_by_role(self, now: float | None = None) -> dict[str, Metrics]:
        """The scraped metrics (``now`` given: the live ones) summed per role (KV use: the mean)."""
        snap = self.scraped if now is None else [s.metrics(now) for s in self.servers]
        out = {}
        for role in dict.fromkeys(self.roles):
            ms = [m for m, r in zip(snap, self.roles) if r == role]
            out[role] = Metrics(sum(m.kv_cache_usage for m in ms) / len(ms), sum(m.waiting for m in ms),
                                sum(m.running for m in ms), frozenset(), max(m.time for m in ms))
        return out
