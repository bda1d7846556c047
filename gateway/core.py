"""The gateway as a plain object (state, routing, proxying) and its ASGI entry point.

One request: read the body (bounded), validate the fields the gateway needs (4xx naming
the field otherwise), estimate the prompt's tokens and prefix blocks, match them against
every endpoint's prefix LRU, ask the routing policy, then try the chosen endpoints in order until
one sends its first body byte (connection errors, first-byte timeouts and 5xx before any
byte move on to the next; nothing is retried once a byte reached the client). The body
is forwarded chunk by chunk as it arrives; a client disconnect cancels the upstream
request; the policy's request lifecycle is driven through the dispatch of each attempt,
the first token and the outcome (``routing.Driver``).
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

from epp_client.heuristics import LeastLoadScheduler
from epp_client.inflight import InFlightTracker
from epp_client.lifecycle import RequestLifecycle
from epp_client.plugins.prefix import ApproxPrefixProducer
from epp_client.types import Endpoint, InferenceRequest

from .downstream import ClientWatch, Disconnected, TooLarge, read_body
from .metrics import GatewayMetrics
from .prompt import BodyError, block_hashes, extract_prompt
from .routing import Driver, Outcome, Routing, to_endpoint
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
    decision: str              # the profile handler's: predicted / heuristic / warm-up (opt-in), P/D type
    attempts: int
    ttft_slo_ms: float
    tpot_slo_ms: float
    finished_at: float


class Gateway:
    def __init__(self, settings: GatewaySettings, router: RequestLifecycle | None = None) -> None:
        self.settings = settings
        self.endpoints = [EndpointState(name=f"ep{i}-{u.split('://', 1)[-1]}", url=u)
                          for i, u in enumerate(settings.endpoints)]
        self.by_name = {e.name: e for e in self.endpoints}
        self.router: RequestLifecycle = router if router is not None else LeastLoadScheduler()
        # the config's approx-prefix-cache-producer, else one with the gateway's settings
        self.prefix: ApproxPrefixProducer = getattr(self.router, "prefix_producer", None) or ApproxPrefixProducer(
            settings.block_size_tokens, settings.max_prefix_blocks, settings.lru_capacity_per_endpoint)
        inflight = self.router.inflight
        if inflight is None:
            raise ValueError("the gateway's routing policy needs an in-flight tracker")
        self.inflight: InFlightTracker = inflight
        bind = getattr(self.router, "bind_endpoints", None)
        if bind is not None:   # flow control reads the scraped state of the candidates
            bind(self.endpoints)
        self.metrics = GatewayMetrics(self)
        self.driver = Driver(self.router, self.metrics)
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
            await self.driver.aclose()
        finally:
            if self.client:
                await self.client.aclose()

    # ---- helpers ---------------------------------------------------------------------
    def request_info(self, headers: dict[str, str], body: dict, chat: bool) -> tuple[InferenceRequest, list[int]]:
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
        info = InferenceRequest(request_id=rid, headers=headers, priority=prio, input_tokens=p.input_tokens,
                                target_model=p.model, streaming=p.streaming, max_tokens=p.max_tokens)
        hashes = block_hashes(p.text, self.prefix.block_size_tokens, self.prefix.max_prefix_blocks)
        return info, hashes

    def candidates(self, hashes: list[int]) -> list[Endpoint]:
        """The healthy endpoints (all when none is), with their prefix match."""
        now = time.monotonic()
        eps = [to_endpoint(e) for e in self.endpoints if e.healthy(now)] or [to_endpoint(e) for e in self.endpoints]
        self.prefix.produce(hashes, eps)
        return eps

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
            info, hashes = self.request_info(headers, body, chat)
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
                await asyncio.wait_for(self._route_and_proxy(client.send, path, info, hashes, raw),
                                       self.settings.request_timeout_s)
            except asyncio.CancelledError:
                if not client.gone:
                    raise
                client.task.uncancel()  # the current task: the watch's own cancellation, consumed
                self.metrics.disconnects.labels(stage="response").inc()
            except MidStreamFailure as e:
                log.info("upstream failed mid-stream, response cut: %s", e)
                return  # returning before the final body message closes the client connection
            except TimeoutError:
                self.metrics.upstream_errors.labels(endpoint="*", stage="request-timeout").inc()
                if client.started:
                    raise  # the client sees a truncated body, never a silent success
                await self._error(send, 504, "upstream", "request timeout", path)
            finally:
                client.close()

    async def _decide(self, info: InferenceRequest, hashes: list[int]) -> Routing:
        """The policy's decision. A held request (a filter's hold: ``decode-harm-filter`` with
        ``holdSlackMs``) waits ``retry_after_s`` and is scheduled again on fresh candidates, with
        the time held so far in ``info.waited_ms``; the request timeout bounds it."""
        held_at = None
        while True:
            decision = await self.driver.decide(info, self.candidates(hashes))
            wait = decision.result.retry_after_s
            if wait <= 0:
                return decision
            if held_at is None:
                held_at = time.monotonic()
                self.metrics.held.inc()
            await asyncio.sleep(wait)
            info.waited_ms = (time.monotonic() - held_at) * 1000.0

    async def _route_and_proxy(self, send, path: str, info: InferenceRequest, hashes: list[int], raw: bytes) -> None:
        decision = await self._decide(info, hashes)
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
                return await self._attempt(send, path, info, hashes, raw, decision, cand, attempt)
            except UpstreamFailed as e:
                url = self.by_name[cand.name].url
                last_err = f"{url}: {e}"
                self.metrics.upstream_errors.labels(endpoint=cand.name, stage=e.stage).inc()
                if attempt < len(order):
                    self.metrics.retries.labels(endpoint=cand.name).inc()
                log.info("attempt %d on %s failed before first byte: %s", attempt, url, e)
        await self._error(send, 502, "upstream", f"all endpoints failed before the first byte ({last_err})", path)

    async def _attempt(self, send, path: str, info: InferenceRequest, hashes, raw, decision: Routing,
                       cand: Endpoint, attempt: int):
        ep = self.by_name[cand.name]
        assert self.client is not None
        match = self.prefix.record(ep.name, hashes)
        t0 = time.monotonic()
        # dispatch first: the policy writes the P/D stage headers forwarded below
        self.driver.dispatch(decision, info, cand, t0)
        fwd = [(k, v) for k, v in info.headers.items() if k not in HOP_BY_HOP]
        fwd.append(("x-gateway-destination-endpoint", ep.host_port))
        req = self.client.build_request("POST", ep.url + path, content=raw, headers=fwd)
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
            except (TimeoutError, httpx.HTTPError, OSError) as e:
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
                        events = obs.feed(chunk)   # content events: one token each in OpenAI streaming
                        if events and t_first is None:
                            t_first = time.monotonic()
                            if status < 300:
                                self.driver.first_chunk(decision, info, t_first, events)
                        elif events and status < 300:
                            self.driver.chunk(decision, info, time.monotonic(), events)
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
            self._finish(path, info, decision, ep, status, outcome_ok, obs, bobs, t0, t_first, t_end, attempt, match)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if resp is not None:
                await _aclose_quietly(resp)
            if not finished:  # failed, timed out or cancelled: no sample, a failed outcome
                t_end = time.monotonic()
                if started:
                    self._finish(path, info, decision, ep, status, False, obs, bobs, t0, t_first, t_end, attempt, match)
                else:
                    self.driver.complete(decision, info, Outcome(False, status, None, None, 0, 0), t_end)
        return None

    def _finish(self, path, info, decision, ep, status, ok, obs, bobs, t0, t_first, t_end, attempt, match) -> None:
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
        self.driver.complete(decision, info, Outcome(ok, status, ttft, e2e, tokens, chunks), t_end)
        self.metrics.observe(path, info, ep.name, status, ok, ttft, tpot, e2e)
        pred = (decision.predicted or {}).get(ep.name)
        self.record_seq += 1
        self.records.append(RequestRecord(
            request_id=info.request_id, endpoint=ep.name, status=status, ok=ok,
            streaming=info.streaming, input_tokens=info.input_tokens,
            prefix_match_blocks=match.match_blocks, prefix_total_blocks=match.total_blocks,
            ttft_ms=ttft, tpot_ms=tpot, e2e_ms=e2e, tokens=tokens,
            predicted_ttft_ms=pred[0] if pred else None, predicted_tpot_ms=pred[1] if pred else None,
            model_version=decision.model_version, fallback=decision.fallback, decision=decision.result.decision,
            attempts=attempt,
            ttft_slo_ms=info.ttft_slo_ms, tpot_slo_ms=info.tpot_slo_ms,
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
