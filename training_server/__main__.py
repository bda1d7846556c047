"""``latency-training-server [--host H] [--port P] [--data-dir D]``: run the training server.

Settings come from the environment (see ``training_server.settings``); each flag overrides
its variable. A bad setting stops the server at start-up with exit code 2 and a message
naming it. SIGTERM/SIGINT shut down cleanly: the retrain worker is told to stop and the
store writer commits everything queued before the process exits.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from .settings import Settings, SettingsError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="latency-training-server", description=__doc__.split("\n\n")[1])
    p.add_argument("--host", help="bind address (LATENCY_TRAINING_HOST, default 127.0.0.1)")
    p.add_argument("--port", help="TCP port (LATENCY_TRAINING_PORT, default 8000)")
    p.add_argument("--data-dir", help="sample store and bundles (LATENCY_DATA_DIR, default ./latency-data)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = Settings.from_cli(os.environ, {"host": ("--host", args.host), "port": ("--port", args.port),
                                                  "data_dir": ("--data-dir", args.data_dir)})
    except SettingsError as e:
        print(f"latency-training-server: bad setting {e}", file=sys.stderr)
        return 2
    from .datadir import DataDirError, claim

    try:  # held until the process ends: one server per data directory
        claim(settings.data_dir)
    except DataDirError as e:
        source = "--data-dir" if args.data_dir is not None else Settings.env_name("data_dir")
        print(f"latency-training-server: {source} {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from .app import create_app

    app = create_app(settings)
    log = logging.getLogger("training_server")
    log.info("training server listening on http://%s:%d (data in %s, token %s)", settings.host, settings.port,
             settings.data_dir, "required" if settings.api_token else "not required")
    config = uvicorn.Config(app, host=settings.host, port=settings.port, loop="uvloop", http="httptools",
                            log_level=settings.log_level, access_log=False, timeout_graceful_shutdown=10)
    server = uvicorn.Server(config)
    # uvicorn turns SIGTERM/SIGINT into a graceful shutdown (lifespan: worker stopped, store
    # drained) and then re-raises the signal to the handler that was installed before it:
    # make that one a normal exit (status 0) instead of death by signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    server.run()
    log.info("training server stopped")
    return 0


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    sys.exit(main())
