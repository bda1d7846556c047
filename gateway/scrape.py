"""Endpoint metrics from the model servers' Prometheus text (vLLM and llama.cpp names).

``parse_metrics(text)`` maps one scrape to :class:`ScrapedMetrics`; :class:`Scraper`
keeps every endpoint's snapshot fresh in a background task, with a bounded timeout per
scrape, and marks an endpoint stale/unhealthy when its scrapes fail.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .health import Breaker

log = logging.getLogger("gateway.scrape")

# name -> (attribute, scale); the first name found for an attribute wins (order matters)
KV_NAMES = (
    ("vllm:kv_cache_usage_perc", 1.0),        # fraction in [0, 1] despite the name
    ("vllm:gpu_cache_usage_perc", 1.0),       # older vLLM
    ("llamacpp:kv_cache_usage_ratio", 1.0),   # llama.cpp (older builds)
)
WAITING_NAMES = ("vllm:num_requests_waiting", "llamacpp:requests_deferred")
RUNNING_NAMES = ("vllm:num_requests_running", "llamacpp:requests_processing")
LORA_NAME = "vllm:lora_requests_info"
# the engine's KV cache as configured (an info gauge): name -> (label of its blocks, label of a block's tokens)
CACHE_CONFIG_NAMES = {"vllm:cache_config_info": ("num_gpu_blocks", "block_size"),
                      "sglang:cache_config_info": ("num_pages", "page_size")}


@dataclass
class ScrapedMetrics:
    kv_cache_usage: float | None = None
    waiting: int | None = None
    running: int | None = None
    active_lora: frozenset[str] = frozenset()
    waiting_lora: frozenset[str] = frozenset()
    max_lora: int = 0
    cache_num_blocks: int = 0       # 0: not reported
    cache_block_size: int = 0
    raw_names: frozenset[str] = frozenset()


def parse_metrics(text: str) -> ScrapedMetrics:
    """Sum each gauge over its series (one per model name); unknown metrics are ignored."""
    values: dict[str, float] = {}
    lora_labels: tuple[float, dict[str, str]] | None = None
    cache: tuple[int, int] = (0, 0)
    names: set[str] = set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            names.add(s.name)
            if s.name in CACHE_CONFIG_NAMES:
                cache = _cache_config(s.labels, *CACHE_CONFIG_NAMES[s.name]) or cache
                continue
            if s.name == LORA_NAME:
                # the latest series carries the current adapters (its value is a timestamp)
                if lora_labels is None or s.value >= lora_labels[0]:
                    lora_labels = (s.value, dict(s.labels))
                continue
            if s.value != s.value:  # NaN
                continue
            values[s.name] = values.get(s.name, 0.0) + float(s.value)
    m = ScrapedMetrics(raw_names=frozenset(names), cache_num_blocks=cache[0], cache_block_size=cache[1])
    for name, scale in KV_NAMES:
        if name in values:
            m.kv_cache_usage = min(1.0, max(0.0, values[name] * scale))
            break
    for name in WAITING_NAMES:
        if name in values:
            m.waiting = max(0, int(values[name]))
            break
    for name in RUNNING_NAMES:
        if name in values:
            m.running = max(0, int(values[name]))
            break
    if lora_labels is not None:
        lab = lora_labels[1]

        def _set(key: str) -> frozenset[str]:
            return frozenset(x for x in lab.get(key, "").split(",") if x)

        m.active_lora = _set("running_lora_adapters")
        m.waiting_lora = _set("waiting_lora_adapters")
        try:
            m.max_lora = int(float(lab.get("max_lora", "0") or 0))
        except ValueError:
            m.max_lora = 0
    return m


def _cache_config(labels: dict[str, str], blocks_label: str, size_label: str) -> tuple[int, int] | None:
    """(blocks, tokens per block) from a cache-config info gauge's labels; None when either is
    missing, not a positive integer or "None" (vLLM before its cache is profiled)."""
    try:
        blocks, size = int(labels.get(blocks_label, "")), int(labels.get(size_label, ""))
    except ValueError:
        return None
    return (blocks, size) if blocks > 0 and size > 0 else None


@dataclass
class EndpointState:
    """What the gateway knows about one upstream endpoint."""

    name: str
    url: str  # base URL, no trailing slash
    metrics: ScrapedMetrics = field(default_factory=ScrapedMetrics)
    scraped_at: float = 0.0          # monotonic time of the last good scrape
    scrape_failures: int = 0         # consecutive
    breaker: Breaker = field(default_factory=Breaker)   # dispatch failures: ejection and half-open trial
    labels: dict = field(default_factory=dict)  # e.g. {"llm-d.ai/role": "prefill"} for P/D profiles

    @property
    def host_port(self) -> str:
        return self.url.split("://", 1)[-1]

    @property
    def dispatch_failures(self) -> int:
        return self.breaker.failures

    def healthy(self, now: float, max_failures: int = 3) -> bool:
        """Scraped recently enough (fewer than ``max_failures`` failed scrapes in a row) and not ejected."""
        return self.scrape_failures < max_failures and not self.breaker.ejected(now)


class Scraper:
    """Background task that refreshes every endpoint's metrics every ``interval`` seconds."""

    def __init__(self, endpoints: list[EndpointState], client: httpx.AsyncClient,
                 interval: float = 0.2, timeout: float = 1.0, path: str = "/metrics") -> None:
        self.endpoints = endpoints
        self.client = client
        self.interval = interval
        self.timeout = timeout
        self.path = path
        self._task: asyncio.Task | None = None
        self.scrapes = 0
        self.errors = 0

    async def scrape_one(self, ep: EndpointState) -> bool:
        try:
            r = await self.client.get(ep.url + self.path, timeout=self.timeout)
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}")
            ep.metrics = parse_metrics(r.text)
            ep.scraped_at = time.monotonic()
            if ep.scrape_failures:    # back after failed scrapes (e.g. restarted): a fresh start
                ep.breaker.success()
            ep.scrape_failures = 0
            self.scrapes += 1
            return True
        except Exception as e:  # noqa: BLE001 - any failure marks the endpoint, never crashes
            ep.scrape_failures += 1
            self.errors += 1
            log.debug("scrape of %s failed: %s", ep.url, e)
            return False

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape_one(ep) for ep in self.endpoints))

    async def _run(self) -> None:
        while True:
            await self.scrape_all()
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_task(self._task)
        self._task = None


async def cancel_task(task: asyncio.Task | None) -> None:
    """Cancel a background task and wait until it has stopped."""
    if task is not None:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
