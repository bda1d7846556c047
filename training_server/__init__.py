"""The training server: durable samples in, gated model bundles out (docs/wire-api.md §1.3, §2).

Modules (each usable in-process without a server):

* ``settings``  - ``Settings.from_env(environ, **overrides)``, every ``LATENCY_*`` variable.
* ``store``     - ``SampleStore``: SQLite (WAL, synchronous=FULL), one group-committing
  writer, bounded queue (``Saturated`` -> 429), bounded rows (stratified eviction).
* ``sampling``  - strata (queue x KV x prefix buckets), the deterministic held-out split,
  the stratified newest-first training set.
* ``trainer``   - ``train_models(raw, ttft, tpot, config=TrainConfig())``, ``build_bundle`` (a typed
  ``features.manifest.Manifest`` and the model files, for ``Registry.publish``), ``loaded_bundle``.
  Scores are ``features.scoring``; the loaded bundle is ``features.loaded`` (shared with the
  prediction server, which this package never imports).
* ``registry``  - published bundles on disk and the served one; export / seed documents.
* ``worker``    - ``RetrainWorker``: interval + new-data trigger, per-target publish gate.
* ``feedback``  - ``LiveFeedback``: live (actual, predicted) pairs from ingestion, owned by
  the worker (live error window, drift, the correction's queue).
* ``correction`` - ``LiveCorrection``: the live factor (adaptive conformal) and its hand-over.
* ``metrics``   - Prometheus metrics on a per-app registry (observe only).
* ``service``   - ``TrainingService``: ingest, run a cycle, predict, flush; no transport
  (the simulator uses it as is, on simulated time).
* ``app``       - ``create_app(settings)`` (FastAPI), an HTTP adapter over ``TrainingService``.
* ``export``    - ``python -m training_server.export URL DIR``: a seed bundle directory.

Run it with ``latency-training-server [--host H] [--port P] [--data-dir D]``.
"""
