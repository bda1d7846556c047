"""``latency-prediction-server``: run one prediction server (uvicorn, uvloop + httptools).

    latency-prediction-server [--host H] [--port P] [--training-server-url URL] [--bundle-dir D]

Flags override the environment variables of :mod:`prediction_server.settings`. A bad
setting exits with status 2 and a message naming it.
"""
from __future__ import annotations

import os

# One thread per server process (scale by processes, never by OpenMP threads): set before
# xgboost/lightgbm are imported; the model loaders also pass nthread=1.
os.environ["OMP_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402

from .settings import Settings, SettingsError, redact_url  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="latency-prediction-server",
                                description="Latency prediction server (see prediction_server/settings.py "
                                            "for the environment variables).")
    p.add_argument("--host", help="bind address (LATENCY_PREDICTION_HOST, default 127.0.0.1)")
    p.add_argument("--port", help="bind port (LATENCY_PREDICTION_PORT, default 8001)")
    p.add_argument("--training-server-url", help='bundle source (TRAINING_SERVER_URL); "" = none')
    p.add_argument("--bundle-dir", help="local bundle directory to watch (LATENCY_BUNDLE_DIR)")
    p.add_argument("--sync-interval", help="seconds between bundle polls (MODEL_SYNC_INTERVAL_SEC)")
    p.add_argument("--enable-bench-routes", action="store_true", default=None,
                   help="serve POST /bench/noop (LATENCY_ENABLE_BENCH_ROUTES); benchmarks only")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = Settings.from_cli(os.environ, {
            "host": ("--host", args.host), "port": ("--port", args.port),
            "training_server_url": ("--training-server-url", args.training_server_url),
            "bundle_dir": ("--bundle-dir", args.bundle_dir),
            "sync_interval_sec": ("--sync-interval", args.sync_interval),
            "enable_bench_routes": ("--enable-bench-routes", args.enable_bench_routes)})
    except SettingsError as e:
        print(f"latency-prediction-server: bad setting {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("prediction_server")
    if settings.log_level != "debug":
        # httpx logs every request at info: a bundle poll every few seconds is routine
        # (debug); swaps and refusals are logged at info by the sync itself
        logging.getLogger("httpx").setLevel(logging.WARNING)

    import uvicorn

    from .app import create_app

    app = create_app(settings)
    sources = []
    if settings.bundle_dir:
        sources.append(f"directory {settings.bundle_dir}")
    if settings.training_server_url:
        sources.append(f"{redact_url(settings.training_server_url)}/v1/bundles/latest "
                       f"every {settings.sync_interval_sec:g}s")
    log.info("prediction server listening on http://%s:%d; bundles from %s", settings.host, settings.port,
             " and ".join(sources) or "nowhere (serving the built-in prior)")
    if settings.enable_bench_routes:
        log.warning("benchmark routes enabled (POST /bench/noop): do not use in production")
    config = uvicorn.Config(app, host=settings.host, port=settings.port, loop="uvloop", http="httptools",
                            access_log=settings.access_log, log_level=settings.log_level, lifespan="on",
                            timeout_graceful_shutdown=5, proxy_headers=False, server_header=False)
    server = uvicorn.Server(config)
    server.run()  # handles SIGINT/SIGTERM: stops accepting, drains, runs lifespan shutdown
    return 0


if __name__ == "__main__":
    sys.exit(main())
