"""prediction_server: the stateless prediction service (docs/wire-api.md §1.2 and §2).

Modules:
- ``settings``: the one validated ``Settings`` (``Settings.from_env(environ, **overrides)``).
- ``service``: ``PredictionService``, plain Python (bytes in, (status, bytes) out), holding
  the served bundle behind one reference (``swap`` never accepts an older version).
- ``sync``: ``BundleSync``, the poller (training server ``/v1/bundles/latest`` with ETag, and/or a
  local bundle directory), verifying size and sha256 before loading and swapping.
- ``app``: ``create_app(settings) -> FastAPI``; prediction routes are raw ASGI handlers.
- ``metrics``: per-app Prometheus registry.
- ``model``: ``LoadedBundle`` (shared with the training server).
- ``demo_bundle``, ``testing``: real bundles from a recorded trace and test servers.
- ``__main__``: ``latency-prediction-server`` (uvicorn, uvloop + httptools, one thread).
"""
