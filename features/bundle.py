"""Model bundles: the manifest's rules and safe writing/reading of bundle directories.

A bundle is a directory named by its version holding ``manifest.json`` and one native
model file per target (XGBoost UBJSON/JSON, LightGBM text). Nothing here unpickles or
executes anything: files are bytes checked against the manifest's size and sha256.

This module works on the manifest's JSON (the keys are listed in :mod:`features.manifest`,
whose ``Manifest.from_json`` calls :func:`validate_manifest` and gives the typed value the
servers read).

Every number in a manifest must be finite, and the numbers the hot path uses must be in a
sane range (:func:`validate_numbers`), so a forged or corrupted manifest is refused
before it can make a server answer ``null`` or absurd latencies.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .matrix import KNOWN_FEATURES, REGIME_NAMES, SUPPORTED_SCHEMAS, TARGETS
from .prior import validate_base, validate_prior
from .schema import ENGINE_COEFFICIENTS, MAX_ENGINE_NAME_LEN, RAW_COLUMNS

MANIFEST = "manifest.json"
MODEL_KINDS = ("xgboost", "lightgbm", "prior")
MODEL_FORMATS = {"xgboost": ("xgboost-ubj", "xgboost-json"), "lightgbm": ("lightgbm-text",)}
OBJECTIVES = ("quantile", "mean")
MODES = ("streaming", "e2e")
VERSION_RE = re.compile(r"^v\d{6,}-\d{8}T\d{6}Z$")
FILE_RE = re.compile(r"^[a-z0-9_]+\.(ubj|json|txt)$")
#: A model file larger than this is refused (bounded downloads and memory).
MAX_MODEL_FILE_BYTES = 256 * 1024 * 1024
#: Largest magnitude of a latency-valued manifest number (offsets, spreads, intercepts): one hour.
MAX_ABS_MS = 3_600_000.0
#: Range of a calibration scale (a multiplicative factor on model outputs).
SCALE_RANGE = (1e-3, 1e3)
#: Largest magnitude of a prior coefficient (ms per unit of a feature).
MAX_ABS_COEF = 1e6
#: Range of an engine step coefficient (ms per unit of its step sum) and of an endpoint's speed.
ENGINE_COEF_RANGE = (0.0, 1e4)
ENGINE_SPEED_RANGE = (1e-3, 1e3)
#: Most endpoint classes and endpoints an engine section may name (bounds the manifest).
MAX_ENGINE_ENTRIES = 10_000
LINEAGE_ID_RE = re.compile(r"^[0-9a-f]{8,64}$")
#: A lineage created further than this in the future (seconds, clock skew) is refused: it
#: would otherwise outrank every lineage to come and pin the fleet.
MAX_LINEAGE_SKEW_SEC = 86_400.0


class BundleError(ValueError):
    """A bundle or manifest is malformed, unsupported or fails verification."""


def make_version(seq: int, when: datetime | None = None) -> str:
    when = when or datetime.now(UTC)
    return f"v{seq:06d}-{when.strftime('%Y%m%dT%H%M%SZ')}"


def version_seq(version: str) -> int:
    if not VERSION_RE.match(version):
        raise BundleError(f"bad bundle version {version!r}")
    return int(version[1:version.index("-")])


def make_lineage(store_id: str, created_at: float) -> dict:
    """A manifest's ``lineage``: the sample store its bundle comes from, created once with
    the store (``id``: uuid4 hex; ``created_at``: unix seconds) and kept across restarts.
    A store started empty is a new, newer lineage; versions compare only within one."""
    lineage = {"id": str(store_id), "created_at": created_at}
    validate_lineage(lineage)
    return {"id": lineage["id"], "created_at": float(created_at)}


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    try:
        validate_prior(m["prior"])
        base = validate_base(m["base"]) if m.get("base") is not None else {}
        for t, b in base.items():  # a target without trees is answered by its base alone
            if t not in models and b["link"] != "add":
                raise ValueError(f"base.{t}: a target without a model needs link 'add' (the base alone), "
                                 f"not {b['link']!r}")
    except (ValueError, TypeError) as e:
        raise BundleError(f"manifest.{e}") from None
    if m["model_kind"] != "prior" and not models and not base:
        raise BundleError("manifest.models is empty for a learned bundle (and no target has a base)")
    validate_numbers(m)
    if m.get("engine") is not None:
        validate_engine(m["engine"])
    if m.get("lineage") is not None:
        validate_lineage(m["lineage"])
    return dict(m)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(path: str, value: Any, lo: float, hi: float) -> float:
    if not _number(value) or not math.isfinite(value) or not lo <= value <= hi:
        raise BundleError(f"manifest.{path} = {value!r} is not a finite number in [{lo:g}, {hi:g}]")
    return float(value)


def validate_calibration(target: str, spec: Any) -> None:
    """One target's calibration as a manifest must hold it: scales in SCALE_RANGE, offsets
    within +-MAX_ABS_MS, globally and per regime (BundleError naming the key)."""
    if target not in TARGETS or not isinstance(spec, Mapping):
        raise BundleError(f"manifest.calibration.{target} is not a target's calibration object")
    entries = [(f"calibration.{target}", spec)]
    by = spec.get("by_regime") or {}
    if not isinstance(by, Mapping):
        raise BundleError(f"manifest.calibration.{target}.by_regime must be an object")
    for regime, r in by.items():
        if regime not in REGIME_NAMES or not isinstance(r, Mapping):
            raise BundleError(f"manifest.calibration.{target}.by_regime.{regime}: not one of {REGIME_NAMES}")
        entries.append((f"calibration.{target}.by_regime.{regime}", r))
    for path, e in entries:
        _check(f"{path}.scale", e.get("scale", 1.0), *SCALE_RANGE)
        _check(f"{path}.offset_ms", e.get("offset_ms", 0.0), -MAX_ABS_MS, MAX_ABS_MS)


def validate_numbers(m: Mapping) -> None:
    """Every number anywhere in the manifest is finite; the ones the hot path uses are in
    range: calibration scales in SCALE_RANGE and offsets within +-MAX_ABS_MS (globally and
    per regime, regimes named by REGIME_NAMES), residual spreads in [0, MAX_ABS_MS], prior
    intercepts within +-MAX_ABS_MS and coefficients within +-MAX_ABS_COEF. Raises
    BundleError naming the key."""
    stack: list[tuple[str, Any]] = [("", m)]
    while stack:  # iterative: a deeply nested manifest cannot exhaust the stack
        path, v = stack.pop()
        if isinstance(v, Mapping):
            stack.extend((f"{path}.{k}" if path else str(k), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, float) and not math.isfinite(v):
            raise BundleError(f"manifest.{path} is not finite ({v!r})")
    cal = m.get("calibration") or {}
    if not isinstance(cal, Mapping):
        raise BundleError("manifest.calibration must be an object")
    for target, spec in cal.items():
        validate_calibration(target, spec)
    metrics = m.get("metrics") or {}
    if not isinstance(metrics, Mapping):
        raise BundleError("manifest.metrics must be an object")
    for target in TARGETS:
        entry = metrics.get(target)
        if isinstance(entry, Mapping) and entry.get("residual_std") is not None:
            _check(f"metrics.{target}.residual_std", entry["residual_std"], 0.0, MAX_ABS_MS)
    for target in TARGETS:
        p = m["prior"][target]
        _check(f"prior.{target}.intercept", p.get("intercept", 0.0), -MAX_ABS_MS, MAX_ABS_MS)
        for name, w in (p.get("coef") or {}).items():
            _check(f"prior.{target}.coef.{name}", w, -MAX_ABS_COEF, MAX_ABS_COEF)


def _count(path: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BundleError(f"manifest.{path} = {value!r} is not a non-negative integer")


def _names(path: str, obj: Any) -> Mapping:
    if not isinstance(obj, Mapping) or len(obj) > MAX_ENGINE_ENTRIES:
        raise BundleError(f"manifest.{path} must be an object of at most {MAX_ENGINE_ENTRIES} entries")
    for name in obj:
        if not isinstance(name, str) or not 0 < len(name) <= MAX_ENGINE_NAME_LEN:
            raise BundleError(f"manifest.{path}: {str(name)[:40]!r} is not a name of 1 to {MAX_ENGINE_NAME_LEN} "
                              "characters")
    return obj


def validate_engine(engine: Any) -> None:
    """The learned engine step model (training_server.engine_fit): ``{"rows": n, "classes":
    {class: {"coefficients": {name: ms per unit}, "n_train", "n_heldout", "heldout_error",
    "endpoints": {endpoint: {"speed", "n"}}}}}``. Every coefficient of
    features.schema.ENGINE_COEFFICIENTS in ENGINE_COEF_RANGE, speeds in ENGINE_SPEED_RANGE,
    counts non-negative integers, the held-out error in [0, 1e6]. Raises BundleError naming the key."""
    if not isinstance(engine, Mapping):
        raise BundleError("manifest.engine must be an object")
    _count("engine.rows", engine.get("rows", 0))
    for cls, spec in _names("engine.classes", engine.get("classes")).items():
        path = f"engine.classes.{cls}"
        if not isinstance(spec, Mapping) or not isinstance(spec.get("coefficients"), Mapping):
            raise BundleError(f"manifest.{path} must be an object with coefficients")
        for name in ENGINE_COEFFICIENTS:
            _check(f"{path}.coefficients.{name}", spec["coefficients"].get(name), *ENGINE_COEF_RANGE)
        for key in ("n_train", "n_heldout"):
            _count(f"{path}.{key}", spec.get(key, 0))
        if spec.get("heldout_error") is not None:
            _check(f"{path}.heldout_error", spec["heldout_error"], 0.0, 1e6)
        for ep, e in _names(f"{path}.endpoints", spec.get("endpoints", {})).items():
            if not isinstance(e, Mapping):
                raise BundleError(f"manifest.{path}.endpoints.{ep} must be an object")
            _check(f"{path}.endpoints.{ep}.speed", e.get("speed"), *ENGINE_SPEED_RANGE)
            _count(f"{path}.endpoints.{ep}.n", e.get("n", 0))


def validate_lineage(lineage: Any, now: float | None = None) -> tuple[str, float]:
    """``{"id": lowercase hex (8-64 chars), "created_at": unix seconds}``, created no later
    than MAX_LINEAGE_SKEW_SEC from ``now``; returns (id, created_at)."""
    if not isinstance(lineage, Mapping):
        raise BundleError("manifest.lineage must be an object {id, created_at}")
    lid = lineage.get("id")
    if not isinstance(lid, str) or not LINEAGE_ID_RE.match(lid):
        raise BundleError("manifest.lineage.id must be 8 to 64 lowercase hex characters")
    now = time.time() if now is None else now
    created = _check("lineage.created_at", lineage.get("created_at"), 1e9, now + MAX_LINEAGE_SKEW_SEC)
    return lid, created


def verify_file(data: bytes, spec: Mapping, name: str = "") -> None:
    """Raise BundleError unless ``data`` matches the manifest entry's size and sha256."""
    verify_digest(len(data), sha256_bytes(data), spec, name)


def verify_digest(size: int, sha256: str, spec: Mapping, name: str = "") -> None:
    """Raise BundleError unless a file's size and sha256 (computed while streaming it)
    match the manifest entry."""
    if size != spec["size"]:
        raise BundleError(f"{name or spec['file']}: size {size} != manifest {spec['size']}")
    if sha256 != spec["sha256"]:
        raise BundleError(f"{name or spec['file']}: sha256 mismatch")


def write_bundle(root: Path, manifest: dict, files: Mapping[str, bytes]) -> Path:
    """Write a bundle atomically: temp dir in ``root``, fsync, rename to ``root/version``.

    ``files`` maps file name to bytes; the manifest's ``models`` entries get their size and
    sha256 filled from those bytes. Returns the final directory.
    """
    root.mkdir(parents=True, exist_ok=True)
    manifest = dict(manifest)
    models = {t: dict(spec) for t, spec in manifest.get("models", {}).items()}
    for spec in models.values():
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


def read_manifest(path: Path, max_bytes: int = 1 << 20) -> dict:
    """Read and validate the manifest of a bundle directory (at most ``max_bytes``)."""
    try:
        with open(path / MANIFEST, "rb") as f:
            raw = f.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise BundleError(f"{path}: manifest larger than {max_bytes} bytes")
        manifest = json.loads(raw)
    except (OSError, ValueError, RecursionError) as e:
        raise BundleError(f"{path}: cannot read manifest: {e}") from None
    return validate_manifest(manifest)


def declared_bytes(manifest: Mapping) -> int:
    """Total size of a bundle's model files, as its manifest declares them."""
    return sum(int(spec["size"]) for spec in manifest["models"].values())


def read_bundle(path: Path, max_bytes: int | None = None) -> tuple[dict, dict[str, bytes]]:
    """Read and verify a bundle directory; returns (manifest, {file name: bytes}). With
    ``max_bytes``, a bundle declaring more model bytes is refused before anything is read,
    and no file is read past its declared size."""
    manifest = read_manifest(path)
    if max_bytes is not None and declared_bytes(manifest) > max_bytes:
        raise BundleError(f"{path}: model files declare {declared_bytes(manifest)} bytes > limit {max_bytes}")
    files: dict[str, bytes] = {}
    for spec in manifest["models"].values():
        try:
            with open(path / spec["file"], "rb") as f:
                data = f.read(spec["size"] + 1)
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
