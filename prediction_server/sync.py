"""Bundle sync: keep the served bundle up to date, never worse than the last good one.

Two sources, checked in this order on every poll:
- a local bundle directory (``LATENCY_BUNDLE_DIR``, e.g. a shared volume): the newest
  complete bundle newer than the served one (``features.bundle.list_bundles`` /
  ``read_bundle``, which verify size and sha256);
- the training server (``TRAINING_SERVER_URL``): ``GET /v1/bundles/latest`` with
  ``If-None-Match``, then ``GET /v1/bundles/{version}/{file}`` for each model file,
  bounded in size (the manifest's size) and time (timeouts and a total deadline), verified
  with ``features.bundle.verify_file``.

A verified bundle is loaded (``LoadedBundle.from_files``, which smoke-tests it) and handed
to ``PredictionService.swap`` (one reference assignment; never an older version). Any
failure keeps the served bundle, is logged and counted by reason, and is retried on the
next poll with bounded exponential backoff. The poller is a daemon thread; the event loop
never blocks on it. ``sync_once`` is also what ``POST /reload`` calls (in a worker thread).
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from features.bundle import BundleError, list_bundles, read_bundle, validate_manifest, verify_file, version_seq

from .model import LoadedBundle
from .service import PredictionService
from .settings import Settings

log = logging.getLogger("prediction_server.sync")

#: Largest manifest accepted (bytes).
MAX_MANIFEST_BYTES = 1 << 20
#: Upper bound of the retry backoff, in seconds (and at most 8 poll intervals).
MAX_BACKOFF_SEC = 60.0


class SyncFailure(Exception):
    def __init__(self, reason: str, msg: str, status: int | None = None) -> None:
        self.reason = reason
        self.status = status
        super().__init__(msg)


class BundleSync:
    def __init__(self, settings: Settings, service: PredictionService,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.settings = settings
        self.service = service
        self.metrics = service.metrics
        self._url = settings.training_server_url
        self._dir = Path(settings.bundle_dir) if settings.bundle_dir else None
        self._transport = transport
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()  # one sync at a time (poller and /reload)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._etag: str | None = None
        self.failures_in_a_row = 0
        self.last_result: dict[str, Any] = {"result": "never"}

    @property
    def enabled(self) -> bool:
        return bool(self._url) or self._dir is not None

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="bundle-sync", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def next_delay(self) -> float:
        interval = self.settings.sync_interval_sec
        if self.failures_in_a_row == 0:
            return interval
        cap = max(interval, min(MAX_BACKOFF_SEC, 8 * interval))
        return min(cap, interval * 2 ** min(self.failures_in_a_row - 1, 16))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception:  # never let the poller die
                log.exception("bundle sync crashed")
            self._stop.wait(self.next_delay())

    # ---- one sync -----------------------------------------------------------------------
    def sync_once(self) -> dict[str, Any]:
        """Check every source once; returns ``{"result": "updated"|"unchanged"|"failed"|
        "disabled", "version", "served_version", "reason", "error"}``."""
        with self._lock:
            if not self.enabled:
                return self._done({"result": "disabled"})
            failure: SyncFailure | None = None
            updated = None
            for source in (self._sync_dir, self._sync_remote):
                try:
                    v = source()
                    updated = updated or v
                except SyncFailure as e:
                    failure = failure or e
                    self.metrics.sync_failures.labels(e.reason).inc()
                    log.warning("bundle sync failed (%s): %s; keeping %s", e.reason, e,
                                self.service.bundle.version)
            if failure is not None and updated is None:
                self.failures_in_a_row += 1
                return self._done({"result": "failed", "reason": failure.reason, "error": str(failure)})
            self.failures_in_a_row = 0
            if updated is not None:
                return self._done({"result": "updated", "version": updated})
            return self._done({"result": "unchanged"})

    def _done(self, result: dict[str, Any]) -> dict[str, Any]:
        result["served_version"] = self.service.bundle.version
        result["at"] = time.time()
        self.metrics.sync_attempts.labels(result["result"]).inc()
        self.last_result = result
        return result

    def _offer(self, bundle: LoadedBundle) -> str | None:
        return bundle.version if self.service.swap(bundle) else None

    # ---- local directory ----------------------------------------------------------------
    def _sync_dir(self) -> str | None:
        if self._dir is None:
            return None
        served = self.service.served.seq
        errors = []
        for path in reversed(list_bundles(self._dir)):
            if version_seq(path.name) <= served:
                break
            try:
                manifest, files = read_bundle(path)
                if manifest["version"] != path.name:
                    raise BundleError(f"{path.name}: manifest names version {manifest['version']!r}")
                bundle = LoadedBundle.from_files(manifest, files)
            except BundleError as e:
                errors.append(str(e))
                continue  # try the next newest that is still newer than the served one
            if self._offer(bundle):
                if errors:
                    log.warning("skipped broken newer bundles: %s", "; ".join(errors))
                return bundle.version
            break
        if errors:
            raise SyncFailure("local_dir", "; ".join(errors))
        return None

    # ---- training server ----------------------------------------------------------------
    def _http(self) -> httpx.Client:
        if self._client is None:
            t = self.settings.sync_timeout_sec
            self._client = httpx.Client(base_url=self._url, timeout=httpx.Timeout(t, connect=min(t, 3.0)),
                                        transport=self._transport, follow_redirects=False)
        return self._client

    def _get(self, path: str, limit: int, deadline: float, headers: dict | None = None) -> httpx.Response | bytes:
        """GET with a size limit and a total deadline; returns the bytes (or the 304 response)."""
        try:
            with self._http().stream("GET", path, headers=headers) as resp:
                if resp.status_code == 304:
                    return resp
                if resp.status_code != 200:
                    raise SyncFailure("http_status", f"GET {path}: HTTP {resp.status_code}", resp.status_code)
                declared = resp.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limit:
                    raise SyncFailure("too_large", f"GET {path}: {declared} bytes > limit {limit}")
                buf = bytearray()
                for chunk in resp.iter_bytes():
                    buf += chunk
                    if len(buf) > limit:
                        raise SyncFailure("too_large", f"GET {path}: more than {limit} bytes")
                    if time.monotonic() > deadline:
                        raise SyncFailure("timeout", f"GET {path}: download exceeded its deadline")
                return bytes(buf)
        except httpx.TimeoutException as e:
            raise SyncFailure("timeout", f"GET {path}: {type(e).__name__}") from None
        except httpx.HTTPError as e:
            raise SyncFailure("network", f"GET {path}: {type(e).__name__}: {e}") from None

    def _sync_remote(self) -> str | None:
        if not self._url:
            return None
        deadline = time.monotonic() + 3 * self.settings.sync_timeout_sec
        served = self.service.served
        headers = {"If-None-Match": f'"{self._etag}"'} if self._etag else None
        try:
            resp = self._get("/v1/bundles/latest", MAX_MANIFEST_BYTES, deadline, headers)
        except SyncFailure as e:
            if e.status == 404:
                return None  # nothing published yet: not a failure
            raise
        if not isinstance(resp, bytes):
            return None  # 304: unchanged
        try:
            manifest = orjson.loads(resp)
        except orjson.JSONDecodeError as e:
            raise SyncFailure("bad_json", f"manifest is not JSON: {e}") from None
        try:
            manifest = validate_manifest(manifest)
        except BundleError as e:
            reason = "unknown_schema" if "schema" in str(e) or "raw_columns" in str(e) else "bad_manifest"
            raise SyncFailure(reason, str(e)) from None
        version = manifest["version"]
        if version_seq(version) <= served.seq:
            # same or older than what we serve: never downgrade; remember it to get 304s
            self._etag = version if version_seq(version) == served.seq else self._etag
            if version_seq(version) < served.seq:
                log.warning("training server offers %s, older than served %s: ignored", version,
                            served.bundle.version)
            return None
        files = {}
        for target, spec in manifest["models"].items():
            path = f"/v1/bundles/{version}/{spec['file']}"
            data = self._get(path, spec["size"], deadline)
            assert isinstance(data, bytes)
            if len(data) < spec["size"]:
                raise SyncFailure("truncated", f"{path}: {len(data)} bytes, manifest says {spec['size']}")
            try:
                verify_file(data, spec, f"{version}/{spec['file']}")
            except BundleError as e:
                raise SyncFailure("checksum", str(e)) from None
            files[spec["file"]] = data
        try:
            bundle = LoadedBundle.from_files(manifest, files)
        except BundleError as e:
            raise SyncFailure("load_error", str(e)) from None
        swapped = self._offer(bundle)
        if swapped:
            self._etag = version
        return swapped
