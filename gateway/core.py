"""The gateway as a plain object (state, routing, proxying) and its ASGI entry point.

One request: read the body (bounded), validate the fields the gateway needs (4xx naming
the field otherwise), estimate the prompt's tokens and prefix blocks, match them against
every endpoint's prefix LRU, ask the router, then try the chosen endpoints in order until
one sends its first body byte (connection errors, first-byte timeouts and 5xx before any
byte move on to the next; nothing is retried once a byte reached the client). The body
is forwarded chunk by chunk as it arrives; a client disconnect cancels the upstream
request; the router is told of the dispatch, the first token and the outcome.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from dataclasses import asdict, dataclass

import httpx
import orjson

from .metrics import GatewayMetrics
from .downstream import ClientWatch, Disconnected, TooLarge, read_body
from .prefix import PrefixIndex
from .prompt import BodyError, block_hashes, extract_prompt, slo_header
from .router import BuiltinRouter, Candidate, Decision, Outcome, RequestInfo, Router
from .scrape import EndpointState, Scraper
from .settings import GatewaySettings
from .sse import BodyObserver, StreamObserver

log = logging.getLogger("gateway")

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailers", "transfer-encoding", "upgrade", "host", "content-length"}
ROUTES = {"/v1/completions": False, "/v1/chat/completions": True}


class MidStreamFailure(Exception):
    """The upstream failed after bytes reached the client: never retried; the client's
    response is cut (no terminating chunk) so it cannot mistake it for a full answer."""


class UpstreamFailed(Exception):
    def __init__(self, stage: str, detail: str) -> None:
        self.stage = stage
        super().__init__(f"{stage}: {detail}")


@dataclass
class RequestRecord:
    """One finished request (for the harness and /gateway/requests)."""

    request_id: str
    endpoint: str
    status: int
    ok: bool
    streaming: bool
    input_tokens: int
    prefix_match_blocks: int
    prefix_total_blocks: int
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    tokens: int
    predicted_ttft_ms: float | None
    predicted_tpot_ms: float | None
    model_version: str
    fallback: bool
    attempts: int
    ttft_slo_ms: float
    tpot_slo_ms: float
    finished_at: float


class Gateway:
    def __init__(self, settings: GatewaySettings, router: Router | None = None) -> None:
        self.settings = settings
        self.endpoints = [EndpointState(name=f"ep{i}-{u.split('://', 1)[-1]}", url=u)
                          for i, u in enumerate(settings.endpoints)]
        self.prefix = PrefixIndex(settings.block_size_tokens, settings.lru_capacity_per_endpoint)
        self.router: Router = router or BuiltinRouter()
        self.fallback_router = BuiltinRouter()
        self.metrics = GatewayMetrics(self)
        self.records: collections.deque[RequestRecord] = collections.deque(maxlen=settings.record_capacity)
        self.record_seq = 0
        self.client: httpx.AsyncClient | None = None
        self.scraper: Scraper | None = None
        self._sem: asyncio.Semaphore | None = None

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=s.connect_timeout_s, read=s.idle_timeout_s,
                                  write=s.idle_timeout_s, pool=s.connect_timeout_s),
            limits=httpx.Limits(max_connections=s.max_concurrency + 64,
                                max_keepalive_connections=64),
        )
        self._sem = asyncio.Semaphore(s.max_concurrency)
        self.scraper = Scraper(self.endpoints, self.client, s.scrape_interval_s, s.scrape_timeout_s)
        await self.scraper.scrape_all()
        self.scraper.start()

    async def stop(self) -> None:
        if self.scraper:
            await self.scraper.stop()
        try:
            await self.router.aclose()
        finally:
            if self.client:
                await self.client.aclose()

    # ---- helpers ---------------------------------------------------------------------
    def request_info(self, path: str, headers: dict[str, str], body: dict, chat: bool):
        p = extract_prompt(body, chat)
        rid = headers.get("x-request-id") or str(uuid.uuid4())
        headers["x-request-id"] = rid
        prio = 0
        obj = headers.get("x-llm-d-inference-objective") or headers.get("x-gateway-inference-objective")
        if obj:
            prio = self.settings.objectives.get(obj, 0)
        if "x-llm-d-priority" in headers:
            try:
                prio = int(headers["x-llm-d-priority"])
            except ValueError:
                raise BodyError("header.x-llm-d-priority", "must be an integer") from None
        info = RequestInfo(request_id=rid, headers=headers, priority=prio,
                           input_tokens=p.input_tokens, model=p.model, streaming=p.streaming,
                           max_tokens=p.max_tokens, path=path)
        hashes = block_hashes(p.text, self.settings.block_size_tokens, self.settings.max_prefix_blocks)
        return info, hashes

    def candidates(self, hashes: list[int]) -> list[Candidate]:
        now = time.monotonic()
        eps = [e for e in self.endpoints if e.healthy(now)] or list(self.endpoints)
        return [Candidate(e, self.prefix.match(e.name, hashes)) for e in eps]

    async def decide(self, info: RequestInfo, cands: list[Candidate]) -> Decision:
        try:
            d = await self.router.schedule(info, cands)
        except Exception as e:  # noqa: BLE001 - routing must never block or fail a request
            log.warning("router %s failed, falling back: %s", getattr(self.router, "name", "?"), e)
            self.metrics.fallbacks.labels(reason="router-error").inc()
            return await self.fallback_router.schedule(info, cands)
        if d.fallback:
            self.metrics.fallbacks.labels(reason="no-predictions").inc()
        if d.admitted:
            # the router's picks first, then the others as retry candidates
            names = {c.state.name for c in d.order}
            d.order = d.order + self.fallback_router.rank([c for c in cands if c.state.name not in names])
        return d

    def _hook(self, name: str, *args) -> None:
        """Router lifecycle hooks never break a request: errors are logged and counted."""
        try:
            getattr(self.router, name)(*args)
        except Exception:  # noqa: BLE001
            log.warning("router hook %s failed", name, exc_info=True)
            self.metrics.fallbacks.labels(reason="hook-error").inc()

    # ---- the request path ------------------------------------------------------------
    async def handle(self, scope, receive, send) -> None:
        path = scope["path"]
        chat = ROUTES[path]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            raw = await read_body(receive, self.settings.max_body_bytes)
        except TooLarge:
            return await self._error(send, 413, "body", f"larger than {self.settings.max_body_bytes} bytes", path)
        except Disconnected:
            self.metrics.disconnects.labels(stage="request").inc()
            return
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            return await self._error(send, 400, "body", f"not valid JSON: {e}", path)
        try:
            info, hashes = self.request_info(path, headers, body, chat)
        except BodyError as e:
            return await self._json(send, 400, e.to_json(), path)
        assert self._sem is not None
        if self._sem.locked():
            self.metrics.requests.labels(path=path, status="429").inc()
            return await self._json(send, 429, {"error": {"message": "gateway saturated",
                                                          "type": "rate_limit"}}, path,
                                    extra=[(b"retry-after", b"1")])
        async with self._sem:
            client = ClientWatch(receive, send)
            try:
                await asyncio.wait_for(self._route_and_proxy(client.send, info, hashes, raw),
                                       self.settings.request_timeout_s)
            except asyncio.CancelledError:
                if not client.gone:
                    raise
                asyncio.current_task().uncancel()
                self.metrics.disconnects.labels(stage="response").inc()
            except MidStreamFailure as e:
                log.info("upstream failed mid-stream, response cut: %s", e)
                return  # returning before the final body message closes the client connection
            except asyncio.TimeoutError:
                self.metrics.upstream_errors.labels(endpoint="*", stage="request-timeout").inc()
                if client.started:
                    raise  # the client sees a truncated body, never a silent success
                await self._error(send, 504, "upstream", "request timeout", path)
            finally:
                client.close()

    async def _route_and_proxy(self, send, info: RequestInfo, hashes: list[int], raw: bytes) -> None:
        path = info.path
        cands = self.candidates(hashes)
        decision = await self.decide(info, cands)
        if not decision.admitted:
            self.metrics.admission_denied.labels(reason=decision.reason or "denied").inc()
            return await self._json(send, decision.status or 429, {"error": {
                "message": f"request cannot be admitted: {decision.reason}", "type": "admission_denied",
                "code": "rejected"}}, path, extra=[(b"x-llm-d-request-dropped-reason",
                                                   (decision.reason or "denied").encode()[:200])])
        order = decision.order[: self.settings.max_attempts]
        last_err = "no endpoint"
        for attempt, cand in enumerate(order, 1):
            try:
                return await self._attempt(send, info, hashes, raw, decision, cand, attempt)
            except UpstreamFailed as e:
                last_err = f"{cand.state.url}: {e}"
                self.metrics.upstream_errors.labels(endpoint=cand.state.name, stage=e.stage).inc()
                if attempt < len(order):
                    self.metrics.retries.labels(endpoint=cand.state.name).inc()
                log.info("attempt %d on %s failed before first byte: %s", attempt, cand.state.url, e)
        await self._error(send, 502, "upstream", f"all endpoints failed before the first byte ({last_err})", path)

    async def _attempt(self, send, info, hashes, raw, decision: Decision, cand: Candidate, attempt: int):
        ep = cand.state
        assert self.client is not None
        fwd = [(k, v) for k, v in info.headers.items() if k not in HOP_BY_HOP]
        fwd.append(("x-gateway-destination-endpoint", ep.host_port))
        req = self.client.build_request("POST", ep.url + info.path, content=raw, headers=fwd)
        match = self.prefix.record(ep.name, hashes)
        uncached = max(0, info.input_tokens - match.match_blocks * match.block_size_tokens)
        ep.inflight_requests += 1
        ep.inflight_tokens += uncached
        tokens_released = False
        t0 = time.monotonic()
        self._hook("on_dispatch", decision, cand, info, t0)
        resp: httpx.Response | None = None
        started = False
        outcome_ok = False
        status = 0
        obs = StreamObserver() if info.streaming else None
        bobs = BodyObserver() if not info.streaming else None
        t_first: float | None = None
        finished = False
        try:
            # ---- before the first byte: failures here are retried elsewhere ----
            try:
                resp = await asyncio.wait_for(self.client.send(req, stream=True),
                                              self.settings.first_byte_timeout_s)
                status = resp.status_code
                if status >= 500:
                    raise UpstreamFailed("status", f"HTTP {status}")
                it = resp.aiter_raw()
                first = await asyncio.wait_for(_first_nonempty(it),
                                               max(0.001, self.settings.first_byte_timeout_s - (time.monotonic() - t0)))
            except UpstreamFailed:
                ep.dispatch_failures += 1
                raise
            except (httpx.HTTPError, asyncio.TimeoutError, OSError) as e:
                ep.dispatch_failures += 1
                raise UpstreamFailed("connect" if resp is None else "first-byte",
                                     type(e).__name__ + (f" {e}" if str(e) else "")) from None
            if first is None and status < 400:
                ep.dispatch_failures += 1
                raise UpstreamFailed("first-byte", "closed without a body")
            ep.dispatch_failures = 0
            self.metrics.decisions.labels(endpoint=ep.name).inc()
            hdrs = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.items()
                    if k.lower() not in HOP_BY_HOP]
            hdrs.append((b"x-gateway-destination-endpoint", ep.host_port.encode()))
            hdrs.append((b"x-request-id", info.request_id.encode()))
            await send({"type": "http.response.start", "status": status, "headers": hdrs})
            started = True
            chunk = first or b""
            # ---- after the first byte: forward as it comes, never retried ----
            while True:
                if chunk:
                    if obs is not None:
                        if obs.feed(chunk) and t_first is None:
                            t_first = time.monotonic()
                            if not tokens_released:
                                ep.inflight_tokens = max(0, ep.inflight_tokens - uncached)
                                tokens_released = True
                            if status < 300:
                                self._hook("on_first_chunk", decision, cand, info, t_first)
                    elif bobs is not None:
                        bobs.feed(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    break
                except httpx.HTTPError as e:
                    self.metrics.upstream_errors.labels(endpoint=ep.name, stage="mid-stream").inc()
                    raise MidStreamFailure(f"{ep.url}: {type(e).__name__}") from None
            # upstream finished: account the request before the client sees the end of it
            t_end = time.monotonic()
            outcome_ok = 200 <= status < 300 and not (obs is not None and obs.error_event)
            finished = True
            self._release(ep, uncached, tokens_released)
            self._finish(info, decision, cand, status, outcome_ok, obs, bobs, t0, t_first, t_end, attempt, match)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if resp is not None:
                await _aclose_quietly(resp)
            if not finished:  # failed, timed out or cancelled: no sample, a failed outcome
                t_end = time.monotonic()
                self._release(ep, uncached, tokens_released)
                if started:
                    self._finish(info, decision, cand, status, False, obs, bobs, t0, t_first, t_end, attempt, match)
                else:
                    self._hook("on_complete", decision, cand, info, Outcome(False, status, None, None, 0, 0), t_end)
        return None

    @staticmethod
    def _release(ep: EndpointState, uncached: int, tokens_released: bool) -> None:
        ep.inflight_requests = max(0, ep.inflight_requests - 1)
        if not tokens_released:
            ep.inflight_tokens = max(0, ep.inflight_tokens - uncached)

    def _finish(self, info, decision, cand, status, ok, obs, bobs, t0, t_first, t_end, attempt, match) -> None:
        e2e = (t_end - t0) * 1000.0
        if obs is not None:
            tokens, chunks = obs.tokens, obs.content_events
            ttft = (t_first - t0) * 1000.0 if t_first is not None else None
        else:
            tokens = bobs.tokens or 0
            chunks = 1
            ttft = e2e  # E2E mode: the whole reply is the "first token"
        tpot = None
        if ttft is not None and obs is not None and tokens > 1:
            tpot = (e2e - ttft) / (tokens - 1)
        if ok and ttft is None:
            ok = False  # a stream that never produced a token trains nothing
        self._hook("on_complete", decision, cand, info, Outcome(ok, status, ttft, e2e, tokens, chunks), t_end)
        self.metrics.observe(info, cand, status, ok, ttft, tpot, e2e)
        pred = decision.predicted.get(cand.state.name)
        self.record_seq += 1
        self.records.append(RequestRecord(
            request_id=info.request_id, endpoint=cand.state.name, status=status, ok=ok,
            streaming=info.streaming, input_tokens=info.input_tokens,
            prefix_match_blocks=match.match_blocks, prefix_total_blocks=match.total_blocks,
            ttft_ms=ttft, tpot_ms=tpot, e2e_ms=e2e, tokens=tokens,
            predicted_ttft_ms=pred[0] if pred else None, predicted_tpot_ms=pred[1] if pred else None,
            model_version=decision.model_version, fallback=decision.fallback, attempts=attempt,
            ttft_slo_ms=slo_header(info.headers, "x-llm-d-slo-ttft-ms", "x-slo-ttft-ms"),
            tpot_slo_ms=slo_header(info.headers, "x-llm-d-slo-tpot-ms", "x-slo-tpot-ms"),
            finished_at=time.time()))

    # ---- small responses -------------------------------------------------------------
    async def _json(self, send, status: int, obj: dict, path: str, extra=()) -> None:
        body = orjson.dumps(obj)
        self.metrics.requests.labels(path=path, status=str(status)).inc()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), *extra]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _error(self, send, status: int, field: str, msg: str, path: str) -> None:
        await self._json(send, status, {"error": {"message": f"{field}: {msg}", "type": "gateway_error",
                                                  "param": field},
                                        "detail": [{"loc": [field], "msg": msg, "type": "value_error"}]}, path)

    def records_since(self, since: int) -> dict:
        recs = list(self.records)
        first_seq = self.record_seq - len(recs)
        start = max(0, since - first_seq)
        return {"next": self.record_seq, "records": [asdict(r) for r in recs[start:]]}


async def _first_nonempty(it) -> bytes | None:
    async for chunk in it:
        if chunk:
            return chunk
    return None


async def _aclose_quietly(resp: httpx.Response) -> None:
    try:
        await asyncio.shield(resp.aclose())
    except BaseException:  # noqa: BLE001 - closing is best effort
        pass
