"""The learned engine step model, fetched from the prediction servers for the EPP's twin.

:class:`EngineFetcher` keeps the newest engine section a prediction server serves
(``GET /v1/engine``: the served bundle's manifest ``engine`` section and its version). It is
asked once per scheduling decision (:meth:`EngineFetcher.current`, no I/O) and fetches in a
background thread, one at a time, at most every ``min_gap_s``: every ``refresh_s``, and as soon
as the predictions name a bundle version other than the one the section came with (a new
bundle may carry a new section). A 404 (nothing learned yet), an unreachable server or a bad
answer keeps what it has; the twin validates a section before it uses it
(:class:`epp_client.engine.learned.StepModels`). The thread starts on first use, not at import.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

log = logging.getLogger("epp_client.engine_fetch")

ENGINE_PATH = "/v1/engine"


class EngineFetcher:
    def __init__(self, urls: Sequence[str], refresh_s: float = 10.0, min_gap_s: float = 1.0, timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.refresh_s, self.min_gap_s, self.timeout_s, self.clock = refresh_s, min_gap_s, timeout_s, clock
        self.section: tuple[str, Mapping[str, Any]] | None = None
        self.fetches = self.failures = 0
        self._asked = -float("inf")
        self._busy = False
        self._lock = threading.Lock()
        self._next = 0

    def current(self, seen_version: str = "") -> tuple[str, Mapping[str, Any]] | None:
        """The newest section fetched (None before any); starts a fetch when one is due."""
        now = self.clock()
        have = self.section[0] if self.section is not None else ""
        due = now - self._asked >= (self.min_gap_s if seen_version and seen_version != have else self.refresh_s)
        if due and not self._busy:
            with self._lock:
                if self._busy:
                    return self.section
                self._busy, self._asked = True, now
            threading.Thread(target=self._fetch, name="engine-fetch", daemon=True).start()
        return self.section

    def fetch_now(self) -> tuple[str, Mapping[str, Any]] | None:
        """Fetch in this thread (tests, start-up); the newest section."""
        with self._lock:
            self._busy, self._asked = True, self.clock()
        self._fetch()
        return self.section

    def _fetch(self) -> None:
        try:
            url = self.urls[self._next % len(self.urls)] + ENGINE_PATH
            self._next += 1
            self.fetches += 1
            try:
                with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:
                    doc = json.loads(resp.read(4 << 20))
                version, engine = doc.get("model_version"), doc.get("engine")
                if isinstance(version, str) and isinstance(engine, Mapping):
                    self.section = (version, engine)
                else:
                    self.failures += 1
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    self.failures += 1
            except (OSError, ValueError, AttributeError) as e:
                self.failures += 1
                log.debug("engine fetch from %s failed: %s", url, e)
        finally:
            self._busy = False
