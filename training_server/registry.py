"""The model registry: published bundles on disk and the one being served.

Bundles live in ``<data_dir>/bundles/<version>/`` (written atomically by
``features.bundle.write_bundle``). The served bundle is the newest one that verifies and
loads; it is swapped by reference, so readers never see a half-updated state and no lock
is held while a bundle is written or loaded. The last ``keep`` bundles stay on disk.
"""
from __future__ import annotations

import base64
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from features.bundle import (
    FILE_RE,
    MANIFEST,
    VERSION_RE,
    BundleError,
    list_bundles,
    make_version,
    prune_bundles,
    read_bundle,
    verify_file,
    version_seq,
    write_bundle,
)
from features.loaded import LoadedBundle
from features.manifest import Manifest

log = logging.getLogger("training_server.registry")

EXPORT_FORMAT = "latency-bundle-export/1"
#: learned versions remembered for live feedback (is_learned_version)
KNOWN_VERSIONS = 256


def export_document(manifest: Manifest, files: Mapping[str, bytes]) -> dict:
    """A bundle as one JSON document (``GET /model/export``): manifest + base64 files."""
    return {"format": EXPORT_FORMAT, "manifest": manifest.to_json(),
            "files": {name: base64.b64encode(data).decode("ascii") for name, data in files.items()}}


def parse_export(doc: Mapping) -> tuple[Manifest, dict[str, bytes]]:
    """Inverse of :func:`export_document`; verifies every file against the manifest."""
    if not isinstance(doc, Mapping) or doc.get("format") != EXPORT_FORMAT:
        raise BundleError(f"not a {EXPORT_FORMAT} document")
    manifest = Manifest.from_json(doc.get("manifest"))
    raw_files = doc.get("files")
    if not isinstance(raw_files, Mapping):
        raise BundleError("export.files must be an object")
    files: dict[str, bytes] = {}
    for spec in manifest.models.values():
        b64 = raw_files.get(spec.file)
        if not isinstance(b64, str):
            raise BundleError(f"export.files.{spec.file} missing")
        try:
            data = base64.b64decode(b64, validate=True)
        except ValueError:
            raise BundleError(f"export.files.{spec.file} is not base64") from None
        verify_file(data, spec.to_json())
        files[spec.file] = data
    return manifest, files


def read_seed(path: Path) -> tuple[Manifest, dict[str, bytes]]:
    """A seed bundle: a bundle directory, or a file holding a ``GET /model/export`` document."""
    if path.is_dir():
        manifest, files = read_bundle(path)
        return Manifest.from_json(manifest), files
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise BundleError(f"{path}: cannot read export document: {e}") from None
    return parse_export(doc)


def write_export_dir(doc: Mapping, out: Path) -> Path:
    """Write an export document as a bundle directory ``out/<version>`` (a LATENCY_SEED_BUNDLE)."""
    manifest, files = parse_export(doc)
    return write_bundle(Path(out), manifest.to_json(), files)


class Registry:
    """Published bundles and the served one (initially the built-in prior)."""

    def __init__(self, root: Path, *, keep: int, quantile: float = 0.9) -> None:
        self.root = Path(root)
        self.keep = keep
        self.quantile = quantile
        self._lock = threading.Lock()  # serialises publishers only; readers use the reference
        self._served: LoadedBundle = LoadedBundle.builtin_prior(quantile)
        self._files: dict[str, bytes] = {}
        self._seq = 0
        #: features.bundle.make_lineage of the sample store: stamped on every published manifest
        self.lineage: dict | None = None
        #: versions served by this registry since start-up, newest last (bounded)
        self._known: OrderedDict[str, None] = OrderedDict()

    # ---- start-up ----------------------------------------------------------------------
    def load(self, seed: Path | None = None) -> LoadedBundle:
        """Serve the newest bundle on disk that verifies; import ``seed`` if there is none."""
        bundles = list_bundles(self.root)
        if bundles:
            self._seq = version_seq(bundles[-1].name)
        for path in reversed(bundles):
            try:
                manifest, files = read_bundle(path)
                bundle = LoadedBundle.from_files(manifest, files)
            except BundleError as e:
                log.error("skipping bundle %s: %s", path.name, e)
                continue
            self._swap(bundle, files)
            log.info("serving bundle %s from disk", bundle.version)
            return bundle
        if seed is not None:
            seed_manifest, seed_files = read_seed(seed)
            # row ids of another deployment's store mean nothing here; where the seed came
            # from, by its identity (never a local filesystem path)
            seeded = seed_manifest.updated(trained_on=None, seeded_from={"version": seed_manifest.version,
                                                                         "lineage": seed_manifest.lineage})
            bundle = self.publish(seeded, seed_files)
            log.info("imported seed bundle %s from %s as %s", seed_manifest.version, seed, bundle.version)
            return bundle
        return self._served

    # ---- state ---------------------------------------------------------------------------
    @property
    def served(self) -> LoadedBundle:
        return self._served

    @property
    def is_learned(self) -> bool:
        return self._served.source == "learned"

    def served_files(self) -> dict[str, bytes]:
        return dict(self._files)

    def versions(self) -> list[str]:
        return [p.name for p in list_bundles(self.root)]

    def next_version(self) -> str:
        return make_version(self._seq + 1)

    # ---- publishing ----------------------------------------------------------------------
    def publish(self, manifest: Manifest, files: Mapping[str, bytes]) -> LoadedBundle:
        """Write a bundle (re-versioned to this registry's next sequence), verify, serve it."""
        with self._lock:
            changes: dict = {"version": make_version(self._seq + 1)}
            if self.lineage is not None:
                changes["lineage"] = dict(self.lineage)
            final = write_bundle(self.root, manifest.updated(**changes).to_json(), files)
            self._seq += 1
            disk_manifest, disk_files = read_bundle(final)  # what readers will download
            bundle = LoadedBundle.from_files(disk_manifest, disk_files)
            self._swap(bundle, disk_files)
            for p in prune_bundles(self.root, self.keep):
                log.info("pruned bundle %s", p.name)
        log.info("published bundle %s (%s, targets %s)", bundle.version, bundle.model_kind,
                 sorted(bundle.manifest.models))
        return bundle

    def is_learned_version(self, version: str) -> bool:
        """True for a learned bundle this registry served recently (live feedback may come
        from a version that was replaced a moment ago)."""
        return version in self._known

    def _swap(self, bundle: LoadedBundle, files: Mapping[str, bytes]) -> None:
        if bundle.source == "learned":
            self._known[bundle.version] = None
            while len(self._known) > KNOWN_VERSIONS:
                self._known.popitem(last=False)
        self._files = dict(files)
        self._served = bundle

    # ---- downloads -------------------------------------------------------------------------
    def latest_manifest(self) -> dict | None:
        """Manifest (JSON) of the newest published (= served) bundle, None before the first one."""
        return self._served.manifest.to_json() if self.is_learned else None

    def read_file(self, version: str, name: str) -> bytes | None:
        """Bytes of one model file of a kept bundle; None for anything not listed in its manifest."""
        if not VERSION_RE.match(version) or not FILE_RE.match(name) or name == MANIFEST:
            return None
        served = self._served
        if served.version == version:
            return self._files.get(name)
        path = self.root / version
        try:
            manifest = Manifest.from_json(json.loads((path / MANIFEST).read_bytes()))
        except (OSError, ValueError):
            return None
        if name not in {spec.file for spec in manifest.models.values()}:
            return None
        try:
            return (path / name).read_bytes()
        except OSError:
            return None

    def export(self) -> dict | None:
        if not self.is_learned:
            return None
        return export_document(self._served.manifest, self._files)
