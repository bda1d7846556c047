"""The simulator's side of the request lifecycle: one driver for every routing policy.

The engine calls a router at each arrival (``route``), dispatch, first token and end of
a request (``engine.Router``). :class:`LifecycleRouter` turns those events into the
calls of :mod:`epp_client.framework.lifecycle` on a policy, with simulated time, exactly as the
gateway does with real time: ``schedule`` at arrival (candidates carry the *scraped*
metrics and, for prefix-aware policies, the approximate prefix producer's match; the
policy adds its own in-flight counters), ``pre_request`` at dispatch, ``on_first_chunk``
at the first token, ``on_complete`` at the end. A request the policy holds (a filter's
``HoldRequest``: ``res.held``) is kept and scheduled again at its due time, from the engine's
wake-ups (``on_wake``), with the time held in ``waited_ms``, as the gateway does on its event
loop; a held request whose client leaves (``on_abandon``) is dropped. The policy is told the
prompt length the gateway would estimate (``SimRequest.est_input_len``), not the true one. The policy is an epp_client
``Scheduler`` (``epp_routers``) or a heuristic (``routers``: random, round-robin,
least-queue, oracle; ``lora_v1``).
"""
from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from epp_client import Endpoint, EndpointMetrics, InferenceRequest
from epp_client.plugins.handler.opt_in import HANDLER_TYPE as OPT_IN_HANDLER
from epp_client.plugins.handler.opt_in import OPT_IN_HEADER
from epp_client.plugins.producer.approx_prefix import ApproxPrefixProducer
from gateway.prompt import BYTES_PER_TOKEN

from .engine import DEFERRED
from .request import SimRequest
from .workloads import SEG

if TYPE_CHECKING:
    from .engine import Simulation

#: Simulated wall clock origin for training-entry timestamps (deterministic).
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z
#: The approximate prefix producer's default block: 64 tokens (B4.1).
PREFIX_BLOCK = 64
#: Without a configured producer the simulator matches whole prompts (no block cap; the
#: Mooncake synthetic trace has prompts past the gateway's 2048 x 64 tokens).
UNCAPPED = 2**31 - 1
#: Without a configured producer, the index keeps llm-d's fixed ``lruCapacityPerServer`` (31,250
#: entries, what llm-d's autoTune also gives on the 500,000-token servers of ``standard``), so
#: the llm-d policies' figures and the recorded traces do not depend on the index's sizing.
DEFAULT_INDEX_AUTO_TUNE = False


class BaseRouter:
    """The engine's router interface with no-op hooks; ``self.sim`` is set by ``bind``."""

    name = "base"
    tick_interval_s = 0.0

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.sim: Simulation | None = None

    def bind(self, sim) -> None:
        self.sim = sim

    def route(self, req: SimRequest, now: float) -> int | None:
        raise NotImplementedError

    def on_dispatch(self, req: SimRequest, idx: int, now: float) -> None:
        pass

    def on_first_token(self, req: SimRequest, now: float) -> None:
        pass

    def on_finish(self, req: SimRequest, now: float) -> None:
        pass

    def on_tick(self, now: float) -> None:
        pass

    def on_wake(self, now: float) -> None:
        pass

    def on_abandon(self, req: SimRequest, now: float) -> None:
        """The client of ``req``, not dispatched yet (held by this router), left at its deadline."""

    def stats(self) -> dict:
        return {}


#: ``factory(rng, clock, wall_clock) -> policy``; ``rng`` is the router's seeded generator.
PolicyFactory = Callable[[random.Random, Callable[[], float], Callable[[], float]], Any]


def doc_note(cls: type) -> str:
    """The first paragraph of a class's docstring on one line (a policy's note in reports)."""
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())


def prompt_hashes(req: SimRequest, block: int) -> list:
    """Block identities of the prompt as the gateway hashes it: with the segments' bytes
    (``req.seg_bytes``, realism), :func:`byte_block_hashes` over blocks of ``block`` tokens'
    worth of bytes; with exact counts, ``SEG // block`` per full segment. A partial segment
    contributes its full blocks and ends the chain."""
    if req.seg_bytes is not None:
        return byte_block_hashes(req.segments, req.seg_bytes, block * BYTES_PER_TOKEN)
    out: list = []
    per = SEG // block
    for key, n in req.segments:
        full = n // block if n < SEG else per
        out.extend((key, j) for j in range(full))
        if n < SEG:
            break
    return out


def byte_block_hashes(segments: tuple, seg_bytes: tuple[int, ...], size: int) -> list:
    """The identities of a prompt's full blocks of ``size`` bytes (``gateway.prompt.block_hashes``
    cuts the prompt's UTF-8 bytes so): a block is named by the segment its last byte falls in and
    that byte's offset there. Segment keys name their prefix chain, so two prompts sharing the
    segments up to a block give it the same identity. The chain ends after a partial segment,
    as in :func:`prompt_hashes`."""
    out: list = []
    start = 0          # bytes before the segment
    end = size         # the end of the next block, in bytes from the prompt's start
    for (key, n), nb in zip(segments, seg_bytes):
        stop = start + nb
        while end <= stop:
            out.append((key, end - start))
            end += size
        start = stop
        if n < SEG:
            break
    return out


def opt_in_draw(seed: int, rid: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, request id): a request is opted in to
    prediction when it is below the share, so the opted-in set grows with the share and
    does not depend on the policy or on the order of events."""
    digest = hashlib.blake2b(f"{seed}:{rid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


class LifecycleRouter(BaseRouter):
    """Drives a request-lifecycle policy. ``prefix``: match prompts with the approximate
    prefix producer (the scheduler's configured one, else the default 64-token one).
    ``opt_in_share``: the share of requests sent with ``x-prediction-based-scheduling:
    true`` (:func:`opt_in_draw`); None sends the header with none."""

    def __init__(self, name: str, factory: PolicyFactory, seed: int = 0, learner=None, sink=None,
                 description: str = "", prefix: bool = False, opt_in_share: float | None = None) -> None:
        super().__init__(seed)
        self.seed = seed
        self.opt_in_share = opt_in_share
        self.name = name
        self.description = description
        self._factory = factory
        self.learner = learner
        self.sink = sink
        self.use_prefix = prefix
        self.lifecycle: Any = None
        self.prefix: ApproxPrefixProducer | None = None
        self.endpoints: list[Endpoint] = []
        self.by_name: dict[str, int] = {}
        self.current: SimRequest | None = None   # the request being scheduled (for the oracle)
        self._streamed: dict[int, int] = {}        # request id -> tokens reported to the policy so far
        self.streamed_tokens = 0                   # tokens reported after first chunks (on_chunk)
        self._held: list = []                      # heap of (due time, request id, request) held by a filter
        self._held_since: dict[int, float] = {}    # request id -> when it was first held
        self._held_hashes: dict[int, list] = {}    # request id -> its prompt's block hashes, while it is held
        self.holds = 0                             # scheduling attempts answered with a hold
        self.held_requests = 0                     # requests held at least once
        self.held_max_ms = 0.0                     # the longest a filter held a request before placing or shedding it
        self.tick_interval_s = learner.tick_interval_s if learner is not None else 0.0

    def bind(self, sim) -> None:
        super().bind(sim)
        clock = lambda: sim.now  # noqa: E731
        wall = lambda: EPOCH + sim.now  # noqa: E731
        self.lifecycle = self._factory(self.rng, clock, wall)
        if callable(getattr(self.lifecycle, "bind", None)):
            self.lifecycle.bind(sim, self)
        if self.use_prefix:
            self.prefix = (getattr(self.lifecycle, "prefix_producer", None)
                           or ApproxPrefixProducer(PREFIX_BLOCK, max_prefix_blocks=UNCAPPED,
                                                   auto_tune=DEFAULT_INDEX_AUTO_TUNE))
            if SEG % self.prefix.block_size_tokens:
                raise ValueError(f"approx-prefix-cache-producer: blockSizeTokens must divide the simulator's "
                                 f"{SEG}-token prefix segments, got {self.prefix.block_size_tokens}")
        self.endpoints = [Endpoint(name=f"sim-{i}", address="127.0.0.1", port=8000 + i)
                          for i in range(len(sim.servers))]
        self.by_name = {e.name: i for i, e in enumerate(self.endpoints)}
        if self.learner is not None:
            self.learner.bind(clock)

    def route(self, req: SimRequest, now: float):
        if self.sim is None:
            raise RuntimeError(f"router {self.name!r}: route() before bind()")
        scraped = self.sim.scraped
        eps = self.endpoints
        servers = self.sim.servers
        for i, e in enumerate(eps):
            m = scraped[i]
            spec = servers[i].spec    # vllm:cache_config_info: the engine's KV blocks, as configured
            e.metrics = EndpointMetrics(m.kv_cache_usage, m.waiting, m.running, m.active_lora, m.waiting_lora,
                                        m.max_lora, spec.num_blocks, spec.block_size)
            e.inflight = None
        hashes = None
        if self.prefix is not None:
            bs = self.prefix.block_size_tokens
            total = -(-req.est_input_len // bs)   # the gateway hashes the blocks of its estimate's bytes
            hashes = self._held_hashes.pop(req.rid, None)   # a held request's, hashed when first scheduled
            if hashes is None:
                hashes = prompt_hashes(req, bs)[:min(self.prefix.max_prefix_blocks, total)]
            self.prefix.produce(hashes, eps, total_blocks=total)
        headers = {"x-request-id": str(req.rid)}
        if req.ttft_slo_ms > 0:
            headers["x-llm-d-slo-ttft-ms"] = f"{req.ttft_slo_ms:.3f}"
        if req.tpot_slo_ms > 0:
            headers["x-llm-d-slo-tpot-ms"] = f"{req.tpot_slo_ms:.3f}"
        if self.opt_in_share is not None and opt_in_draw(self.seed, req.rid) < self.opt_in_share:
            headers[OPT_IN_HEADER] = "true"
        held_since = self._held_since.get(req.rid)
        ireq = InferenceRequest(request_id=str(req.rid), headers=headers, priority=req.priority,
                                input_tokens=req.est_input_len, target_model=req.lora, streaming=True,
                                waited_ms=(now - held_since) * 1000.0 if held_since is not None else 0.0)
        if getattr(self.lifecycle, "producer", None) is not None:
            self._stream_tokens(now)
        self.current = req
        try:
            res = self.lifecycle.schedule(ireq, eps, now=now)
        finally:
            self.current = None
        if res.held:        # a filter holds it: schedule it again later (on_wake)
            if hashes is not None:
                self._held_hashes[req.rid] = hashes
            self._hold(req, now, res.retry_after_s)
            return DEFERRED
        since = self._held_since.pop(req.rid, None)
        if since is not None:
            self.held_max_ms = max(self.held_max_ms, (now - since) * 1000.0)
        if not res.ok:
            return None
        req.ctx = (ireq, res, hashes)
        return self.by_name[res.endpoint.name]

    def _hold(self, req: SimRequest, now: float, after_s: float) -> None:
        assert self.sim is not None
        if req.rid not in self._held_since:
            self._held_since[req.rid] = now
            self.held_requests += 1
        due = now + after_s
        heapq.heappush(self._held, (due, req.rid, req))
        self.holds += 1
        self.sim.wake(due)

    def on_wake(self, now: float) -> None:
        """Schedule again the held requests that are due, earliest arrival first."""
        held, sim = self._held, self.sim
        due = []
        while held and held[0][0] <= now:
            due.append(heapq.heappop(held)[2])
        if sim is None:
            return
        for req in sorted(due, key=lambda r: (r.arrival, r.rid)):
            if req.abandoned:       # its client left while held (on_abandon)
                continue
            idx = self.route(req, now)
            if idx is None:
                req.shed = True
            elif idx != DEFERRED:
                sim.dispatch(req, idx, now)

    def _stream_tokens(self, now: float) -> None:
        """Report the tokens every running request generated since the last report (``on_chunk``),
        as a gateway does chunk by chunk; done lazily, when a decision is about to read them."""
        assert self.sim is not None
        streamed = self._streamed
        for srv in self.sim.servers:
            for r in srv.running:
                if r.ctx is None or r.first_token_t < 0:
                    continue
                seen = streamed.get(r.rid, 1)   # the first chunk carried one token
                if r.generated > seen:
                    self.lifecycle.on_chunk(str(r.rid), now=now, tokens=r.generated - seen)
                    self.streamed_tokens += r.generated - seen
                    streamed[r.rid] = r.generated

    def on_dispatch(self, req: SimRequest, idx: int, now: float) -> None:
        if req.ctx is None:
            return
        ireq, res, hashes = req.ctx
        self.lifecycle.pre_request(ireq, res, now=now)
        if hashes is not None:
            assert self.prefix is not None   # route() computes hashes only with a prefix producer
            self.prefix.record(self.endpoints[idx].name, hashes)

    def on_first_token(self, req: SimRequest, now: float) -> None:
        if req.ctx is not None:
            self.lifecycle.on_first_chunk(str(req.rid), now=now, tokens=1)

    def on_finish(self, req: SimRequest, now: float) -> None:
        self._streamed.pop(req.rid, None)
        if req.ctx is None:
            return
        if req.shed:
            self.lifecycle.on_complete(str(req.rid), now=now, status=503, aborted=True)
        elif req.abandoned:     # the client left (499: closed by the client), as the gateway reports it
            self.lifecycle.on_complete(str(req.rid), now=now, status=499, aborted=True,
                                       output_tokens=req.generated or None)
        else:
            self.lifecycle.on_complete(str(req.rid), now=now, output_tokens=req.output_len,
                                       prompt_tokens=req.input_len)    # the response's usage
        req.ctx = None

    def on_abandon(self, req: SimRequest, now: float) -> None:
        """The client of a request this router holds left: forget it (``on_wake`` skips it)."""
        self._held_since.pop(req.rid, None)
        self._held_hashes.pop(req.rid, None)

    def on_tick(self, now: float) -> None:
        if self.learner is not None:
            self.learner.tick(now)

    def stats(self) -> dict:
        out: dict = {}
        stats = getattr(self.lifecycle, "stats", None)
        if callable(stats):
            out.update(stats())
        producer = getattr(self.lifecycle, "producer", None)
        if producer is not None:
            c = producer.counters
            out.update({"predictions": c.get("predictions", 0), "prediction_failures": c.get("prediction_failures", 0),
                        "training_entries": self.sink.entries if self.sink is not None else 0,
                        "streamed_tokens": self.streamed_tokens})
            if self.sink is not None:
                out.update(self.sink.accuracy())
        handler: Any = getattr(self.lifecycle, "profile_handler", None)
        if getattr(handler, "TYPE", None) == OPT_IN_HANDLER:   # requests per route: predicted, heuristic, warm-up
            routes = {"predicted": 0, "heuristic": 0, "warm-up": 0}
            for (_, decision), n in handler.decisions.items():
                routes[decision] = routes.get(decision, 0) + n
            out.update({f"routed_{d.replace('-', '_')}": n for d, n in routes.items()})
        if self.holds:
            out["holds"] = self.holds
            out["held_requests"] = self.held_requests
            out["held_max_ms"] = self.held_max_ms
        if self.learner is not None:
            out.update(self.learner.stats())
        return out

    def close(self) -> None:
        if self.learner is not None:
            self.learner.close()
