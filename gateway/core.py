"""The gateway as a plain object (state, routing, proxying) and its ASGI entry point.

One request: read the body (bounded), validate the fields the gateway needs (4xx naming
the field otherwise), estimate the prompt's tokens and prefix blocks, match them against
every endpoint's prefix LRU, ask the routing policy, then try the chosen endpoints in order until
one sends its first body byte (connection errors, first-byte timeouts and 5xx before any
byte move on to the next; nothing is retried once a byte reached the client). A stream's
request asks the engine for usage when the client did not (``usage.ask_for_usage``). The body
is forwarded chunk by chunk as it arrives (a stream's usage chunk that only the gateway asked
for left out, ``sse.StreamObserver``); a client disconnect cancels the upstream
request; the policy's request lifecycle is driven through the dispatch of each attempt,
the first token and the outcome (``routing.Driver``). Every attempt is accounted from its
dispatch and released in one ``finally``, whatever ends it.

Timeouts: ``first_byte_timeout_s`` from dispatch to the first body byte (the whole reply
when not streaming), then ``idle_timeout_s`` between two body chunks. A failure after the
first byte counts against the endpoint (``health.Breaker``); a streaming client then gets
an SSE ``error`` event as the last event (never ``[DONE]``), any other client a cut body.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

import httpx
import orjson

from epp_client.framework.lifecycle import RequestLifecycle
from epp_client.framework.protocols import InFlightLoadProducer
from epp_client.heuristics import LeastLoadScheduler
from epp_client.plugins.producer.approx_prefix import ApproxPrefixProducer
from epp_client.types import Endpoint, InferenceRequest

from .downstream import ClientWatch, Disconnected, TooLarge, aclose_quietly, first_nonempty, read_body
from .headers import ClientHeaders, HeaderError, downstream, ingress, priority, upstream
from .health import Breaker
from .metrics import GatewayMetrics
from .prompt import BodyError, block_hashes, extract_prompt
from .records import Records, RequestRecord, measure
from .routing import Driver, Outcome, Routing, to_endpoint
from .scrape import EndpointState, Scraper
from .settings import GatewaySettings
from .sse import BodyObserver, StreamObserver, error_event
from .usage import Forward, ask_for_usage

log = logging.getLogger("gateway")

ROUTES = {"/v1/completions": False, "/v1/chat/completions": True}


class MidStreamFailure(Exception):
    """The upstream failed after bytes reached the client: never retried; the client's
    response is cut (no terminating chunk) so it cannot mistake it for a full answer."""


class UpstreamFailed(Exception):
    def __init__(self, stage: str, detail: str) -> None:
        self.stage = stage
        super().__init__(f"{stage}: {detail}")


class Unsendable(Exception):
    """The client's request cannot be put on the wire (e.g. a header value HTTP forbids): a 400, never
    the endpoint's fault."""


class Gateway:
    def __init__(self, settings: GatewaySettings, router: RequestLifecycle | None = None,
                 health_clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.health_clock = health_clock   # what endpoint ejections are timed by (monotonic seconds)
        self.endpoints = [EndpointState(name=f"ep{i}-{u.split('://', 1)[-1]}", url=u, breaker=Breaker(
            settings.eject_after_failures, settings.ejection_base_s, settings.ejection_max_s))
                          for i, u in enumerate(settings.endpoints)]
        self.by_name = {e.name: e for e in self.endpoints}
        self.router: RequestLifecycle = router if router is not None else LeastLoadScheduler()
        # the config's approx-prefix-cache-producer, else one with the gateway's settings
        self.prefix: ApproxPrefixProducer = getattr(self.router, "prefix_producer", None) or ApproxPrefixProducer(
            settings.block_size_tokens, settings.max_prefix_blocks, settings.lru_capacity_per_endpoint)
        inflight = self.router.inflight
        if inflight is None:
            raise ValueError("the gateway's routing policy needs an in-flight tracker")
        self.inflight: InFlightLoadProducer = inflight
        bind = getattr(self.router, "bind_endpoints", None)
        if bind is not None:   # flow control reads the scraped state of the candidates
            bind(self.endpoints)
        self.metrics = GatewayMetrics(self)
        self.driver = Driver(self.router, self.metrics)
        self.history = Records(settings.record_capacity)
        self.records = self.history.items
        # the priorities x-llm-d-priority may ask for; any other value counts as 0 (a bounded set of bands)
        flow = getattr(self.router, "flow", None)
        self.priorities = {0, *settings.priorities, *settings.objectives.values(),
                           *(getattr(getattr(flow, "controller", None), "band_configs", None) or ())}
        self.client: httpx.AsyncClient | None = None
        self.scraper: Scraper | None = None
        self._sem: asyncio.Semaphore | None = None

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        self.client = httpx.AsyncClient(
            # reads are bounded by the first-byte and idle timeouts, applied per read in ``_attempt``
            timeout=httpx.Timeout(connect=s.connect_timeout_s, read=None,
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
        """``headers``: the client's (``headers.ingress``), whose ``x-request-id`` is the gateway's id."""
        p = extract_prompt(body, chat)
        rid = headers.get("x-request-id") or uuid.uuid4().hex
        headers["x-request-id"] = rid
        prio = priority(headers, self.settings.objectives, self.priorities)
        info = InferenceRequest(request_id=rid, headers=headers, priority=prio, input_tokens=p.input_tokens,
                                target_model=p.model, streaming=p.streaming, max_tokens=p.max_tokens)
        hashes = block_hashes(p.text, self.prefix.block_size_tokens, self.prefix.max_prefix_blocks)
        return info, hashes

    def candidates(self, hashes: list[int]) -> list[Endpoint]:
        """The healthy endpoints (all when none is), with their prefix match."""
        now = self.health_clock()
        eps = [to_endpoint(e) for e in self.endpoints if e.healthy(now)] or [to_endpoint(e) for e in self.endpoints]
        self.prefix.produce(hashes, eps)
        return eps

    # ---- the request path ------------------------------------------------------------
    async def handle(self, scope, receive, send) -> None:
        path = scope["path"]
        chat = ROUTES[path]
        try:
            ch = ingress(scope["headers"], self.settings.max_header_bytes)
        except HeaderError as e:
            return await self._error(send, e.status, e.field, e.msg, path)
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
            info, hashes = self.request_info(ch.view, body, chat)
        except BodyError as e:
            return await self._json(send, 400, e.to_json(), path)
        fwd = ask_for_usage(raw, body, self.settings.stream_usage)
        if ch.client_id:
            log.debug("request %s: client id %r", ch.gateway_id, ch.client_id)
        assert self._sem is not None
        if self._sem.locked():
            return await self._json(send, 429, {"error": {"message": "gateway saturated",
                                                          "type": "rate_limit"}}, path, extra=self._retry_after())
        async with self._sem:
            client = ClientWatch(receive, send)
            try:
                await asyncio.wait_for(self._route_and_proxy(client.send, path, ch, info, hashes, fwd),
                                       self.settings.request_timeout_s)
            except asyncio.CancelledError:
                if not client.gone:
                    raise
                client.task.uncancel()  # the current task: the watch's own cancellation, consumed
                self.metrics.disconnects.labels(stage="response").inc()
                self.metrics.requests.labels(path=path, status="499").inc()   # client closed the request
            except MidStreamFailure as e:
                log.info("upstream failed mid-stream, response cut: %s", e)
                return  # returning before the final body message closes the client connection
            except TimeoutError:
                self.metrics.upstream_errors.labels(endpoint="*", stage="request-timeout").inc()
                if client.started:
                    self.metrics.requests.labels(path=path, status="504").inc()
                    return  # the client sees a truncated body, never a silent success
                await self._error(send, 504, "upstream", "request timeout", path)
            finally:
                client.close()

    def _retry_after(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.settings.retry_after_s).encode())]

    async def _route_and_proxy(self, send, path: str, ch: ClientHeaders, info: InferenceRequest,
                               hashes: list[int], fwd: Forward) -> None:
        decision = await self.driver.decide_held(info, lambda: self.candidates(hashes), self.settings.max_hold_s)
        if not decision.admitted:
            reason = decision.reason or "denied"
            self.metrics.admission_denied.labels(reason=reason).inc()
            return await self._json(send, decision.status or 429, {"error": {
                "message": f"request cannot be admitted: {reason}", "type": "admission_denied",
                "code": "rejected"}}, path, extra=[(b"x-llm-d-request-dropped-reason", reason.encode()[:200]),
                                                   *self._retry_after()])
        order = decision.order[: self.settings.max_attempts]
        last_err = "no endpoint"
        for attempt, cand in enumerate(order, 1):
            try:
                return await self._attempt(send, path, ch, info, hashes, fwd, decision, cand, attempt)
            except Unsendable as e:
                return await self._error(send, 400, "headers", f"cannot be forwarded: {e}", path)
            except UpstreamFailed as e:
                url = self.by_name[cand.name].url
                last_err = f"{url}: {e}"
                self.metrics.upstream_errors.labels(endpoint=cand.name, stage=e.stage).inc()
                if attempt < len(order):
                    self.metrics.retries.labels(endpoint=cand.name).inc()
                log.info("attempt %d on %s failed before first byte: %s", attempt, url, e)
        await self._error(send, 502, "upstream", f"all endpoints failed before the first byte ({last_err})", path)

    def _failed(self, ep: EndpointState) -> None:
        """A failure of the endpoint's own making (never the client's)."""
        if ep.breaker.failure(self.health_clock()):
            self.metrics.ejections.labels(endpoint=ep.name).inc()
            log.warning("endpoint %s ejected for %.1f s after failed requests", ep.url,
                        ep.breaker.remaining_s(self.health_clock()))

    async def _attempt(self, send, path: str, ch: ClientHeaders, info: InferenceRequest, hashes, fwd: Forward,
                       decision: Routing, cand: Endpoint, attempt: int):
        ep = self.by_name[cand.name]
        assert self.client is not None
        s = self.settings
        match = self.prefix.record(ep.name, hashes)
        t0 = time.monotonic()
        resp: httpx.Response | None = None
        started = finished = False
        status = 0
        obs = StreamObserver(fwd.strip_usage) if info.streaming else None
        bobs = BodyObserver() if not info.streaming else None
        t_first: float | None = None
        # dispatch first (the policy writes the P/D stage headers forwarded below); from here on the
        # request is accounted, and the ``finally`` releases it whatever happens
        self.driver.dispatch(decision, info, cand, t0)
        try:
            # ---- before the first byte: failures here are retried elsewhere ----
            try:
                req = self.client.build_request("POST", ep.url + path, content=fwd.body,
                                                headers=upstream(ch, ep.host_port))
                resp = await asyncio.wait_for(self.client.send(req, stream=True), s.first_byte_timeout_s)
                status = resp.status_code
                if obs is not None and status >= 300:   # an error body: forwarded as is
                    obs.strip_usage = False
                if status >= 500:
                    raise UpstreamFailed("status", f"HTTP {status}")
                it = resp.aiter_raw()
                first = await asyncio.wait_for(first_nonempty(it),
                                               max(0.001, s.first_byte_timeout_s - (time.monotonic() - t0)))
                if first is None and status < 400:
                    raise UpstreamFailed("first-byte", "closed without a body")
            except UpstreamFailed:
                self._failed(ep)
                raise
            except (httpx.LocalProtocolError, UnicodeError) as e:
                raise Unsendable(f"{type(e).__name__} {e}") from None
            except (TimeoutError, httpx.HTTPError, OSError) as e:
                self._failed(ep)
                raise UpstreamFailed("connect" if resp is None else "first-byte",
                                     type(e).__name__ + (f" {e}" if str(e) else "")) from None
            self.metrics.decisions.labels(endpoint=ep.name).inc()
            await send({"type": "http.response.start", "status": status,
                        "headers": downstream(resp.headers.raw, ch, ep.host_port)})
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
                        chunk = obs.take(chunk)   # without a usage chunk the client did not ask for
                    elif bobs is not None:
                        bobs.feed(chunk)
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                try:
                    chunk = await asyncio.wait_for(it.__anext__(), s.idle_timeout_s)
                except StopAsyncIteration:
                    break
                except (TimeoutError, httpx.HTTPError) as e:
                    stage = "idle-timeout" if isinstance(e, TimeoutError) else "mid-stream"
                    self.metrics.upstream_errors.labels(endpoint=ep.name, stage=stage).inc()
                    self._failed(ep)
                    what = f"{ep.url}: {stage} ({type(e).__name__})"
                    if obs is None or status >= 300:
                        self.metrics.requests.labels(path=path, status="502").inc()
                        raise MidStreamFailure(what) from None
                    # a streaming client gets the failure as the stream's last event
                    await send({"type": "http.response.body", "more_body": True,
                                "body": obs.rest() + error_event(f"upstream failed after the first byte: {what}")})
                    finished = True
                    self._finish(path, info, decision, ep, 502, False, obs, bobs, t0, t_first, time.monotonic(),
                                 attempt, match, ch.client_id)
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return None
            # upstream finished: account the request before the client sees the end of it
            t_end = time.monotonic()
            outcome_ok = 200 <= status < 300 and not (obs is not None and obs.error_event)
            ep.breaker.success()
            finished = True
            self._finish(path, info, decision, ep, status, outcome_ok, obs, bobs, t0, t_first, t_end, attempt, match,
                         ch.client_id)
            await send({"type": "http.response.body", "body": obs.rest() if obs is not None else b"",
                        "more_body": False})
        finally:
            if resp is not None:
                await aclose_quietly(resp)
            if not finished:  # failed, timed out or cancelled: no sample, a failed outcome (counted by the caller)
                t_end = time.monotonic()
                if started:
                    self._finish(path, info, decision, ep, status, False, obs, bobs, t0, t_first, t_end, attempt,
                                 match, ch.client_id, counted=False)
                else:
                    self.driver.complete(decision, info, Outcome(False, status, None, None, 0, 0), t_end)
        return None

    def _finish(self, path, info, decision, ep, status, ok, obs, bobs, t0, t_first, t_end, attempt, match,
                client_id: str, counted: bool = True) -> None:
        m = measure(obs, bobs, t0, t_first, t_end)
        ok = ok and m.ttft_ms is not None   # a stream that never produced a token trains nothing
        outcome = Outcome(ok, status, m.ttft_ms, m.e2e_ms, m.tokens, m.chunks, m.prompt_tokens)
        self.driver.complete(decision, info, outcome, t_end)
        if counted:
            self.metrics.requests.labels(path=path, status=str(status)).inc()
        self.metrics.observe(info, ep.name, ok, m.ttft_ms, m.tpot_ms, m.e2e_ms)
        pred = (decision.predicted or {}).get(ep.name)
        self.history.append(RequestRecord(
            request_id=info.request_id, client_request_id=client_id, endpoint=ep.name, status=status, ok=ok,
            streaming=info.streaming, input_tokens=info.input_tokens,
            prefix_match_blocks=match.match_blocks, prefix_total_blocks=match.total_blocks,
            ttft_ms=m.ttft_ms, tpot_ms=m.tpot_ms, e2e_ms=m.e2e_ms, tokens=m.tokens,
            predicted_ttft_ms=pred[0] if pred else None, predicted_tpot_ms=pred[1] if pred else None,
            model_version=decision.model_version, fallback=decision.fallback, decision=decision.result.decision,
            attempts=attempt, ttft_slo_ms=info.ttft_slo_ms, tpot_slo_ms=info.tpot_slo_ms, finished_at=time.time()))

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

    def records_since(self, since: int, limit: int = 1000) -> dict:
        return self.history.since(since, limit)
