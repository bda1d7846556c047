"""The Helm chart (charts/latency-predictor) through real Helm: lint, render, schema
validation of the values, Kubernetes schema validation of every rendered object, and the
behaviour platform teams rely on (sidecar count/ports/EPP env, alias, standalone
objects, security context, probes, token from a Secret, dashboard)."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from helm_support import (CHART, CRD_KINDS, RenderError, by_kind, containers, default_values,
                          env_of, lint, lint_problems, one, pod_spec, render, sidecar_chart, validate_objects)

# ----------------------------------------------------------------------------- value sets

STANDALONE_SETS = {
    "defaults": {},
    "everything-on": {
        "auth": {"enabled": True, "token": "s3cret-token"},
        "serviceMonitor": {"enabled": True},
        "dashboard": {"enabled": True},
        "predictionServers": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6}},
        "training": {"pdb": {"enabled": True}},
    },
    "lightgbm-existing-claim-and-secret": {
        "training": {"modelType": "lightgbm", "objectiveType": "mean", "retrainingIntervalSec": 10,
                     "persistence": {"existingClaim": "my-claim"}},
        "auth": {"enabled": True, "existingSecret": "team-token", "secretKey": "api-token"},
        "image": {"registry": "registry.example.com/ml", "digest": "sha256:" + "a" * 64},
    },
    "no-persistence-custom-ports": {
        "training": {"port": 9000, "persistence": {"enabled": False}},
        "predictionServers": {"startPort": 9100, "replicas": 3, "pdb": {"enabled": False}},
        "serviceAccount": {"create": False},
    },
}

SIDECAR_SETS = {
    "example-defaults": {},
    "count-1": {"latencyPredictor": {"predictionServers": {"count": 1}}},
    "alias-2-with-auth": {"latencyPredictor": {"predictionServerCount": 2, "auth": {"enabled": True, "token": "sidecar-token"}}},
    "bind-all-with-data-claim": {"latencyPredictor": {"sidecar": {"bindAddress": "0.0.0.0",
                                                                  "dataVolume": {"persistentVolumeClaim": {"claimName": "epp-data"}}},
                                                      "auth": {"enabled": True, "token": "bind-all-token"},
                                                      "predictionServers": {"count": 4, "startPort": 8101}}},
}


@pytest.fixture(scope="module")
def epp_chart(tmp_path_factory) -> Path:
    return sidecar_chart(tmp_path_factory.mktemp("sidecar"))


@pytest.fixture(scope="module")
def standalone_renders() -> dict[str, list[dict]]:
    return {name: render(CHART, values) for name, values in STANDALONE_SETS.items()}


@pytest.fixture(scope="module")
def sidecar_renders(epp_chart) -> dict[str, list[dict]]:
    return {name: render(epp_chart, values) for name, values in SIDECAR_SETS.items()}


def _ours(container: dict) -> bool:
    return container.get("command", [None])[0] in ("latency-training-server", "latency-prediction-server")


# ---------------------------------------------------------------------------------- lint


@pytest.mark.parametrize("name", STANDALONE_SETS)
def test_lint_standalone_is_clean(name):
    assert lint_problems(lint(CHART, STANDALONE_SETS[name])) == []


@pytest.mark.parametrize("name", SIDECAR_SETS)
def test_lint_example_epp_chart_is_clean(epp_chart, name):
    assert lint_problems(lint(epp_chart, SIDECAR_SETS[name])) == []


def test_lint_reports_a_broken_value():
    # the lint wrapper is not vacuous: a value the schema refuses is a lint error
    problems = lint_problems(lint(CHART, {"training": {"modelType": "catboost"}}))
    assert any("modelType" in p for p in problems), problems


# --------------------------------------------------------------- Kubernetes schema checks


def _consistency_problems(objs: list[dict]) -> list[str]:
    """Cross-object references a schema cannot see."""
    problems = []
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    workloads = by_kind(objs, "Deployment")
    for svc in by_kind(objs, "Service"):
        sel = svc["spec"]["selector"]
        backing = [d for d in workloads if sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        if len(backing) != 1:
            problems.append(f"Service {svc['metadata']['name']} selects {len(backing)} Deployments")
            continue
        port_names = {p.get("name") for c in pod_spec(backing[0])["containers"] for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            if p["targetPort"] not in port_names:
                problems.append(f"Service {svc['metadata']['name']} targets missing port {p['targetPort']}")
    for d in workloads:
        if not d["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items():
            problems.append(f"Deployment {d['metadata']['name']} selector does not match its pods")
        spec = pod_spec(d)
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        port_names = [p["name"] for c in spec["containers"] for p in c.get("ports", []) if "name" in p]
        if len(port_names) != len(set(port_names)):
            problems.append(f"Deployment {d['metadata']['name']} has duplicate port names {port_names}")
        for c in spec["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] not in vols:
                    problems.append(f"{c['name']} mounts undefined volume {m['name']}")
        for v in vols.values():
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in ("my-claim", "epp-data") and ("PersistentVolumeClaim", claim) not in names:
                problems.append(f"{d['metadata']['name']} uses claim {claim} that is not rendered")
        sa = spec.get("serviceAccountName")
        if sa and sa != "default" and ("ServiceAccount", sa) not in names:
            problems.append(f"{d['metadata']['name']} uses service account {sa} that is not rendered")
    for hpa in by_kind(objs, "HorizontalPodAutoscaler"):
        if ("Deployment", hpa["spec"]["scaleTargetRef"]["name"]) not in names:
            problems.append(f"HPA {hpa['metadata']['name']} targets a missing Deployment")
    for pdb in by_kind(objs, "PodDisruptionBudget"):
        sel = pdb["spec"]["selector"]["matchLabels"]
        if not any(sel.items() <= d["spec"]["template"]["metadata"]["labels"].items() for d in workloads):
            problems.append(f"PDB {pdb['metadata']['name']} selects no pods")
    for sm in by_kind(objs, "ServiceMonitor"):
        sel = sm["spec"]["selector"]["matchLabels"]
        svcs = [s for s in by_kind(objs, "Service") if sel.items() <= s["metadata"]["labels"].items()]
        if len(svcs) != 1 or {e["port"] for e in sm["spec"]["endpoints"]} - {p["name"] for p in svcs[0]["spec"]["ports"]}:
            problems.append(f"ServiceMonitor {sm['metadata']['name']} does not match one Service port")
    return problems


@pytest.mark.parametrize("name", STANDALONE_SETS)
def test_standalone_objects_validate_against_kubernetes_schemas(standalone_renders, name):
    objs = standalone_renders[name]
    assert validate_objects(objs) == []
    assert _consistency_problems(objs) == []
    unknown = {o["kind"] for o in objs} - {"Deployment", "Service", "PersistentVolumeClaim", "ServiceAccount",
                                             "Secret", "ConfigMap", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                                             *CRD_KINDS}
    assert not unknown


@pytest.mark.parametrize("name", SIDECAR_SETS)
def test_sidecar_objects_validate_against_kubernetes_schemas(sidecar_renders, name):
    objs = sidecar_renders[name]
    assert validate_objects(objs) == []
    assert _consistency_problems(objs) == []
    # sidecar mode renders no workload of its own: only the EPP Deployment (+ token Secret)
    assert [o["kind"] for o in objs if o["kind"] != "Secret"] == ["Deployment"]


def test_validation_catches_an_invalid_object(standalone_renders):
    dep = copy.deepcopy(one(standalone_renders["defaults"], "Deployment", "training"))
    pod_spec(dep)["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True  # misspelt field
    bad_port = copy.deepcopy(one(standalone_renders["defaults"], "Service", "training"))
    bad_port["spec"]["ports"][0]["port"] = "eight thousand"
    failures = validate_objects([dep, bad_port])
    assert len(failures) == 2 * 2, failures  # each object, at each Kubernetes version


# ------------------------------------------------------------------------- sidecar mode


def _sidecar_parts(objs):
    dep = one(objs, "Deployment")
    cs = pod_spec(dep)["containers"]
    epp = [c for c in cs if not _ours(c)]
    training = [c for c in cs if c.get("command") == ["latency-training-server"]]
    prediction = [c for c in cs if c.get("command") == ["latency-prediction-server"]]
    return dep, epp, training, prediction


def _flag(container, flag):
    a = container["args"]
    return a[a.index(flag) + 1]


def test_sidecar_count_three_gives_three_prediction_servers_and_epp_urls(epp_chart):
    objs = render(epp_chart, {"latencyPredictor": {"predictionServers": {"count": 3}}})
    _, epp, training, prediction = _sidecar_parts(objs)
    assert len(epp) == 1 and len(training) == 1
    assert [c["ports"][0]["containerPort"] for c in prediction] == [8001, 8002, 8003]
    assert [_flag(c, "--port") for c in prediction] == ["8001", "8002", "8003"]
    assert len({c["name"] for c in prediction}) == 3
    assert _flag(training[0], "--port") == "8000" and training[0]["ports"][0]["containerPort"] == 8000
    env = env_of(epp[0])
    assert env["PREDICTION_SERVER_URL"].split(",") == [f"http://127.0.0.1:{p}" for p in (8001, 8002, 8003)]
    assert env["TRAINING_SERVER_URL"] == "http://127.0.0.1:8000"
    # every prediction server polls the training server in the same pod, over loopback
    assert {_flag(c, "--training-server-url") for c in prediction} == {"http://127.0.0.1:8000"}
    # sidecars stay on loopback (invariant 7): the EPP is in the same pod
    assert {_flag(c, "--host") for c in training + prediction} == {"127.0.0.1"}
    # llm-d's EPP settings come along
    assert env["LATENCY_MAX_SAMPLE_SIZE"] == "10000" and env["LATENCY_COALESCE_WINDOW_MS"] == "1"
    # ... and the EPP clients accept them (a bad value would stop the EPP at start-up)
    from epp_client.settings import PredictorSettings, ReporterSettings

    ps, rs = PredictorSettings.from_env(env), ReporterSettings.from_env(env)
    assert (len(ps.urls), ps.coalesce_window_ms, ps.max_concurrent_dispatches) == (3, 1, 36)
    assert (rs.url, rs.max_sample_size) == ("http://127.0.0.1:8000", 10000)


@pytest.mark.parametrize("values, expected", [
    ({"predictionServerCount": 2}, 2),
    ({"predictionServerCount": 5, "predictionServers": {"count": 1}}, 5),  # the alias wins
    ({"predictionServers": {"count": 2}}, 2),
])
def test_prediction_server_count_alias(epp_chart, values, expected):
    objs = render(epp_chart, {"latencyPredictor": values})
    _, epp, _, prediction = _sidecar_parts(objs)
    ports = [8001 + i for i in range(expected)]
    assert [c["ports"][0]["containerPort"] for c in prediction] == ports
    assert env_of(epp[0])["PREDICTION_SERVER_URL"] == ",".join(f"http://127.0.0.1:{p}" for p in ports)


def test_sidecar_probes_run_inside_the_container_on_loopback(sidecar_renders):
    _, _, training, prediction = _sidecar_parts(sidecar_renders["example-defaults"])
    for c in training + prediction:
        port = c["ports"][0]["containerPort"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            cmd = " ".join(c[kind]["exec"]["command"])
            # readiness must not wait for a learned model: the EPP pod would never get the
            # traffic that trains one
            assert f"('127.0.0.1',{port})" in cmd and "GET /healthz " in cmd, (c["name"], kind, cmd)


def test_sidecar_bound_to_all_interfaces_uses_http_probes(sidecar_renders):
    _, epp, training, prediction = _sidecar_parts(sidecar_renders["bind-all-with-data-claim"])
    assert [c["ports"][0]["containerPort"] for c in prediction] == [8101, 8102, 8103, 8104]
    for c in training + prediction:
        assert _flag(c, "--host") == "0.0.0.0"
        assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": c["ports"][0]["containerPort"]}


def test_sidecar_bound_to_all_interfaces_needs_the_token(epp_chart):
    # loopback is the safe default; leaving it exposes every server on the pod IP, so
    # the chart refuses to do that without auth
    with pytest.raises(RenderError, match=r"sidecar.bindAddress 0.0.0.0 .*auth.enabled"):
        render(epp_chart, {"latencyPredictor": {"sidecar": {"bindAddress": "0.0.0.0"}}})
    objs = render(epp_chart, {"latencyPredictor": {"sidecar": {"bindAddress": "0.0.0.0"},
                                                   "auth": {"enabled": True, "token": "bind-all-token"}}})
    _, _, training, prediction = _sidecar_parts(objs)
    assert {_flag(c, "--host") for c in training + prediction} == {"0.0.0.0"}
    assert all("LATENCY_API_TOKEN" in env_of(c) for c in training + prediction)


def test_sidecar_token_comes_from_the_rendered_secret(sidecar_renders):
    objs = sidecar_renders["alias-2-with-auth"]
    secret = one(objs, "Secret")
    _, _, training, prediction = _sidecar_parts(objs)
    for c in training + prediction:
        ref = env_of(c)["LATENCY_API_TOKEN"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["data"]


def test_sidecar_port_collision_is_refused(epp_chart):
    with pytest.raises(RenderError, match="training.port 8002 collides"):
        render(epp_chart, {"latencyPredictor": {"training": {"port": 8002}, "predictionServers": {"count": 3}}})


# ---------------------------------------------------------------------- standalone mode


def test_standalone_objects(standalone_renders):
    objs = standalone_renders["defaults"]
    train = one(objs, "Deployment", "training")
    pred = one(objs, "Deployment", "prediction")
    # one writer on the sample store, never two pods on the volume at once
    assert train["spec"]["replicas"] == 1 and train["spec"]["strategy"]["type"] == "Recreate"
    pvc = one(objs, "PersistentVolumeClaim")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "10Gi"
    tc = pod_spec(train)["containers"][0]
    data_vol = [v["name"] for v in pod_spec(train)["volumes"]
                if v.get("persistentVolumeClaim", {}).get("claimName") == pvc["metadata"]["name"]]
    assert [m["mountPath"] for m in tc["volumeMounts"] if m["name"] in data_vol] == [_flag(tc, "--data-dir")]
    assert pred["spec"]["replicas"] == 2
    assert not by_kind(objs, "HorizontalPodAutoscaler") and not by_kind(objs, "ServiceMonitor")
    assert one(objs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    # the prediction servers find the training server through its Service
    svc = one(objs, "Service", "training")
    url = f"http://{svc['metadata']['name']}.lp.svc:{svc['spec']['ports'][0]['port']}"
    assert _flag(pod_spec(pred)["containers"][0], "--training-server-url") == url
    # in-cluster Services only (no cloud load balancer)
    assert {s["spec"]["type"] for s in by_kind(objs, "Service")} == {"ClusterIP"}
    # containers bind all interfaces explicitly: the Services reach them on the pod IP
    assert {_flag(c, "--host") for _, c in containers(objs)} == {"0.0.0.0"}


def test_standalone_optional_objects(standalone_renders):
    objs = standalone_renders["everything-on"]
    pred = one(objs, "Deployment", "prediction")
    hpa = one(objs, "HorizontalPodAutoscaler")
    assert "replicas" not in pred["spec"]  # the HPA owns the replica count
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert len(by_kind(objs, "ServiceMonitor")) == 2 and len(by_kind(objs, "PodDisruptionBudget")) == 2
    cm = one(objs, "ConfigMap", "dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["latency-predictor.json"]) == json.loads(
        (CHART / "dashboards" / "latency-predictor.json").read_text())


def test_standalone_existing_claim_secret_and_image(standalone_renders):
    objs = standalone_renders["lightgbm-existing-claim-and-secret"]
    assert not by_kind(objs, "PersistentVolumeClaim") and not by_kind(objs, "Secret")
    train = one(objs, "Deployment", "training")
    assert {v["name"]: v for v in pod_spec(train)["volumes"]}["data"]["persistentVolumeClaim"]["claimName"] == "my-claim"
    for _, c in containers(objs):
        assert c["image"] == "registry.example.com/ml/latency-predictor@sha256:" + "a" * 64
        assert env_of(c)["LATENCY_API_TOKEN"] == {"secretKeyRef": {"name": "team-token", "key": "api-token"}}
    env = env_of(pod_spec(train)["containers"][0])
    assert (env["LATENCY_MODEL_TYPE"], env["LATENCY_OBJECTIVE_TYPE"], env["LATENCY_RETRAINING_INTERVAL_SEC"]) == \
        ("lightgbm", "mean", "10")


def test_standalone_custom_ports_and_no_persistence(standalone_renders):
    objs = standalone_renders["no-persistence-custom-ports"]
    train, pred = one(objs, "Deployment", "training"), one(objs, "Deployment", "prediction")
    assert not by_kind(objs, "PersistentVolumeClaim") and not by_kind(objs, "ServiceAccount")
    assert {v["name"]: v for v in pod_spec(train)["volumes"]}["data"] == {"name": "data", "emptyDir": {}}
    assert one(objs, "Service", "training")["spec"]["ports"][0]["port"] == 9000
    assert one(objs, "Service", "prediction")["spec"]["ports"][0]["port"] == 9100
    assert _flag(pod_spec(pred)["containers"][0], "--training-server-url").endswith(":9000")
    assert pred["spec"]["replicas"] == 3 and not by_kind(objs, "PodDisruptionBudget")


def test_standalone_probes(standalone_renders):
    objs = standalone_renders["defaults"]
    tc = pod_spec(one(objs, "Deployment", "training"))["containers"][0]
    pc = pod_spec(one(objs, "Deployment", "prediction"))["containers"][0]
    for c, ready in ((tc, "/healthz"), (pc, "/readyz")):
        port = c["ports"][0]["containerPort"]
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
        assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": port}
        # training: must take samples before it has any model; prediction: only learned models get traffic
        assert c["readinessProbe"]["httpGet"] == {"path": ready, "port": port}


def test_token_is_never_a_plain_value(standalone_renders):
    objs = standalone_renders["everything-on"]
    secret = one(objs, "Secret")
    assert secret["data"]["token"] == "czNjcmV0LXRva2Vu"  # base64("s3cret-token"), only inside the Secret
    for _, c in containers(objs):
        ref = env_of(c)["LATENCY_API_TOKEN"]["secretKeyRef"]
        assert ref == {"name": secret["metadata"]["name"], "key": "token"}
    assert "s3cret-token" not in yaml.safe_dump([o for o in objs if o["kind"] != "Secret"])


# -------------------------------------------------------------------- security context

HARDENED = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "privileged": False}


def test_every_container_has_the_security_context(standalone_renders, sidecar_renders):
    seen = 0
    for renders in (standalone_renders, sidecar_renders):
        for name, objs in renders.items():
            for workload, c in containers(objs):
                sc = c.get("securityContext", {})
                where = f"{name}: {workload}/{c['name']}"
                assert {k: sc.get(k) for k in HARDENED} == HARDENED, where
                assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add"), where
                if _ours(c):
                    seen += 1
                    assert sc["runAsUser"] != 0 and sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
                    # a read-only root filesystem needs a writable /tmp
                    assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, where
    assert seen >= 20


# ------------------------------------------------------------------ values schema refusals

INVALID = [
    ({"predictionServers": {"count": -1}}, "/predictionServers/count"),
    ({"predictionServers": {"count": 0}}, "/predictionServers/count"),
    ({"training": {"modelType": "catboost"}}, "/training/modelType"),
    ({"training": {"objectiveType": "median"}}, "/training/objectiveType"),
    ({"predictionServerCount": -3}, "/predictionServerCount"),
    ({"quantileAlpha": 1.5}, "/quantileAlpha"),
    ({"mode": "daemonset"}, "/mode"),
    ({"image": {"tag": "latest"}}, "/image/tag"),
    ({"training": {"port": 70000}}, "/training/port"),
    ({"predictionServers": {"service": {"type": "LoadBalancer"}}}, "/predictionServers/service/type"),
    ({"containerSecurityContext": {"readOnlyRootFilesystem": False}}, "/containerSecurityContext/readOnlyRootFilesystem"),
    ({"containerSecurityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}},
     "/containerSecurityContext/capabilities/add"),
    ({"training": {"testTrainRatio": 0.7}}, "/training/testTrainRatio"),
    ({"predictionServers": {"countt": 3}}, "countt"),
    ({"auth": {"enabled": True, "token": "short"}}, "/auth/token"),
]


@pytest.mark.parametrize("values, field", INVALID, ids=[f for _, f in INVALID])
def test_invalid_values_are_refused_by_the_schema(values, field):
    with pytest.raises(RenderError) as e:
        render(CHART, values)
    assert field in str(e.value)


@pytest.mark.parametrize("values, field", [INVALID[0], INVALID[2], INVALID[4]], ids=["count", "modelType", "alias"])
def test_invalid_values_are_refused_inside_an_epp_chart(epp_chart, values, field):
    with pytest.raises(RenderError) as e:
        render(epp_chart, {"latencyPredictor": values})
    assert field in str(e.value)


def test_an_inflight_budget_below_the_largest_body_is_refused():
    with pytest.raises(RenderError, match="maxInflightBytes 16777216 must be >= training.maxBodyBytes 33554432"):
        render(CHART, {"training": {"maxBodyBytes": 33554432}})


def test_auth_without_a_token_source_is_refused():
    with pytest.raises(RenderError, match="auth.enabled needs"):
        render(CHART, {"auth": {"enabled": True}})


# ------------------------------------------------------------------ settings and defaults

#: The server settings of the design with their documented defaults.
TRAINING_DEFAULTS = {
    "LATENCY_MODEL_TYPE": "xgboost", "LATENCY_OBJECTIVE_TYPE": "quantile", "LATENCY_QUANTILE_ALPHA": "0.9",
    "LATENCY_RETRAINING_INTERVAL_SEC": "2", "LATENCY_MIN_SAMPLES_FOR_RETRAIN": "100",
    "LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET": "5000", "LATENCY_TEST_TRAIN_RATIO": "0.1",
    "LATENCY_MAX_STORED_SAMPLES": "1000000", "LATENCY_MAX_BODY_BYTES": "16777216",
    "LATENCY_INGEST_QUEUE_SIZE": "100000", "LATENCY_BUNDLES_KEEP": "5", "LATENCY_PUBLISH_TOLERANCE": "0.02",
    "LATENCY_LOG_LEVEL": "info", "LATENCY_MAX_INFLIGHT_BYTES": "16777216",
}
PREDICTION_DEFAULTS = {
    "MODEL_SYNC_INTERVAL_SEC": "5", "LATENCY_REFUSE_WITHOUT_MODEL": "false", "LATENCY_MAX_BODY_BYTES": "4194304",
    "LATENCY_MAX_BATCH_ROWS": "10000", "LATENCY_QUANTILE_ALPHA": "0.9", "LATENCY_LOG_LEVEL": "info",
    "LATENCY_MAX_BUNDLE_BYTES": "67108864",
}


def test_every_server_setting_has_its_documented_default(standalone_renders, sidecar_renders):
    for objs in (standalone_renders["defaults"], sidecar_renders["example-defaults"]):
        for _, c in containers(objs):
            if c.get("command") == ["latency-training-server"]:
                env = env_of(c)
                assert {k: env.get(k) for k in TRAINING_DEFAULTS} == TRAINING_DEFAULTS
                assert "LATENCY_SEED_BUNDLE" not in env and "LATENCY_API_TOKEN" not in env  # unset by default
                assert _flag(c, "--port") == "8000"
            elif c.get("command") == ["latency-prediction-server"]:
                env = env_of(c)
                assert {k: env.get(k) for k in PREDICTION_DEFAULTS} == PREDICTION_DEFAULTS


def test_every_setting_value_reaches_the_environment():
    values = {"quantileAlpha": 0.95, "logLevel": "debug",
              "training": {"modelType": "lightgbm", "objectiveType": "mean", "retrainingIntervalSec": 7.5,
                           "minSamplesForRetrain": 250, "maxTrainingDataSizePerBucket": 800, "testTrainRatio": 0.2,
                           "maxStoredSamples": 2500000, "maxBodyBytes": 33554432, "ingestQueueSize": 5000,
                           "maxInflightBytes": 67108864,
                           "bundlesKeep": 3, "publishTolerance": 0.05, "seedBundle": "/seed/v1"},
              "predictionServers": {"syncIntervalSec": 30, "refuseWithoutModel": True, "maxBodyBytes": 8388608,
                                    "maxBatchRows": 500, "bundleDir": "/bundles", "syncTimeoutSec": 4,
                                    "accessLog": True}}
    objs = render(CHART, values)
    t = env_of(pod_spec(one(objs, "Deployment", "training"))["containers"][0])
    p = env_of(pod_spec(one(objs, "Deployment", "prediction"))["containers"][0])
    assert {k: t[k] for k in (
        "LATENCY_MODEL_TYPE", "LATENCY_OBJECTIVE_TYPE", "LATENCY_QUANTILE_ALPHA", "LATENCY_RETRAINING_INTERVAL_SEC",
        "LATENCY_MIN_SAMPLES_FOR_RETRAIN", "LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET", "LATENCY_TEST_TRAIN_RATIO",
        "LATENCY_MAX_STORED_SAMPLES", "LATENCY_MAX_BODY_BYTES", "LATENCY_INGEST_QUEUE_SIZE", "LATENCY_BUNDLES_KEEP",
        "LATENCY_PUBLISH_TOLERANCE", "LATENCY_LOG_LEVEL", "LATENCY_SEED_BUNDLE", "LATENCY_MAX_INFLIGHT_BYTES")} == {
        "LATENCY_MODEL_TYPE": "lightgbm", "LATENCY_OBJECTIVE_TYPE": "mean", "LATENCY_QUANTILE_ALPHA": "0.95",
        "LATENCY_RETRAINING_INTERVAL_SEC": "7.5", "LATENCY_MIN_SAMPLES_FOR_RETRAIN": "250",
        "LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET": "800", "LATENCY_TEST_TRAIN_RATIO": "0.2",
        "LATENCY_MAX_STORED_SAMPLES": "2500000", "LATENCY_MAX_BODY_BYTES": "33554432",
        "LATENCY_INGEST_QUEUE_SIZE": "5000", "LATENCY_BUNDLES_KEEP": "3", "LATENCY_PUBLISH_TOLERANCE": "0.05",
        "LATENCY_LOG_LEVEL": "debug", "LATENCY_SEED_BUNDLE": "/seed/v1", "LATENCY_MAX_INFLIGHT_BYTES": "67108864"}
    assert {k: p[k] for k in (
        "MODEL_SYNC_INTERVAL_SEC", "LATENCY_REFUSE_WITHOUT_MODEL", "LATENCY_MAX_BODY_BYTES", "LATENCY_MAX_BATCH_ROWS",
        "LATENCY_QUANTILE_ALPHA", "LATENCY_LOG_LEVEL", "LATENCY_BUNDLE_DIR", "LATENCY_SYNC_TIMEOUT_SEC",
        "LATENCY_ACCESS_LOG")} == {
        "MODEL_SYNC_INTERVAL_SEC": "30", "LATENCY_REFUSE_WITHOUT_MODEL": "true", "LATENCY_MAX_BODY_BYTES": "8388608",
        "LATENCY_MAX_BATCH_ROWS": "500", "LATENCY_QUANTILE_ALPHA": "0.95", "LATENCY_LOG_LEVEL": "debug",
        "LATENCY_BUNDLE_DIR": "/bundles", "LATENCY_SYNC_TIMEOUT_SEC": "4", "LATENCY_ACCESS_LOG": "true"}


def test_image_is_pinned_to_the_chart_app_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert default_values()["image"]["tag"] == chart["appVersion"]


# ----------------------------------------------------------------------------- docs


def _leaf_keys(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and k not in ("eppEnv", "resources", "labels", "requests", "limits"):
            out += _leaf_keys(v, key + ".")
        else:
            out.append(key)
    return out


def test_readme_documents_every_value():
    readme = (CHART / "README.md").read_text()
    rows = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.M))
    missing = [k for k in _leaf_keys(default_values()) if k not in rows]
    assert not missing, f"values without a row in charts/latency-predictor/README.md: {missing}"


# -------------------------------------------------------------------------- dashboard

DASHBOARD = CHART / "dashboards" / "latency-predictor.json"


def test_dashboard_covers_what_operators_watch():
    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    titles = " | ".join(p["title"].lower() for p in panels)
    for topic in ("prediction latency", "requests", "fallback", "model version", "model age", "held-out coverage",
                  "live coverage", "ingestion rate", "store size"):
        assert topic in titles, topic
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    for p in panels:
        assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]


def _exposed_metric_names() -> set[str]:
    """Sample names the two servers' real metric registries expose (counters with _total,
    histograms with _bucket/_sum/_count)."""
    from prediction_server.metrics import Metrics
    from training_server.metrics import TrainingMetrics

    names = set()
    for registry in (Metrics().registry, TrainingMetrics().registry):
        for family in registry.collect():
            names.add(family.name)
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
            names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def test_dashboard_queries_only_metrics_the_servers_expose():
    exposed = _exposed_metric_names()
    assert "latency_prediction_requests_total" in exposed and "latency_training_store_rows" in exposed
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    used = {m for e in exprs for m in re.findall(r"\b(latency_(?:prediction|training)_[a-z_]+)\b", e)}
    assert len(used) >= 15
    assert not used - exposed, f"dashboard metrics the servers do not expose: {sorted(used - exposed)}"


def test_packaged_dependency_leaves_the_examples_out(epp_chart):
    import tarfile

    (archive,) = (epp_chart / "charts").glob("latency-predictor-*.tgz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "latency-predictor/templates/_sidecar.tpl" in names
    assert "latency-predictor/values.schema.json" in names
    assert not [n for n in names if "/examples/" in n]


def test_chart_alone_in_sidecar_mode_renders_no_workload():
    assert lint_problems(lint(CHART, {"mode": "sidecar"})) == []
    assert render(CHART, {"mode": "sidecar"}) == []
