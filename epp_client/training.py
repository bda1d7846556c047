"""Training sinks: where the producer sends training entries.

Protocol: ``add(entries: list[dict]) -> None`` (never blocks on the network), plus
``close()``. Entries are wire dicts (``docs/wire-api.md`` §1.1 row + ``actual_ttft_ms``,
``actual_tpot_ms``, ``timestamp``, and our extension ``predicted_ttft_ms``,
``predicted_tpot_ms``, ``model_version``).

- :class:`ListSink`: keeps entries in a bounded in-memory list (in-process use, tests).
- :class:`TrainingReporter`: buffers entries and POSTs them to
  ``<url>/add_training_data_bulk`` every ``flush_interval_s`` from a background thread
  (B1.7): above ``max_sample_size`` the batch is stratified-downsampled; a status other
  than 202 is a failure (no retry); the buffer is bounded (the oldest entries are dropped
  and counted); ``close()`` makes a final flush.
"""
from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import orjson

from epp_client.httpclient import HttpTransport, ServerAddress

ADD_PATH = "/add_training_data_bulk"


class ListSink:
    """In-memory sink (bounded; the oldest entries go first)."""

    def __init__(self, max_entries: int = 1_000_000) -> None:
        self.entries: deque = deque(maxlen=max_entries)

    def add(self, entries: list[dict]) -> None:
        self.entries.extend(entries)

    def close(self) -> None:
        pass


def stratified_downsample(entries: Sequence[dict], max_size: int, rng: random.Random) -> list[dict]:
    """B1.7: groups TTFT (actual_ttft_ms > 0), TPOT (else actual_tpot_ms > 0) and other;
    quota = int(len/total × max); a shortfall goes to the largest group (ties TTFT ≥ TPOT ≥
    other), an excess comes off the largest quota; shuffle each group and take its quota."""
    total = len(entries)
    if total <= max_size:
        return list(entries)
    groups: list[list[dict]] = [[], [], []]
    for e in entries:
        if (e.get("actual_ttft_ms") or 0) > 0:
            groups[0].append(e)
        elif (e.get("actual_tpot_ms") or 0) > 0:
            groups[1].append(e)
        else:
            groups[2].append(e)
    quotas = [int(len(g) / total * max_size) for g in groups]
    s = sum(quotas)
    if s < max_size:
        largest = max(range(3), key=lambda i: (len(groups[i]), -i))
        quotas[largest] += max_size - s
    elif s > max_size:
        largest = max(range(3), key=lambda i: (quotas[i], -i))
        quotas[largest] -= s - max_size
    out: list[dict] = []
    for g, q in zip(groups, quotas):
        g = list(g)
        rng.shuffle(g)
        out.extend(g[: max(0, q)])
    return out


class TrainingReporter:
    """Buffered HTTP sink for the training server (see the module docstring)."""

    def __init__(self, url: str, max_sample_size: int = 1000, flush_interval_s: float = 1.0,
                 http_timeout_s: float = 10.0, max_buffer: int = 100_000, rng: random.Random | None = None,
                 autostart: bool = True) -> None:
        if max_sample_size <= 0:
            raise ValueError("max_sample_size must be > 0")
        if flush_interval_s <= 0:
            raise ValueError("flush_interval_s must be > 0")
        if max_buffer <= 0:
            raise ValueError("max_buffer must be > 0")
        self.addr = ServerAddress.parse(url)
        self.max_sample_size = max_sample_size
        self.flush_interval_s = flush_interval_s
        self.http_timeout_s = http_timeout_s
        self.max_buffer = max_buffer
        self.rng = rng or random.Random()
        self.autostart = autostart
        self._pool = HttpTransport(self.addr, max_idle_sync=2)
        self._buf: deque = deque()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        # counters
        self.added = 0
        self.sent = 0  # entries acknowledged with 202
        self.dropped = 0  # buffer overflow (oldest dropped)
        self.downsampled = 0  # removed by stratified downsampling
        self.failed = 0  # entries lost to a failed POST
        self.posts = 0
        self.failed_posts = 0
        self.last_status: int | None = None

    @classmethod
    def from_env(cls, **overrides: Any) -> TrainingReporter:
        """Upstream environment variables (B1.7, declared in ``epp_client.settings``); a bad
        value raises SettingsError naming the variable. Keyword overrides win."""
        from epp_client.settings import ReporterSettings

        kw: dict[str, Any] = ReporterSettings.from_env().kwargs()
        kw.update(overrides)
        return cls(**kw)

    def add(self, entries: list[dict]) -> None:
        if not entries:
            return
        with self._lock:
            if self._closed:
                self.dropped += len(entries)
                return
            self.added += len(entries)
            self._buf.extend(entries)
            over = len(self._buf) - self.max_buffer
            if over > 0:
                for _ in range(over):
                    self._buf.popleft()
                self.dropped += over
            thread: threading.Thread | None = None
            if self.autostart and self._thread is None:
                thread = self._thread = threading.Thread(target=self._run, name="training-reporter", daemon=True)
        if thread is not None:
            thread.start()

    def buffered(self) -> int:
        return len(self._buf)

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            self.flush()

    def flush(self) -> int:
        """Send the whole buffer now (one POST); returns the number of entries acknowledged."""
        with self._flush_lock:
            with self._lock:
                batch = list(self._buf)
                self._buf.clear()
            if not batch:
                return 0
            if len(batch) > self.max_sample_size:
                kept = stratified_downsample(batch, self.max_sample_size, self.rng)
                self.downsampled += len(batch) - len(kept)
                batch = kept
            self.posts += 1
            try:
                status, _ = self._pool.post(ADD_PATH, orjson.dumps({"entries": batch}), self.http_timeout_s)
            except (OSError, TimeoutError):
                status = None
            self.last_status = status
            if status == 202:
                self.sent += len(batch)
                return len(batch)
            self.failed_posts += 1
            self.failed += len(batch)
            return 0

    def stats(self) -> dict[str, int]:
        return {"added": self.added, "sent": self.sent, "dropped": self.dropped, "downsampled": self.downsampled,
                "failed": self.failed, "posts": self.posts, "failed_posts": self.failed_posts,
                "buffered": self.buffered()}

    def close(self) -> None:
        """Stop the flusher and make a final flush."""
        with self._lock:
            self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.http_timeout_s + self.flush_interval_s)
        self.flush()
        self._pool.close()

    def __enter__(self) -> TrainingReporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
