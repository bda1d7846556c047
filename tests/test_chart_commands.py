"""The standalone manifests start the servers with the commands used locally.

`latency-predictor up` (latency_cli/up.py, documented in the README) runs
`latency-training-server --host H --port P --data-dir D` and
`latency-prediction-server --host H --port P+1 --training-server-url URL`. The rendered
standalone Deployments must run the same console commands with the same flags, and,
applied in Helm's order, everything a Deployment refers to exists before it.
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from load.ports import free_ports
from conftest import stop_server, wait_http
from helm_support import CHART, REPO, argv, by_kind, one, pod_spec, render
from latency_cli.up import build_children

DATA_DIR = "/var/lib/latency-predictor"


@pytest.fixture(scope="module")
def standalone():
    return render(CHART, {"auth": {"enabled": True, "token": "tok-12345"}})


def _container(objs, component):
    return pod_spec(one(objs, "Deployment", component))["containers"][0]


def test_standalone_commands_are_the_local_up_commands(standalone):
    train_svc = one(standalone, "Service", "training")
    train_url = f"http://{train_svc['metadata']['name']}.lp.svc:8000"
    local = build_children("0.0.0.0", 8000, 1, DATA_DIR)
    local_training, local_prediction = local[0].argv, local[1].argv
    # the local prediction server polls the local training server; in the cluster, its Service
    i = local_prediction.index("--training-server-url")
    local_prediction = local_prediction[:i + 1] + [train_url] + local_prediction[i + 2:]
    assert argv(_container(standalone, "training")) == local_training
    assert argv(_container(standalone, "prediction")) == local_prediction


def test_standalone_commands_use_only_flags_the_readme_documents(standalone):
    readme = (REPO / "README.md").read_text()
    for component, command in (("training", "latency-training-server"), ("prediction", "latency-prediction-server")):
        lines = [ln for ln in readme.splitlines() if ln.startswith(command + " ")]
        assert lines, f"README documents no `{command}` command line"
        documented = set(re.findall(r"--[a-z][a-z-]*", " ".join(lines)))
        used = {a for a in argv(_container(standalone, component)) if a.startswith("--")}
        assert used <= documented, (command, used - documented)


def test_console_commands_are_the_packaged_entry_points(standalone):
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for component in ("training", "prediction"):
        command = _container(standalone, component)["command"]
        assert len(command) == 1 and command[0] in scripts
        assert scripts[command[0]] == f"{component}_server.__main__:main"


def test_applied_in_order_every_reference_exists_first(standalone):
    # Helm returns the manifests in its install order; that is the order they are applied
    position = {(o["kind"], o["metadata"]["name"]): i for i, o in enumerate(standalone)}
    for dep in by_kind(standalone, "Deployment"):
        spec = pod_spec(dep)
        needs = [("ServiceAccount", spec["serviceAccountName"])]
        needs += [("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"])
                  for v in spec["volumes"] if "persistentVolumeClaim" in v]
        needs += [("Secret", e["valueFrom"]["secretKeyRef"]["name"])
                  for c in spec["containers"] for e in c["env"] if "valueFrom" in e]
        needs += [("Service", s["metadata"]["name"]) for s in by_kind(standalone, "Service")]
        me = position[("Deployment", dep["metadata"]["name"])]
        for need in needs:
            assert need in position and position[need] < me, (dep["metadata"]["name"], need)


# ------------------------------------------------------- the rendered commands, for real


def _container_env(objs, container) -> dict[str, str]:
    """The container's environment as the kubelet would set it (Secret refs resolved)."""
    secrets = {s["metadata"]["name"]: s for s in by_kind(objs, "Secret")}
    env = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = base64.b64decode(secrets[ref["name"]]["data"][ref["key"]]).decode()
    return env


def _local_argv(container, **replace: str) -> list[str]:
    """The container's argv with the given flag values replaced (loopback, free ports, temp dir)."""
    out = argv(container)
    for flag, value in replace.items():
        i = out.index("--" + flag.replace("_", "-"))
        out[i + 1] = value
    script = Path(sys.executable).parent / out[0]
    assert script.exists(), f"{out[0]} is not installed next to {sys.executable}: run pip install -e ."
    return [str(script), *out[1:]]


def _status(url: str, data: bytes | None = None, headers: dict | None = None) -> int:
    req = urllib.request.Request(url, data=data, headers=headers or {}, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_rendered_environment_is_accepted_by_the_servers(standalone):
    from prediction_server.settings import Settings as PredictionSettings
    from training_server.settings import Settings as TrainingSettings

    t = TrainingSettings.from_env(_container_env(standalone, _container(standalone, "training")))
    p = PredictionSettings.from_env(_container_env(standalone, _container(standalone, "prediction")))
    assert (t.model_type, t.objective_type, t.quantile_alpha, t.max_stored_samples, t.api_token) == \
        ("xgboost", "quantile", 0.9, 1_000_000, "tok-12345")
    assert (p.sync_interval_sec, p.refuse_without_model, p.max_batch_rows, p.api_token) == (5.0, False, 10_000, "tok-12345")


def test_rendered_standalone_commands_start_the_servers(standalone, tmp_path):
    """Run both rendered containers' commands and environments as real processes, on
    loopback: they start, answer their probes, and the token from the Secret is enforced."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("LATENCY_") and k not in ("TRAINING_SERVER_URL", "MODEL_SYNC_INTERVAL_SEC")}
    tc, pc = _container(standalone, "training"), _container(standalone, "prediction")
    tport = free_ports(2)
    pport = tport + 1
    train_url, pred_url = f"http://127.0.0.1:{tport}", f"http://127.0.0.1:{pport}"
    procs = []
    try:
        for container, args, url in (
            (tc, dict(host="127.0.0.1", port=str(tport), data_dir=str(tmp_path / "data")), train_url),
            (pc, dict(host="127.0.0.1", port=str(pport), training_server_url=train_url), pred_url),
        ):
            log = open(tmp_path / f"{container['name']}.log", "wb")
            procs.append(subprocess.Popen(_local_argv(container, **args), env={**base, **_container_env(standalone, container)},
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                          cwd=tmp_path))
            wait_http(url + container["startupProbe"]["httpGet"]["path"], timeout=90, proc=procs[-1])
        for container, url in ((tc, train_url), (pc, pred_url)):
            assert _status(url + container["livenessProbe"]["httpGet"]["path"]) == 200
        # no model trained yet: the standalone prediction readiness probe keeps it out of its Service
        assert _status(pred_url + pc["readinessProbe"]["httpGet"]["path"]) == 503
        # ... while the training server's readiness probe lets samples in
        assert _status(train_url + tc["readinessProbe"]["httpGet"]["path"]) == 200
        body = json.dumps({"entries": []}).encode()
        ctype = {"Content-Type": "application/json"}
        assert _status(train_url + "/add_training_data_bulk", body, ctype) == 401
        assert _status(train_url + "/add_training_data_bulk", body, {**ctype, "Authorization": "Bearer tok-12345"}) == 202
    finally:
        for p in reversed(procs):
            stop_server(p)
    for p in procs:
        assert p.returncode is not None


def test_rendered_sidecars_start_and_the_epp_urls_and_probes_work(tmp_path):
    """The example EPP pod's sidecar containers, run as real processes with their rendered
    commands and environments: every URL the EPP gets answers, and the in-container exec
    probes succeed against them."""
    from helm_support import sidecar_chart

    base_port = free_ports(4)
    objs = render(sidecar_chart(tmp_path), {"latencyPredictor": {
        "training": {"port": base_port, "dataDir": str(tmp_path / "data")},
        "predictionServers": {"count": 3, "startPort": base_port + 1}}})
    cs = pod_spec(one(objs, "Deployment"))["containers"]
    epp = next(c for c in cs if c["name"] == "epp")
    ours = [c for c in cs if c is not epp]
    env = {e["name"]: e["value"] for e in epp["env"]}
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("LATENCY_") and k not in ("TRAINING_SERVER_URL", "MODEL_SYNC_INTERVAL_SEC")}
    procs = []
    try:
        for c in ours:  # exactly as rendered: loopback, the rendered ports and data dir
            log = open(tmp_path / f"{c['name']}.log", "wb")
            procs.append(subprocess.Popen(_local_argv(c), env={**base, **_container_env(objs, c)}, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path))
        urls = [env["TRAINING_SERVER_URL"], *env["PREDICTION_SERVER_URL"].split(",")]
        assert len(urls) == 4
        for url, p in zip(urls, procs):
            wait_http(url + "/healthz", timeout=90, proc=p)
        for c in ours:
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = subprocess.run(c[kind]["exec"]["command"], capture_output=True, timeout=30)
                assert probe.returncode == 0, (c["name"], kind, probe.stderr[-500:])
        # the probe checks the status: the same command on /readyz fails (no model yet: 503)
        not_ready = [a.replace("GET /healthz ", "GET /readyz ") for a in ours[1]["readinessProbe"]["exec"]["command"]]
        assert not_ready != ours[1]["readinessProbe"]["exec"]["command"]
        assert subprocess.run(not_ready, capture_output=True, timeout=30).returncode != 0
    finally:
        for p in reversed(procs):
            stop_server(p)
    # and a probe fails once its server is gone
    dead = subprocess.run(ours[1]["livenessProbe"]["exec"]["command"], capture_output=True, timeout=30)
    assert dead.returncode != 0


def test_every_server_setting_is_exposed_by_the_chart():
    """Each environment variable the servers read is set by the chart (from a value), or
    given by a command-line flag; only the benchmark-only route switch is left out."""
    import dataclasses

    from prediction_server.settings import Settings as PredictionSettings
    from training_server.settings import Settings as TrainingSettings

    objs = render(CHART, {"auth": {"enabled": True, "token": "tok-12345"},
                          "training": {"seedBundle": "/seed"}, "predictionServers": {"bundleDir": "/bundles"}})
    flags = {"--host": ("LATENCY_TRAINING_HOST", "LATENCY_PREDICTION_HOST"),
             "--port": ("LATENCY_TRAINING_PORT", "LATENCY_PREDICTION_PORT"),
             "--data-dir": ("LATENCY_DATA_DIR",), "--training-server-url": ("TRAINING_SERVER_URL",)}
    ps = PredictionSettings()
    server_vars = {
        "training": set(TrainingSettings().env_names().values()),
        "prediction": {ps.env_name(f.name) for f in dataclasses.fields(ps)} - {"LATENCY_ENABLE_BENCH_ROUTES"},
    }
    for component, wanted in server_vars.items():
        c = _container(objs, component)
        covered = {e["name"] for e in c["env"]}
        covered |= {v for a in argv(c) if a in flags for v in flags[a]}
        assert wanted - covered == set(), f"{component} settings the chart cannot set: {sorted(wanted - covered)}"
