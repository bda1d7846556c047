"""Bundle sync: keep the served bundle up to date, never worse than the last good one.

Two sources, checked in this order on every poll:
- a local bundle directory (``LATENCY_BUNDLE_DIR``, e.g. a shared volume): the best
  complete bundle the acceptance rule takes (``features.bundle.list_bundles`` /
  ``read_bundle``, which verify size and sha256);
- the training server (``TRAINING_SERVER_URL``): ``GET /v1/bundles/latest`` with
  ``If-None-Match``, then ``GET /v1/bundles/{version}/{file}`` for each model file,
  bounded in size (the manifest's size, and ``LATENCY_MAX_BUNDLE_BYTES`` for the whole
  bundle), decoding and time (``prediction_server.download``), streamed to a temporary
  file and verified with ``features.bundle.verify_digest``.

Only bundles the acceptance rule (``prediction_server.acceptance``: lineage, version,
learned over prior-only) would serve are fetched at all. A verified bundle is loaded
(``LoadedBundle.from_files``, which smoke-tests it in every load regime) and handed to
``PredictionService.swap`` (one reference assignment, the same rule). Any failure keeps
the served bundle, is logged and counted by reason, and is retried on the next poll with
bounded exponential backoff; a refused bundle is logged once at info and not fetched
again. Routine polls log at debug. The poller is a daemon thread; the event loop never
blocks on it. ``sync_once`` is also what ``POST /reload`` runs (``prediction_server.reload``
coalesces concurrent reloads into one sync in a worker thread).
"""
from __future__ import annotations

import hashlib
import io
import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from features.bundle import BundleError, list_bundles, read_bundle, read_manifest, verify_digest, version_seq
from features.loaded import LoadedBundle
from features.manifest import Manifest, ModelFile

from .acceptance import Rank
from .download import SyncFailure, bounded_get
from .service import PredictionService
from .settings import Settings

log = logging.getLogger("prediction_server.sync")

#: Largest manifest accepted (bytes).
MAX_MANIFEST_BYTES = 1 << 20
#: Upper bound of the retry backoff, in seconds (and at most 8 poll intervals).
MAX_BACKOFF_SEC = 60.0


class _HashingSink:
    """A file-like sink that hashes what it writes."""

    def __init__(self, f) -> None:
        self.f = f
        self.sha256 = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.sha256.update(data)
        self.f.write(data)


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
        self._refused: str | None = None  # the last refused remote version (logged once)
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
            log.debug("bundle poll: unchanged, serving %s", self.service.bundle.version)
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
        """Serve the best bundle of the directory the acceptance rule accepts (newest lineage,
        then highest version), falling back to the next one when a bundle is broken. A
        manifest that cannot be read is reported only when its version is above the served
        one (broken old bundles are not news)."""
        if self._dir is None:
            return None
        served_seq = self.service.served.rank.seq
        errors = []
        candidates = []
        for path in list_bundles(self._dir):
            try:
                manifest = Manifest.from_json(read_manifest(path))
                if manifest.version != path.name:
                    raise BundleError(f"{path.name}: manifest names version {manifest.version!r}")
            except BundleError as e:
                if version_seq(path.name) > served_seq:
                    errors.append(str(e))
                continue
            if self.service.refusal(manifest) is None:
                candidates.append((Rank.of_manifest(manifest).key(), path))
        for _, path in sorted(candidates, reverse=True):
            try:
                raw_manifest, files = read_bundle(path, self.settings.max_bundle_bytes)
                if raw_manifest["version"] != path.name:
                    raise BundleError(f"{path.name}: manifest names version {raw_manifest['version']!r}")
                bundle = LoadedBundle.from_files(raw_manifest, files)
            except BundleError as e:
                errors.append(str(e))
                continue  # try the next best
            if self._offer(bundle):
                if errors:
                    log.warning("skipped broken bundles: %s", "; ".join(errors))
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

    def _get(self, path: str, limit: int, deadline: float, headers: dict | None = None) -> bytes | None:
        """A small body (the manifest) in memory; None for a 304."""
        buf = io.BytesIO()
        n = bounded_get(self._http(), path, limit, deadline, buf, headers)
        return None if n is None else buf.getvalue()

    def _fetch_file(self, path: str, spec: ModelFile, deadline: float, name: str) -> bytes:
        """A model file, streamed to a temporary file (at most its declared size) and hashed
        on the way; read back into memory only once verified."""
        with tempfile.TemporaryFile(prefix="bundle-") as f:
            sink = _HashingSink(f)
            n = bounded_get(self._http(), path, spec.size, deadline, sink)
            if n is None:
                raise SyncFailure("http_status", f"GET {path}: unexpected 304", 304)
            if n < spec.size:
                raise SyncFailure("truncated", f"{path}: {n} bytes, manifest says {spec.size}")
            try:
                verify_digest(n, sink.sha256.hexdigest(), spec.to_json(), name)
            except BundleError as e:
                raise SyncFailure("checksum", str(e)) from None
            f.seek(0)
            return f.read()

    def _sync_remote(self) -> str | None:
        if not self._url:
            return None
        deadline = time.monotonic() + 3 * self.settings.sync_timeout_sec
        headers = {"If-None-Match": f'"{self._etag}"'} if self._etag else None
        try:
            resp = self._get("/v1/bundles/latest", MAX_MANIFEST_BYTES, deadline, headers)
        except SyncFailure as e:
            if e.status == 404:
                return None  # nothing published yet: not a failure
            raise
        if resp is None:
            return None  # 304: unchanged
        try:
            obj = orjson.loads(resp)
        except orjson.JSONDecodeError as e:
            raise SyncFailure("bad_json", f"manifest is not JSON: {e}") from None
        try:
            manifest = Manifest.from_json(obj)
        except BundleError as e:
            reason = "unknown_schema" if "schema" in str(e) or "raw_columns" in str(e) else "bad_manifest"
            raise SyncFailure(reason, str(e)) from None
        version = manifest.version
        why = self.service.refusal(manifest)
        if why is not None:
            # served or refused: remember it to get 304s until something else is published
            self._etag = version
            if self._refused != version:
                self._refused = version
                if version != self.service.bundle.version:
                    log.info("training server offers %s: refused (%s)", version, why)
            return None
        total = manifest.model_bytes
        if total > self.settings.max_bundle_bytes:
            raise SyncFailure("too_large", f"bundle {version} declares {total} model bytes > "
                                           f"LATENCY_MAX_BUNDLE_BYTES={self.settings.max_bundle_bytes}")
        files = {}
        for spec in manifest.models.values():
            files[spec.file] = self._fetch_file(f"/v1/bundles/{version}/{spec.file}", spec, deadline,
                                                f"{version}/{spec.file}")
        try:
            bundle = LoadedBundle.from_files(manifest, files)
        except BundleError as e:
            raise SyncFailure("load_error", str(e)) from None
        swapped = self._offer(bundle)
        if swapped:
            self._etag = version
        return swapped
