"""Run the Helm chart through real Helm (the Go library, via ``helm-python-sdk``).

``render`` performs ``helm install --dry-run=client`` (what ``helm template`` does): the
chart's values are validated against ``values.schema.json``, the templates rendered, and
the manifests returned in Helm's install order. ``lint`` is ``helm lint --strict`` with
values. ``validate_objects`` checks every rendered object against the Kubernetes OpenAPI
schemas (``kubernetes-validate``, strict: unknown fields are errors).

Both packages are test requirements (see the chart's README, "Testing the chart"):
    pip install 'helm-python-sdk==0.2.2' 'kubernetes-validate==1.37.0'
A missing package fails the test with that message; it never skips.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "latency-predictor"
EXAMPLE_EPP = CHART / "examples" / "epp-sidecar"
INSTALL_HINT = "pip install 'helm-python-sdk==0.2.2' 'kubernetes-validate==1.37.0'"

#: Kubernetes versions the rendered objects must validate against: the chart's
#: kubeVersion floor and the newest schema kubernetes-validate ships.
KUBE_VERSIONS = ("1.27", "1.37")


def _helm():
    try:
        import helm_python
    except ImportError as e:  # pragma: no cover - exercised only on a machine without it
        pytest.fail(f"the chart tests need real Helm (helm-python-sdk): {e}; install with: {INSTALL_HINT}")
    return helm_python


def _kubernetes_validate():
    try:
        import kubernetes_validate
    except ImportError as e:  # pragma: no cover
        pytest.fail(f"the chart tests need kubernetes-validate: {e}; install with: {INSTALL_HINT}")
    return kubernetes_validate


class RenderError(Exception):
    """Helm refused the values or failed to render; ``str()`` is Helm's message."""


def render(chart: Path, values: dict[str, Any] | None = None, *, release: str = "rel",
           namespace: str = "lp") -> list[dict]:
    """``helm install --dry-run=client``: the objects, in Helm's install order."""
    helm = _helm()
    ch = helm.Chart.load(str(chart))
    cfg = helm.Config(namespace=namespace, storage_driver="memory")
    try:
        rel = cfg.install(ch, release, values, namespace=namespace, dry_run="client")
    except helm.HelmError as e:
        raise RenderError(str(e)) from e
    finally:
        cfg.close()
        ch.close()
    return [doc for doc in yaml.safe_load_all(rel.get("manifest") or "") if doc]


def lint(chart: Path, values: dict[str, Any] | None = None) -> dict:
    """``helm lint --strict`` with values: the report (messages with severity)."""
    return _helm().lint(str(chart), values, strict=True)


def lint_problems(report: dict) -> list[str]:
    """Lint findings of severity warning or error (info, e.g. "icon is recommended", is ok)."""
    problems = [f"{m['path']}: {m['error']}" for m in report.get("messages", []) if m["severity"] >= 2]
    return problems + list(report.get("errors") or [])


def sidecar_chart(tmp_path: Path) -> Path:
    """The example EPP chart (examples/epp-sidecar) with its dependency on this chart
    resolved by ``helm dependency update`` (``file://../..``, packaged through the
    chart's .helmignore), in a copy of the chart under ``tmp_path``."""
    copy = tmp_path / "latency-predictor"
    shutil.copytree(CHART, copy, ignore=shutil.ignore_patterns("__pycache__", "charts", "Chart.lock"))
    epp = copy / "examples" / EXAMPLE_EPP.name
    _helm().dependency_update(str(epp), skip_refresh=True)
    return epp


def validate_objects(objs: list[dict]) -> list[str]:
    """Validate every object against the Kubernetes schemas; returns the failures.

    Objects of kinds the Kubernetes schemas do not define (the Prometheus Operator's
    ServiceMonitor) are reported unless they are in ``CRD_KINDS``; those get the
    structural checks of ``check_servicemonitor`` instead.
    """
    kv = _kubernetes_validate()
    failures = []
    for obj in objs:
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        if obj.get("kind") in CRD_KINDS and obj.get("apiVersion") == CRD_KINDS[obj["kind"]]:
            continue
        for version in KUBE_VERSIONS:
            try:
                kv.validate(obj, version, strict=True)
            except kv.ValidationError as e:
                failures.append(f"{name} (k8s {version}): {str(e).splitlines()[0]} at {list(e.path)}")
            except kv.SchemaNotFoundError as e:
                failures.append(f"{name} (k8s {version}): no schema: {e}")
    return failures


CRD_KINDS = {"ServiceMonitor": "monitoring.coreos.com/v1"}


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict], kind: str, component: str | None = None) -> dict:
    found = [o for o in by_kind(objs, kind)
             if component is None or o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]
    assert len(found) == 1, f"expected one {kind} {component or ''}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def containers(objs: list[dict]) -> list[tuple[str, dict]]:
    """(workload name, container) for every container of every workload."""
    out = []
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            spec = pod_spec(o)
            for c in spec.get("initContainers", []) + spec["containers"]:
                out.append((o["metadata"]["name"], c))
    return out


def env_of(container: dict) -> dict[str, Any]:
    """name -> value (str) or valueFrom (dict)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def argv(container: dict) -> list[str]:
    return list(container.get("command", [])) + list(container.get("args", []))


def default_values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())
