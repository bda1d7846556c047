"""Model bundles: the manifest (a wire type) and safe writing/reading of bundle directories.

A bundle is a directory named by its version holding ``manifest.json`` and one native
model file per target (XGBoost UBJSON/JSON, LightGBM text). Nothing here unpickles or
executes anything: files are bytes checked against the manifest's size and sha256.

Manifest keys (all JSON)::

    version          "v000042-20261202T124500Z" (sortable; the ETag)
    created_at       RFC 3339
    schema_version   int, features.schema.SCHEMA_VERSION at training time
    features         features.matrix.schema_description()
    model_kind       "xgboost" | "lightgbm" | "prior"   (prior: no model files)
    objective        "quantile" | "mean"
    quantile         float in (0, 1)
    mode             "streaming" | "e2e"
    models           {target: {"file", "format", "size", "sha256"}}   (targets present)
    prior            {target: {"intercept", "coef": {feature: w}}}     (always present)
    base             {target: {"intercept", "coef": {feature: w >= 0}, "link": "add"}}  (optional:
                     the linear base a target's trees learn the residual over; see features.prior)
    calibration      {target: {"offset_ms": float, "scale": float,
                               "by_regime": {regime: {"offset_ms", "scale"}}}}  (optional)
    training         {target: {"n_train": int, "n_test": int}}
    metrics          {target: {"pinball": float, "coverage": float, ...}}
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from .matrix import KNOWN_FEATURES, SUPPORTED_SCHEMAS, TARGETS
from .schema import RAW_COLUMNS
from .prior import validate_base, validate_prior

MANIFEST = "manifest.json"
MODEL_KINDS = ("xgboost", "lightgbm", "prior")
MODEL_FORMATS = {"xgboost": ("xgboost-ubj", "xgboost-json"), "lightgbm": ("lightgbm-text",)}
OBJECTIVES = ("quantile", "mean")
MODES = ("streaming", "e2e")
VERSION_RE = re.compile(r"^v\d{6,}-\d{8}T\d{6}Z$")
FILE_RE = re.compile(r"^[a-z0-9_]+\.(ubj|json|txt)$")
#: A model file larger than this is refused (bounded downloads and memory).
MAX_MODEL_FILE_BYTES = 256 * 1024 * 1024


class BundleError(ValueError):
    """A bundle or manifest is malformed, unsupported or fails verification."""


def make_version(seq: int, when: datetime | None = None) -> str:
    when = when or datetime.now(timezone.utc)
    return f"v{seq:06d}-{when.strftime('%Y%m%dT%H%M%SZ')}"


def version_seq(version: str) -> int:
    if not VERSION_RE.match(version):
        raise BundleError(f"bad bundle version {version!r}")
    return int(version[1:version.index("-")])


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def validate_manifest(m: Any) -> dict:
    """Check a manifest's structure; raise BundleError naming the bad key."""
    if not isinstance(m, Mapping):
        raise BundleError("manifest must be a JSON object")
    for key in ("version", "schema_version", "model_kind", "objective", "quantile", "mode", "models", "prior"):
        if key not in m:
            raise BundleError(f"manifest.{key} missing")
    version_seq(str(m["version"]))
    if m["schema_version"] not in SUPPORTED_SCHEMAS:
        raise BundleError(f"manifest.schema_version {m['schema_version']!r} is not supported "
                          f"(this server knows {sorted(SUPPORTED_SCHEMAS)})")
    feats = m.get("features")
    if feats is not None:
        if not isinstance(feats, Mapping) or list(feats.get("raw_columns", [])) != list(RAW_COLUMNS):
            raise BundleError("manifest.features.raw_columns do not match this server's schema")
        for target, names in (feats.get("features") or {}).items():
            if target not in TARGETS or not isinstance(names, list) or not names:
                raise BundleError(f"manifest.features.features.{target} is malformed")
            unknown = [n for n in names if n not in KNOWN_FEATURES]
            if unknown:
                raise BundleError(f"manifest.features.features.{target}: unknown features {unknown}")
    if m["model_kind"] not in MODEL_KINDS:
        raise BundleError(f"manifest.model_kind {m['model_kind']!r} not in {MODEL_KINDS}")
    if m["objective"] not in OBJECTIVES:
        raise BundleError(f"manifest.objective {m['objective']!r} not in {OBJECTIVES}")
    q = m["quantile"]
    if not isinstance(q, (int, float)) or not 0 < q < 1:
        raise BundleError("manifest.quantile must be in (0, 1)")
    if m["mode"] not in MODES:
        raise BundleError(f"manifest.mode {m['mode']!r} not in {MODES}")
    models = m["models"]
    if not isinstance(models, Mapping):
        raise BundleError("manifest.models must be an object")
    for target, spec in models.items():
        if target not in TARGETS:
            raise BundleError(f"manifest.models: unknown target {target!r}")
        if not isinstance(spec, Mapping):
            raise BundleError(f"manifest.models.{target} must be an object")
        for key in ("file", "format", "size", "sha256"):
            if key not in spec:
                raise BundleError(f"manifest.models.{target}.{key} missing")
        if not FILE_RE.match(str(spec["file"])):
            raise BundleError(f"manifest.models.{target}.file {spec['file']!r} is not a plain model file name")
        if spec["format"] not in MODEL_FORMATS.get(m["model_kind"], ()):
            raise BundleError(f"manifest.models.{target}.format {spec['format']!r} does not match model_kind")
        if not isinstance(spec["size"], int) or not 0 < spec["size"] <= MAX_MODEL_FILE_BYTES:
            raise BundleError(f"manifest.models.{target}.size out of range")
        if not re.fullmatch(r"[0-9a-f]{64}", str(spec["sha256"])):
            raise BundleError(f"manifest.models.{target}.sha256 is not a sha256 hex digest")
    if m["model_kind"] != "prior" and not models:
        raise BundleError("manifest.models is empty for a learned bundle")
    try:
        validate_prior(m["prior"])
        if "base" in m:
            for t in validate_base(m["base"]):
                if t not in models:
                    raise ValueError(f"base.{t}: no model for this target")
    except (ValueError, TypeError) as e:
        raise BundleError(f"manifest.{e}") from None
    return dict(m)


def verify_file(data: bytes, spec: Mapping, name: str = "") -> None:
    """Raise BundleError unless ``data`` matches the manifest entry's size and sha256."""
    if len(data) != spec["size"]:
        raise BundleError(f"{name or spec['file']}: size {len(data)} != manifest {spec['size']}")
    if sha256_bytes(data) != spec["sha256"]:
        raise BundleError(f"{name or spec['file']}: sha256 mismatch")


def write_bundle(root: Path, manifest: dict, files: Mapping[str, bytes]) -> Path:
    """Write a bundle atomically: temp dir in ``root``, fsync, rename to ``root/version``.

    ``files`` maps file name to bytes; the manifest's ``models`` entries get their size and
    sha256 filled from those bytes. Returns the final directory.
    """
    root.mkdir(parents=True, exist_ok=True)
    manifest = dict(manifest)
    models = {t: dict(spec) for t, spec in manifest.get("models", {}).items()}
    for target, spec in models.items():
        data = files[spec["file"]]
        spec["size"] = len(data)
        spec["sha256"] = sha256_bytes(data)
    manifest["models"] = models
    validate_manifest(manifest)
    final = root / manifest["version"]
    if final.exists():
        raise BundleError(f"bundle {manifest['version']} already exists")
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        for name, data in files.items():
            _write_synced(tmp / name, data)
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False).encode())
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_bundle(path: Path) -> tuple[dict, dict[str, bytes]]:
    """Read and verify a bundle directory; returns (manifest, {file name: bytes})."""
    try:
        manifest = json.loads((path / MANIFEST).read_bytes())
    except (OSError, ValueError) as e:
        raise BundleError(f"{path}: cannot read manifest: {e}") from None
    manifest = validate_manifest(manifest)
    files: dict[str, bytes] = {}
    for target, spec in manifest["models"].items():
        try:
            data = (path / spec["file"]).read_bytes()
        except OSError as e:
            raise BundleError(f"{path}: cannot read {spec['file']}: {e}") from None
        verify_file(data, spec, f"{manifest['version']}/{spec['file']}")
        files[spec["file"]] = data
    return manifest, files


def list_bundles(root: Path) -> list[Path]:
    """Complete bundle directories under ``root``, oldest first (by sequence number)."""
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and VERSION_RE.match(p.name) and (p / MANIFEST).is_file():
            out.append(p)
    return sorted(out, key=lambda p: version_seq(p.name))


def prune_bundles(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` bundles (and stale temp dirs); returns removed."""
    removed = []
    bundles = list_bundles(root)
    for p in bundles[: max(0, len(bundles) - keep)]:
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    if root.is_dir():
        for p in root.glob(".tmp-*"):
            shutil.rmtree(p, ignore_errors=True)
    return removed


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
