"""Export the served bundle of a running training server into a seed directory.

``python -m training_server.export URL OUT_DIR`` fetches ``URL/model/export`` and writes
``OUT_DIR/<version>/`` (manifest + verified model files): pass that directory as
``LATENCY_SEED_BUNDLE`` to a new deployment. The saved export JSON document itself is
also accepted as ``LATENCY_SEED_BUNDLE``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from features.bundle import BundleError

from .registry import write_export_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training_server.export", description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="training server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("out_dir", help="directory to write the bundle into")
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    import httpx

    try:
        r = httpx.get(args.url.rstrip("/") + "/model/export", timeout=args.timeout)
        r.raise_for_status()
        path = write_export_dir(r.json(), Path(args.out_dir))
    except (httpx.HTTPError, ValueError, BundleError) as e:
        print(f"export failed: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
