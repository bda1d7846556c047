"""prediction_server: the stateless prediction service (docs/wire-api.md §1.2 and §2).

Modules:
- ``settings``: the one validated ``Settings`` (``Settings.from_env(environ, **overrides)``).
- ``service``: ``PredictionService``, plain Python (bytes in, (status, bytes) out), holding
  the served bundle behind one reference (``swap`` never accepts an older version).
- ``sync``: ``BundleSync``, the poller (training server ``/v1/bundles/latest`` with ETag, and/or a
  local bundle directory), verifying size and sha256 before loading and swapping.
- ``app``: ``create_app(settings) -> FastAPI``; prediction routes are raw ASGI handlers.
- ``metrics``: per-app Prometheus registry.
- ``acceptance``: which bundle may replace the served one (lineage, version).

The loaded bundle and the manifest are ``features.loaded`` and ``features.manifest`` (shared
with the training server; the two servers never import each other).
- ``__main__``: ``latency-prediction-server`` (uvicorn, uvloop + httptools, one thread).
"""
