"""One simulated vLLM-like model server (one endpoint).

Continuous batching with a per-step token budget and chunked prefill, FCFS waiting queue,
paged KV cache with prefix caching (``kvcache.KVCache``), recompute preemption of the
newest running request when a running request cannot get a page (vLLM V1 behaviour), and
step times from ``stepmodel.ServerSpec`` times the server's step noise (``noise``, a
``realism.StepNoise``; None: exact). The engine drives it: ``plan_step`` chooses the batch and
returns its duration, ``finish_step`` applies it at the step's end time; ``abandon`` drops a
request whose client left (vLLM's abort: queued or running, its slot and KV blocks are free
for the next step).
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

from .adapters import AdapterSlots
from .kvcache import KVCache
from .realism import StepNoise
from .request import SimRequest
from .stepmodel import ServerSpec


class Metrics(NamedTuple):
    """What a real EPP scrapes from vLLM."""

    kv_cache_usage: float
    waiting: int
    running: int
    active_lora: frozenset
    time: float
    waiting_lora: frozenset = frozenset()   # adapters with a queued request (LoRA scenarios)
    max_lora: int = 0


def _prefilling(req: SimRequest) -> bool:
    return req.computed < req.target


class ModelServer:
    def __init__(self, index: int, spec: ServerSpec, prefix_caching: bool = True) -> None:
        self.index = index
        self.spec = spec
        self.bs = spec.block_size
        self.kv = KVCache(spec.num_blocks, spec.block_size, prefix_caching)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.busy_until = -1.0      # end of the step in progress (< now: idle)
        self.busy_time = 0.0
        self.steps = 0
        self.preemptions = 0
        self.prompt_tokens = 0
        self.hit_tokens = 0
        self.lora_counts: dict[str, int] = {}
        self.adapters: AdapterSlots | None = None   # LoRA slots (``adapters``), set by the engine
        self.noise: StepNoise | None = None          # step-time factor (realism), set by the engine
        self._batch: list = []

    # -- queue --------------------------------------------------------------------------
    def add(self, req: SimRequest, now: float) -> None:
        req.server = self.index
        self.waiting.append(req)

    def abandon(self, req: SimRequest) -> bool:
        """Drop ``req`` (its client left): out of the waiting queue, or out of the running batch
        with its pages released (a step in progress completes without it). False if it is not here."""
        if req in self.running:
            self._release(req)
            self.running.remove(req)
            self._lora_dec(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                return False
        return True

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def metrics(self, now: float) -> Metrics:
        active = frozenset(k for k, v in self.lora_counts.items() if v > 0)
        if self.adapters is None:
            return Metrics(self.kv.usage(), len(self.waiting), len(self.running), active, now)
        return Metrics(self.kv.usage(), len(self.waiting), len(self.running), active, now,
                       frozenset(r.lora for r in self.waiting if r.lora), self.adapters.spec.max_loras)

    # -- pages --------------------------------------------------------------------------
    def _release(self, req: SimRequest) -> None:
        kv = self.kv
        kv.free += req.npages - req.seg_pages
        for key in req.held:
            kv.unpin(key)
        req.held = []
        req.npages = req.seg_pages = 0

    def _preempt(self, req: SimRequest) -> None:
        self._release(req)
        self.running.remove(req)
        self._lora_dec(req)
        req.preemptions += 1
        self.preemptions += 1
        req.reset_progress()
        self.waiting.appendleft(req)

    def _lora_dec(self, req: SimRequest) -> None:
        if req.lora:
            self.lora_counts[req.lora] -= 1

    def _admit_match(self, req: SimRequest) -> int:
        """Prefix-cache lookup and pinning for a request leaving the waiting queue."""
        kv, bs = self.kv, self.bs
        segs, fps = req.segments, req.full_pages
        cached = kv.cached
        tok = pages = done = 0
        i = 0
        n = len(segs) if kv.prefix_caching else 0
        held = req.held
        while i < n:
            key, ntok = segs[i]
            c = cached.get(key, 0)
            if c == 0:
                break
            kv.pin(key)
            held.append(key)
            fp = fps[i]
            if c >= fp:
                tok += ntok
                pages += fp
                i += 1
                continue
            tok += c * bs
            pages += c
            done = c
            break
        if tok >= req.target:
            tok = req.target - 1
        req.computed = tok
        req.seg_pages = pages
        req.npages = pages
        req.seg_ptr = i
        req.seg_base = sum(nt for _, nt in segs[:i]) if i else 0
        req.seg_done = done
        return tok

    def _register(self, req: SimRequest) -> None:
        """Turn newly computed full prompt pages into cached segment pages."""
        c = req.computed if req.computed < req.input_len else req.input_len
        segs, fps = req.segments, req.full_pages
        kv, bs = self.kv, self.bs
        cached = kv.cached
        i, base, done = req.seg_ptr, req.seg_base, req.seg_done
        held = req.held
        nseg = len(segs)
        while i < nseg:
            key, ntok = segs[i]
            fp = fps[i]
            now_pages = (c - base) // bs if c > base else 0
            if now_pages > fp:
                now_pages = fp
            if len(held) <= i:
                kv.pin(key)
                held.append(key)
            if now_pages > done:
                cur = cached[key]
                lo = cur if cur > done else done
                if now_pages > lo:
                    cached[key] = cur + (now_pages - lo)
                    req.seg_pages += now_pages - lo
                done = now_pages
            if c < base + ntok:
                break
            i += 1
            base += ntok
            done = 0
        req.seg_ptr, req.seg_base, req.seg_done = i, base, done

    # -- one engine step ------------------------------------------------------------------
    def plan_step(self, now: float) -> float:
        """Choose this step's batch (allocating pages, preempting if needed); return its duration (s)."""
        spec, kv, bs = self.spec, self.kv, self.bs
        budget = spec.max_num_batched_tokens
        batch = []
        n_tokens = n_dec = 0
        ctx_sum = 0.0
        pairs = 0.0
        preempted = False
        running = self.running
        if spec.batching_order != "default":    # stable sorts: admission order within decodes and prompts
            running.sort(key=_prefilling, reverse=spec.batching_order == "prefill-first")
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if req.computed < req.target:
                n = req.target - req.computed
                if n > budget:
                    n = budget
            else:
                n = 1
            need = -(-(req.computed + n) // bs) - req.npages
            self_preempted = False
            while need > 0 and not kv.allocate(need):
                victim = running[-1]
                self._preempt(victim)
                preempted = True
                if victim is req:
                    self_preempted = True
                    break
            if self_preempted:
                break
            if need > 0:
                req.npages += need
            batch.append((req, n))
            budget -= n
            n_tokens += n
            if req.computed < req.target:
                pairs += n * (req.computed + n - n / 2.0)
            else:
                n_dec += 1
                ctx_sum += req.computed
            i += 1
        if not preempted:
            waiting = self.waiting
            slots = self.adapters
            skipped = []
            while waiting and budget > 0 and len(running) < spec.max_num_seqs:
                req = waiting[0]
                if slots is not None and req.lora and not slots.admissible(req.lora, self.lora_counts):
                    skipped.append(waiting.popleft())   # its adapter would exceed max_loras
                    continue
                tok = self._admit_match(req)
                n = req.target - tok
                if n > budget:
                    n = budget
                need = -(-(tok + n) // bs) - req.npages
                if not kv.allocate(need):
                    self._release(req)
                    req.reset_progress()
                    break
                waiting.popleft()
                req.npages += need
                if req.hit_tokens < 0:
                    req.hit_tokens = tok
                    req.admitted_t = now
                    self.prompt_tokens += req.input_len
                    self.hit_tokens += tok
                running.append(req)
                if req.lora:
                    self.lora_counts[req.lora] = self.lora_counts.get(req.lora, 0) + 1
                batch.append((req, n))
                budget -= n
                n_tokens += n
                pairs += n * (tok + n - n / 2.0)
            if skipped:
                waiting.extendleft(reversed(skipped))
        self._batch = batch
        if not batch:
            return 0.0
        dur = spec.step_ms(n_tokens, ctx_sum, n_dec, pairs) / 1000.0
        if self.adapters is not None:
            # batch order, not set order: loads and evictions must not depend on PYTHONHASHSEED
            dur += self.adapters.step_extra_ms(list(dict.fromkeys(r.lora for r, _ in batch if r.lora))) / 1000.0
        if self.noise is not None:
            dur *= self.noise()
        self.busy_time += dur
        self.steps += 1
        return dur

    def finish_step(self, t_end: float, on_first_token, on_finish) -> None:
        """Apply the planned batch at its end time; callbacks get (request, time)."""
        done = []
        for req, n in self._batch:
            if req.abandoned:       # left during the step: its pages are already free
                continue
            if req.computed < req.target:
                req.computed += n
                if req.seg_ptr < len(req.segments):
                    self._register(req)
                if req.computed < req.target:
                    continue
            else:
                req.computed += 1
            req.generated += 1
            if req.first_token_t < 0:
                req.first_token_t = t_end
                if on_first_token is not None:
                    on_first_token(req, t_end)
            if req.generated >= req.output_len:
                done.append(req)
        self._batch = []
        for req in done:
            req.finish_t = t_end
            self._release(req)
            self.running.remove(req)
            self._lora_dec(req)
            if on_finish is not None:
                on_finish(req, t_end)

    # -- oracle support -----------------------------------------------------------------
    def clone(self) -> ModelServer:
        c = ModelServer.__new__(ModelServer)
        c.__dict__.update(self.__dict__)
        c.kv = self.kv.clone()
        m = {id(r): r.clone() for r in (*self.running, *self.waiting)}
        c.running = [m[id(r)] for r in self.running]
        c.waiting = deque(m[id(r)] for r in self.waiting)
        c.lora_counts = dict(self.lora_counts)
        c.adapters = self.adapters.clone() if self.adapters is not None else None
        c.noise = self.noise.expected() if self.noise is not None else None   # no peek at the world's draws
        # a request abandoned during the step in progress is in no queue; the step completes without it
        c._batch = [(m[id(r)], n) for r, n in self._batch if id(r) in m]
        return c

    def decode_stretch(self, t: float, max_steps: int, until_t: float | None = None) -> tuple[float, int]:
        """Oracle support: where every running request decodes and none waits, the steps before
        the first one that finishes a request (at most ``max_steps``, none once the clock is at
        ``until_t``) taken in one go, with the batches, durations, clock and page allocations of
        :meth:`plan_step` and :meth:`finish_step` stepped one at a time (the pages all of them
        take fit: no preemption). The time reached and the steps taken; (``t``, 0) where the
        server is not so, or the stretch would be under two steps."""
        running = self.running
        if self.waiting or self._batch or self.adapters is not None or not running:
            return t, 0
        spec, bs = self.spec, self.bs
        n = len(running)
        k_max = max_steps
        ctx = need = 0
        for r in running:
            if r.computed < r.target or r.abandoned:
                return t, 0
            left = r.output_len - r.generated - 1    # its last token finishes it: a step of its own
            if left < k_max:
                k_max = left
            ctx += r.computed
        if k_max < 2 or n > spec.max_num_batched_tokens:
            return t, 0
        for r in running:
            more = -(-(r.computed + k_max) // bs) - r.npages
            if more > 0:
                need += more
        if need > self.kv.available():
            return t, 0
        noise = self.noise
        k = 0
        while k < k_max and (until_t is None or t < until_t):
            dur = spec.step_ms(n, float(ctx), n, 0.0) / 1000.0
            if noise is not None:
                dur *= noise()
            self.busy_time += dur
            t += dur
            ctx += n
            k += 1
        if k == 0:
            return t, 0
        need = 0
        for r in running:
            r.computed += k
            r.generated += k
            more = -(-r.computed // bs) - r.npages
            if more > 0:
                need += more
                r.npages += more
        self.kv.allocate(need)
        self.steps += k
        return t, k
