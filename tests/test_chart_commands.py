"""The standalone manifests start the servers with the commands used locally.

`latency-predictor up` (latency_cli/up.py, documented in the README) runs
`latency-training-server --host H --port P --data-dir D` and
`latency-prediction-server --host H --port P+1 --training-server-url URL`. The rendered
standalone Deployments must run the same console commands with the same flags, and,
applied in Helm's order, everything a Deployment refers to exists before it.
"""
from __future__ import annotations

import re

import pytest

from helm_support import CHART, REPO, argv, by_kind, one, pod_spec, render
from latency_cli.up import build_children

DATA_DIR = "/var/lib/latency-predictor"


@pytest.fixture(scope="module")
def standalone():
    return render(CHART, {"auth": {"enabled": True, "token": "tok"}})


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
