"""Command line of the gateway: parse flags, validate settings, run uvicorn."""
from __future__ import annotations

import argparse
import logging
import sys

from .settings import GatewaySettings, SettingsError


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="latency-predictor gateway",
                                 description="OpenAI-compatible routing gateway in front of model servers")
    ap.add_argument("--endpoints", type=lambda s: [x for x in s.split(",") if x.strip()],
                    help="comma-separated base URLs of the model servers (env LATENCY_GATEWAY_ENDPOINTS)")
    ap.add_argument("--config", help="EndpointPickerConfig for the epp_client scheduler: a YAML file or a well-known "
                                     "name (predicted-latency-recommended, predicted-latency-slo)")
    ap.add_argument("--host", help="bind address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, help="listen port (default 8080)")
    ap.add_argument("--prediction-urls", dest="prediction_urls",
                    type=lambda s: [x for x in s.split(",") if x.strip()],
                    help="prediction servers (env PREDICTION_SERVER_URL)")
    ap.add_argument("--training-url", dest="training_url", help="training server (env TRAINING_SERVER_URL)")
    ap.add_argument("--scrape-interval", dest="scrape_interval_s", type=float)
    ap.add_argument("--first-byte-timeout", dest="first_byte_timeout_s", type=float)
    ap.add_argument("--idle-timeout", dest="idle_timeout_s", type=float)
    ap.add_argument("--request-timeout", dest="request_timeout_s", type=float)
    ap.add_argument("--max-attempts", dest="max_attempts", type=int)
    ap.add_argument("--block-size-tokens", dest="block_size_tokens", type=int)
    ap.add_argument("--objective", dest="objectives", action="append", default=[],
                    help="NAME=PRIORITY for x-llm-d-inference-objective (repeatable)")
    ap.add_argument("--log-level", default="warning")
    return ap


def make_router(settings: GatewaySettings):
    """The routing policy: the epp_client scheduler when a config is given (behind flow
    control when the config has a ``flowControl`` section), else the built-in least-load one."""
    if settings.config is None:
        from epp_client.heuristics import LeastLoadScheduler

        return LeastLoadScheduler()
    from epp_client.profiles import config_text

    from .flowgate import FlowGate
    from .routing import build_scheduler

    return FlowGate.wrap(build_scheduler(settings), config_text(settings.config), settings.scrape_interval_s)


def startup_lines(settings: GatewaySettings, router, url: str) -> list[str]:
    """What the gateway prints once it listens: where, what it routes to, which predictor."""
    from .core import ROUTES

    admin = ("/gateway/endpoints, /gateway/requests, /gateway/flow with the admin token"
             if settings.admin_token else "admin endpoints off: no LATENCY_GATEWAY_ADMIN_TOKEN")
    lines = [f"[gateway] listening on {url} (POST {', '.join(ROUTES)}; GET /metrics, /healthz; {admin})",
             f"[gateway] endpoints ({len(settings.endpoints)}): {', '.join(settings.endpoints)}"]
    if settings.config is None:
        lines.append(f"[gateway] routing: built-in least-load router ({router.name}; no --config)")
        lines.append("[gateway] predictor: none (the built-in router uses no predictions)")
        return lines
    lines.append(f"[gateway] routing: epp_client scheduler from {settings.config}")
    producer = getattr(router, "producer", None)
    if producer is None:
        lines.append("[gateway] predictor: none (the config has no predicted-latency producer)")
    else:
        servers = ", ".join(a.url for a in producer.predictor.servers)
        lines.append(f"[gateway] predictor: prediction servers {servers}; "
                     f"training server {producer.sink.addr.url}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    objectives: dict[str, int] = {}
    for item in args.objectives:
        name, _, prio = item.partition("=")
        try:
            objectives[name] = int(prio)
        except ValueError:
            print(f"gateway: --objective {item!r}: expected NAME=INTEGER", file=sys.stderr)
            return 2
    d = vars(args).copy()
    d["objectives"] = objectives
    try:
        settings = GatewaySettings.from_env_and_args(d)
        router = make_router(settings)
    except (SettingsError, ValueError, OSError) as e:
        print(f"gateway: bad setting: {e}", file=sys.stderr)
        return 2
    import uvicorn

    from .app import build_app
    from .core import Gateway

    logging.basicConfig(level=args.log_level.upper())
    gw = Gateway(settings, router)
    config = uvicorn.Config(build_app(gw), host=settings.host, port=settings.port, log_level=args.log_level,
                            lifespan="on", timeout_graceful_shutdown=5)
    sock = config.bind_socket()  # bound here so the printed URL carries the real port (even for --port 0)
    sock.listen(2048)  # connections made from now on wait in the backlog until the server accepts
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    for line in startup_lines(settings, router, url):
        print(line, flush=True)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    return 0
