"""deploy/k8s: kustomize base and overlays, built, validated against Kubernetes schemas, and cross-checked.

The manifests are built by a small Python implementation of the kustomize features they use
(resources, strategic-merge patches, images, replicas), tested here against `kustomize build` /
`kubectl kustomize` whenever one is installed. Built objects are validated offline with
kubernetes-validate (strict: unknown fields are errors). The ServiceMonitor is a CRD that
kubernetes-validate does not know: it is checked against SERVICE_MONITOR_SCHEMA below, written from
prometheus-operator's CRD (monitoring.coreos.com/v1) for the fields used here and stricter than the
CRD (which would silently prune a misspelt field); the Inference Gateway overlay's custom resources
likewise against crd_schemas (from the pinned releases' CRDs), and its tests are at the end.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway.config import Settings
from tests.unit.deploy import crd_schemas

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "deploy" / "k8s"
BUILDS = {
    "base": K8S / "base",
    "single-gpu": K8S / "overlays" / "single-gpu",
    "tp4": K8S / "overlays" / "tp4",
    "scale-out": K8S / "overlays" / "scale-out",
}
# GPUs per Triton pod and engine-build pod, and Triton replicas, each build must end up with.
EXPECTED = {"base": (1, 1), "single-gpu": (1, 1), "tp4": (4, 1), "scale-out": (1, 4)}
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())

Doc = dict[str, Any]

# --- a kustomize subset ----------------------------------------------------------------------------

# Strategic-merge keys of the list fields these manifests patch (from the Kubernetes API's patchMergeKey).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
}


def strategic_merge(base: Any, patch: Any, field: str | None = None) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = strategic_merge(merged[key], value, key)
            else:
                merged[key] = copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        # Like kustomize: the patch's items first (merged into their originals), then the untouched ones.
        key = MERGE_KEYS[field]
        originals = {item[key]: item for item in base}
        merged_list = [
            strategic_merge(originals[item[key]], item) if item[key] in originals else copy.deepcopy(item)
            for item in patch
        ]
        patched = {item[key] for item in patch}
        return merged_list + [copy.deepcopy(item) for item in base if item[key] not in patched]
    return copy.deepcopy(patch)


def pod_specs(doc: Doc) -> list[Doc]:
    if doc["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet", "ReplicaSet"):
        return [doc["spec"]["template"]["spec"]]
    return []


def build(directory: Path) -> list[Doc]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(spec) - {"apiVersion", "kind", "resources", "patches", "images", "replicas"}
    assert not unsupported, f"{directory}: the Python build does not implement {sorted(unsupported)}"
    docs: list[Doc] = []
    for resource in spec.get("resources", []):
        path = directory / resource
        docs += build(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    for entry in spec.get("patches", []):
        assert set(entry) == {"path"}, entry
        patch = yaml.safe_load((directory / entry["path"]).read_text())
        (index,) = [
            i
            for i, d in enumerate(docs)
            if (d["kind"], d["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"])
        ]
        docs[index] = strategic_merge(docs[index], patch)
    for entry in spec.get("replicas", []):
        for doc in docs:
            if doc["metadata"]["name"] == entry["name"] and doc["kind"] in ("Deployment", "StatefulSet"):
                doc["spec"]["replicas"] = entry["count"]
    for entry in spec.get("images", []):
        for doc in docs:
            for pod in pod_specs(doc):
                for container in pod.get("initContainers", []) + pod["containers"]:
                    name, _, tag = container["image"].partition(":")
                    if name == entry["name"]:
                        container["image"] = f"{entry.get('newName', name)}:{entry.get('newTag', tag)}"
    return docs


def by_key(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    keyed = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(keyed) == len(docs), "duplicate kind/name"
    return keyed


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    return by_key(docs)[(kind, name)]


BUILT = {name: build(path) for name, path in BUILDS.items()}


def test_strategic_merge_merges_named_list_items_and_replaces_the_rest() -> None:
    base = {
        "containers": [{"name": "a", "image": "x", "args": ["1", "2"]}, {"name": "b", "image": "y"}],
        "volumes": [{"name": "v", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
        "tolerations": [{"key": "k"}],
    }
    patch = {
        "containers": [{"name": "a", "args": ["3"]}, {"name": "c", "image": "z"}],
        "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "8Gi"}}],
        "tolerations": [{"key": "other"}],
    }
    assert strategic_merge(base, patch) == {
        "containers": [
            {"name": "a", "image": "x", "args": ["3"]},
            {"name": "c", "image": "z"},
            {"name": "b", "image": "y"},
        ],
        "volumes": [{"name": "v", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}],
        "tolerations": [{"key": "other"}],
    }
    assert base["containers"][0]["args"] == ["1", "2"], "the base is not modified"


def kustomize_command() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        probe = subprocess.run(["kubectl", "kustomize", "--help"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["kubectl", "kustomize"]
    return None


@pytest.mark.parametrize("name", BUILDS)
def test_python_build_equals_kustomize_build(name: str) -> None:
    command = kustomize_command()
    if command is None:
        pytest.skip(
            "neither kustomize nor kubectl is installed: the manifests are checked from the Python build"
        )
    result = subprocess.run(
        [*command, str(BUILDS[name])], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    real = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert by_key(real) == by_key(BUILT[name])


# --- schemas ---------------------------------------------------------------------------------------

DNS_1123 = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": DNS_1123, "maxLength": 253},
                "namespace": {"type": "string"},
                "labels": STRING_MAP,
                "annotations": STRING_MAP,
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": STRING_MAP,
                        "matchExpressions": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["key", "operator"],
                                "additionalProperties": False,
                                "properties": {
                                    "key": {"type": "string"},
                                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                                    "values": {"type": "array", "items": {"type": "string"}},
                                },
                            },
                        },
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "anyOf": [{"required": ["port"]}, {"required": ["targetPort"]}],
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["integer", "string"]},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                            "honorLabels": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}


def validate(doc: Doc, version: str) -> None:
    if doc["apiVersion"] == "monitoring.coreos.com/v1":
        jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
    elif doc["apiVersion"] in crd_schemas.BY_API_VERSION:
        jsonschema.validate(doc, crd_schemas.BY_API_VERSION[doc["apiVersion"]])
    else:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", BUILDS)
def test_every_object_validates_against_its_schema(name: str, version: str) -> None:
    for doc in BUILT[name]:
        validate(doc, version)


def test_the_schemas_reject_misspelt_fields() -> None:
    monitor = copy.deepcopy(one(BUILT["base"], "ServiceMonitor", "gateway"))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor, KUBERNETES_VERSIONS[0])
    triton = copy.deepcopy(one(BUILT["base"], "StatefulSet", "triton"))
    triton["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(triton, KUBERNETES_VERSIONS[0])


# --- what the objects say --------------------------------------------------------------------------


def container(doc: Doc, name: str) -> Doc:
    (found,) = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return found


def volume(doc: Doc, name: str) -> Doc:
    (found,) = [v for v in doc["spec"]["template"]["spec"]["volumes"] if v["name"] == name]
    return found


def mounted_volume(doc: Doc, container_name: str, path: str) -> Doc:
    (mount,) = [m for m in container(doc, container_name)["volumeMounts"] if m["mountPath"] == path]
    return volume(doc, mount["name"])


@pytest.mark.parametrize("name", BUILDS)
def test_images_are_tagged_and_name_no_registry(name: str) -> None:
    for doc in BUILT[name]:
        for pod in pod_specs(doc):
            for c in pod.get("initContainers", []) + pod["containers"]:
                repository, _, tag = c["image"].rpartition(":")
                assert repository in ("trtllm-gateway-triton", "trtllm-gateway", "valkey/valkey"), c["image"]
                assert re.fullmatch(r"[\w.-]+", tag), c["image"]


@pytest.mark.parametrize("name", BUILDS)
def test_triton_has_gpus_shared_memory_readiness_and_the_model_store(name: str) -> None:
    gpus, replicas = EXPECTED[name]
    triton = one(BUILT[name], "StatefulSet", "triton")
    assert triton["spec"]["replicas"] == replicas
    main = container(triton, "triton")
    assert main["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert main["args"] == ["launch_triton.sh"]
    shm = mounted_volume(triton, "triton", "/dev/shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert main["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert main["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert main["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    store = mounted_volume(triton, "triton", "/store")
    assert store["persistentVolumeClaim"]["claimName"] == "model-store"
    service = one(BUILT[name], "Service", triton["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None", "per-replica DNS names need a headless Service"


@pytest.mark.parametrize("name", BUILDS)
def test_engine_build_job_matches_the_engine_triton_serves(name: str) -> None:
    gpus, _ = EXPECTED[name]
    docs = BUILT[name]
    job = one(docs, "Job", "engine-build")
    build_container = container(job, "build")
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert build_container["args"] == ["build_engine.sh"]
    assert build_container["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert mounted_volume(job, "build", "/dev/shm")["emptyDir"]["medium"] == "Memory"
    (token,) = [e for e in build_container["env"] if e["name"] == "HF_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"]["optional"] is True
    config = one(docs, "ConfigMap", "engine-config")["data"]
    # One MPI rank per GPU: the engine's tp*pp must equal the GPUs Triton gets.
    assert int(config["TP_SIZE"]) * int(config["PP_SIZE"]) == gpus
    triton = one(docs, "StatefulSet", "triton")
    for workload, name_ in ((job, "build"), (triton, "triton")):
        assert {"configMapRef": {"name": "engine-config"}} in container(workload, name_)["envFrom"]


def test_engine_config_keys_are_settings_the_scripts_read() -> None:
    config = one(BUILT["base"], "ConfigMap", "engine-config")["data"]
    scripts = (REPO / "deploy" / "build_engine.sh").read_text() + (
        REPO / "deploy" / "launch_triton.sh"
    ).read_text()
    for key in config:
        assert re.search(rf"^{key}=\$\{{{key}:-", scripts, re.M), f"no deploy script reads {key}"
    assert config["MODEL_REPO_DIR"].startswith("/store/") and config["ENGINE_CACHE_DIR"].startswith("/store/")


@pytest.mark.parametrize("name", BUILDS)
def test_gateway_is_replicated_autoscaled_and_protected(name: str) -> None:
    docs = BUILT[name]
    deployment = one(docs, "Deployment", "gateway")
    assert deployment["spec"]["replicas"] >= 2
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    hpa = one(docs, "HorizontalPodAutoscaler", "gateway")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gateway"}
    assert 2 <= hpa["spec"]["minReplicas"] <= deployment["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
    pdb = one(docs, "PodDisruptionBudget", "gateway")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    service = one(docs, "Service", "gateway")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    main = container(deployment, "gateway")
    assert main["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "http"}
    assert main["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert "nvidia.com/gpu" not in main["resources"].get("limits", {})


def test_gateway_pod_runs_as_the_image_user_with_a_read_only_root() -> None:
    deployment = one(BUILT["base"], "Deployment", "gateway")
    pod = deployment["spec"]["template"]["spec"]
    user = re.search(r"^USER (\d+):(\d+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert user
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == tuple(
        int(g) for g in user.groups()
    )
    security = container(deployment, "gateway")["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert volume(deployment, "tmp")["emptyDir"] == {}, "HF_HOME and Python need a writable /tmp"


@pytest.mark.parametrize("name", BUILDS)
def test_gateway_config_is_valid_settings_and_lists_every_triton_replica(name: str) -> None:
    docs = BUILT[name]
    deployment = one(docs, "Deployment", "gateway")
    (env,) = container(deployment, "gateway")["env"]
    assert env == {"name": "GATEWAY_CONFIG_FILE", "value": "/etc/gateway/config.yaml"}
    config_volume = mounted_volume(deployment, "gateway", "/etc/gateway")
    data = one(docs, "ConfigMap", config_volume["configMap"]["name"])["data"]
    settings = Settings.model_validate(yaml.safe_load(data["config.yaml"]))
    triton = one(docs, "StatefulSet", "triton")
    service = triton["spec"]["serviceName"]
    assert settings.triton_url == [f"triton-{i}.{service}:8001" for i in range(triton["spec"]["replicas"])]
    # Each replica's HTTP port, in the same order: generation streams over generate_stream.
    assert settings.triton_http_url == [
        f"http://triton-{i}.{service}:8000" for i in range(triton["spec"]["replicas"])
    ]
    engine = one(docs, "ConfigMap", "engine-config")["data"]
    (model,) = settings.models
    # The gateway tokenizes with the checkpoint the engine was built from, on the same volume.
    assert str(model.tokenizer) == engine["HF_MODEL_DIR"]
    assert (
        mounted_volume(deployment, "gateway", "/store")["persistentVolumeClaim"]["claimName"] == "model-store"
    )
    assert model.name == engine["MODEL_NAME"]


@pytest.mark.parametrize("name", BUILDS)
def test_service_monitors_select_services_and_named_ports(name: str) -> None:
    docs = BUILT[name]
    services = [d for d in docs if d["kind"] == "Service"]
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"gateway", "triton"}
    for monitor in monitors:
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        (service,) = [s for s in services if wanted <= s["metadata"]["labels"].items()]
        port_names = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in port_names
            assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize("name", BUILDS)
def test_every_referenced_claim_and_config_map_exists(name: str) -> None:
    docs = BUILT[name]
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    config_maps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    for doc in docs:
        for pod in pod_specs(doc):
            for vol in pod.get("volumes", []):
                if "persistentVolumeClaim" in vol:
                    assert vol["persistentVolumeClaim"]["claimName"] in claims
                if "configMap" in vol:
                    assert vol["configMap"]["name"] in config_maps
            for c in pod.get("initContainers", []) + pod["containers"]:
                for source in c.get("envFrom", []):
                    assert source["configMapRef"]["name"] in config_maps


@pytest.mark.parametrize("name", BUILDS)
def test_services_select_their_pods(name: str) -> None:
    docs = BUILT[name]
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    for service in (d for d in docs if d["kind"] == "Service"):
        selector = service["spec"]["selector"].items()
        matched = [w for w in workloads if selector <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matched) == 1, service["metadata"]["name"]
        container_ports = {
            p["name"] for c in matched[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]
        }
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports


def test_pods_get_time_to_drain_before_sigkill() -> None:
    docs = BUILT["base"]
    gateway = one(docs, "Deployment", "gateway")["spec"]["template"]["spec"]
    pre_stop = container(one(docs, "Deployment", "gateway"), "gateway")["lifecycle"]["preStop"]["exec"][
        "command"
    ]
    match = re.search(r"sleep\((\d+(?:\.\d+)?)\)", pre_stop[-1])
    assert match, pre_stop
    sleep = float(match.group(1))
    drain = Settings.model_fields["shutdown_grace_s"].default + 5  # streams, then uvicorn's own margin
    assert gateway["terminationGracePeriodSeconds"] > sleep + drain
    triton = one(docs, "StatefulSet", "triton")["spec"]["template"]["spec"]
    assert triton["terminationGracePeriodSeconds"] >= 30 + 60  # exit timeout + launch_triton's stop timeout


def test_scale_out_routes_by_prefix_and_shares_state_through_its_own_server() -> None:
    docs = BUILT["scale-out"]
    gateways = one(docs, "Deployment", "gateway")
    assert gateways["spec"]["replicas"] >= 2 and one(docs, "StatefulSet", "triton")["spec"]["replicas"] >= 2
    config_volume = mounted_volume(gateways, "gateway", "/etc/gateway")
    data = one(docs, "ConfigMap", config_volume["configMap"]["name"])["data"]
    settings = Settings.model_validate(yaml.safe_load(data["config.yaml"]))
    assert settings.routing_policy == "prefix"
    # Stored responses follow the state server unless a store is chosen.
    assert settings.state_url is not None and settings.response_store == "redis"
    match = re.fullmatch(r"redis://([a-z0-9-]+):(\d+)/\d+", settings.state_url)
    assert match, settings.state_url
    service = one(docs, "Service", match.group(1))
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == int(match.group(2))]
    (server,) = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert server["spec"]["replicas"] == 1 and server["spec"]["strategy"]["type"] == "Recreate"
    valkey = container(server, "valkey")
    assert {p["name"]: p["containerPort"] for p in valkey["ports"]}[port["targetPort"]] == int(match.group(2))
    # Its data on its own volume, written as an append-only file.
    assert valkey["args"][0] == "valkey-server" and "--appendonly" in valkey["args"]
    data_dir = valkey["args"][valkey["args"].index("--dir") + 1]
    claim = mounted_volume(server, "valkey", data_dir)["persistentVolumeClaim"]["claimName"]
    assert one(docs, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert valkey["securityContext"]["readOnlyRootFilesystem"] is True
    assert server["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    # Only the scale-out overlay has one.
    assert all(d["metadata"]["name"] != "valkey" for d in BUILT["single-gpu"])


# --- the Inference Gateway overlay ----------------------------------------------------------------

IG_PATH = K8S / "overlays" / "inference-gateway"
IG = build(IG_PATH)
EPP_IMAGE = "ghcr.io/llm-d/llm-d-router-endpoint-picker"


def test_inference_gateway_python_build_equals_kustomize_build() -> None:
    command = kustomize_command()
    if command is None:
        pytest.skip(
            "neither kustomize nor kubectl is installed: the overlay is checked from the Python build"
        )
    result = subprocess.run([*command, str(IG_PATH)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert by_key([d for d in yaml.safe_load_all(result.stdout) if d]) == by_key(IG)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_inference_gateway_objects_validate_strictly(version: str) -> None:
    kinds = {d["kind"] for d in IG}
    assert {"InferencePool", "InferenceObjective", "HTTPRoute", "HorizontalPodAutoscaler"} <= kinds
    for doc in IG:
        validate(doc, version)
    jsonschema.validate(epp_config(), crd_schemas.ENDPOINT_PICKER_CONFIG)


def test_the_custom_resource_schemas_reject_misspelt_and_invalid_fields() -> None:
    pool = copy.deepcopy(one(IG, "InferencePool", "trtllm"))
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
    objective = copy.deepcopy(next(d for d in IG if d["kind"] == "InferenceObjective"))
    objective["spec"]["priority"] = "high"
    route = copy.deepcopy(one(IG, "HTTPRoute", "trtllm"))
    route["spec"]["rules"][0]["backendRefs"][0]["kind"] = "Inference Pool"
    no_port = copy.deepcopy(one(IG, "InferencePool", "trtllm"))
    del no_port["spec"]["endpointPickerRef"]["port"]
    service_no_port = copy.deepcopy(no_port)
    service_no_port["spec"]["endpointPickerRef"]["kind"] = "Service"
    twice = copy.deepcopy(one(IG, "InferencePool", "trtllm"))
    twice["spec"]["targetPorts"] *= 2
    for doc in (pool, objective, route, no_port, service_no_port, twice):
        with pytest.raises(jsonschema.ValidationError):
            validate(doc, KUBERNETES_VERSIONS[0])
    config = epp_config()
    config["plugins"][4]["parameters"]["prot"] = 9000
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, crd_schemas.ENDPOINT_PICKER_CONFIG)


def model_server_settings() -> Settings:
    deployment = one(IG, "Deployment", "model-server")
    data = one(IG, "ConfigMap", mounted_volume(deployment, "gateway", "/etc/gateway")["configMap"]["name"])[
        "data"
    ]
    return Settings.model_validate(yaml.safe_load(data["config.yaml"]))


def epp_config() -> Doc:
    epp = one(IG, "Deployment", "trtllm-epp")
    args = container(epp, "epp")["args"]
    path = Path(args[args.index("--config-file") + 1])
    mount = mounted_volume(epp, "epp", str(path.parent))
    config: Doc = yaml.safe_load(one(IG, "ConfigMap", mount["configMap"]["name"])["data"][path.name])
    return config


def test_the_pool_targets_the_gateway_beside_triton_in_each_pod() -> None:
    deployment = one(IG, "Deployment", "model-server")
    pod = deployment["spec"]["template"]
    pool = one(IG, "InferencePool", "trtllm")
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    gateway_ports = {p["name"]: p["containerPort"] for p in container(deployment, "gateway")["ports"]}
    settings = model_server_settings()
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [gateway_ports["http"]] == [settings.port]
    # The gateway reaches its own Triton over localhost, and reads Triton's metrics port.
    triton = {p["name"]: p["containerPort"] for p in container(deployment, "triton")["ports"]}
    assert settings.triton_url == [f"127.0.0.1:{triton['triton-grpc']}"]
    assert settings.triton_http_url == [f"http://127.0.0.1:{triton['triton-http']}"]
    assert settings.triton_metrics_url == [f"http://127.0.0.1:{triton['triton-metrics']}/metrics"]
    # One worker: the admission queue the metrics report is the pod's.
    assert settings.workers == 1
    # The EPP scrapes without credentials (only a client certificate, over https).
    assert not settings.protect_metrics
    assert container(deployment, "triton")["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert container(deployment, "gateway")["readinessProbe"]["httpGet"] == {
        "path": "/health/ready",
        "port": "http",
    }
    (model,) = settings.models
    engine = one(IG, "ConfigMap", "engine-config")["data"]
    assert str(model.tokenizer) == engine["HF_MODEL_DIR"] and model.name == engine["MODEL_NAME"]


def test_the_epp_is_pinned_and_configured_with_the_gateways_port_and_engine_type() -> None:
    from gateway import modelserver
    from tests.support import epp_metrics

    epp = one(IG, "Deployment", "trtllm-epp")
    image = container(epp, "epp")["image"]
    assert image == f"{EPP_IMAGE}:v0.10.0"
    config = epp_config()
    plugins = {p["type"]: p for p in config["plugins"]}
    pool = one(IG, "InferencePool", "trtllm")
    assert plugins["metrics-data-source"]["parameters"]["port"] == pool["spec"]["targetPorts"][0]["number"]
    assert plugins["metrics-data-source"]["parameters"]["path"] == "/metrics"
    engine = plugins["core-metrics-extractor"]["parameters"]["defaultEngine"]
    pod_labels = one(IG, "Deployment", "model-server")["spec"]["template"]["metadata"]["labels"]
    assert engine == pod_labels[epp_metrics.ENGINE_LABEL] == "vllm"
    # The names that engine type reads are the ones the gateway exports.
    specs = epp_metrics.ENGINES[engine]
    assert {specs.queued, specs.running, specs.kv_usage, specs.lora, specs.cache_info} == set(
        modelserver.FAMILIES
    )
    # Its flow control stays off (the default): requests queue in the gateways, where the queue
    # scorer and the autoscaler see them (docs/deploy/inference-gateway.md).
    assert "flowControl" not in config.get("featureGates", [])
    scored = {ref["pluginRef"] for profile in config["schedulingProfiles"] for ref in profile["plugins"]}
    assert {"queue-scorer", "kv-cache-utilization-scorer", "lora-affinity-scorer"} <= scored <= set(plugins)
    # The pool names the EPP's Service and its ext-proc port, which reaches the container's.
    ref = pool["spec"]["endpointPickerRef"]
    service = one(IG, "Service", ref["name"])
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    ports = {p["name"]: p["containerPort"] for p in container(epp, "epp")["ports"]}
    assert ports[port["targetPort"]] == ref["port"]["number"]
    assert port["appProtocol"] == "kubernetes.io/h2c", "ext-proc is gRPC: HTTP/2, as the chart says"
    assert "--tracing=false" in container(epp, "epp")["args"], "no trace collector in the overlay"
    assert service["spec"]["selector"].items() <= epp["spec"]["template"]["metadata"]["labels"].items()
    args = container(epp, "epp")["args"]
    assert args[args.index("--pool-name") + 1] == pool["metadata"]["name"]
    # It may read what it watches.
    rules = one(IG, "Role", "trtllm-epp")["rules"]
    readable = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert {
        ("", "pods"),
        ("inference.networking.k8s.io", "inferencepools"),
        ("llm-d.ai", "inferenceobjectives"),
    } <= readable
    assert epp["spec"]["template"]["spec"]["serviceAccountName"] == "trtllm-epp"


def test_the_route_and_objectives_name_the_pool_and_objective_priorities_map_onto_the_gateways() -> None:
    pool = one(IG, "InferencePool", "trtllm")["metadata"]["name"]
    route = one(IG, "HTTPRoute", "trtllm")
    (backend,) = [ref for rule in route["spec"]["rules"] for ref in rule["backendRefs"]]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        pool,
    )
    objectives = {d["metadata"]["name"]: d["spec"] for d in IG if d["kind"] == "InferenceObjective"}
    assert all(spec["poolRef"]["name"] == pool for spec in objectives.values())
    assert model_server_settings().objective_priorities == {n: s["priority"] for n, s in objectives.items()}


def test_the_pool_autoscales_on_requests_waiting_through_prometheus_adapter() -> None:
    from gateway import modelserver

    hpa = one(IG, "HorizontalPodAutoscaler", "model-server")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "model-server",
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    rules = yaml.safe_load(one(IG, "ConfigMap", "prometheus-adapter-rules")["data"]["config.yaml"])["rules"]
    (rule,) = [r for r in rules if r["name"]["as"] == metric["pods"]["metric"]["name"]]
    assert rule["seriesQuery"].startswith(modelserver.WAITING + "{")
    assert re.fullmatch(rule["name"]["matches"], modelserver.WAITING)
    assert (
        hpa["spec"]["minReplicas"]
        <= one(IG, "Deployment", "model-server")["spec"]["replicas"]
        <= hpa["spec"]["maxReplicas"]
    )
    # Prometheus scrapes the gateways the adapter reads, on the pool's port.
    monitor = one(IG, "ServiceMonitor", "model-server")
    service = one(IG, "Service", "model-server")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert port["port"] == one(IG, "InferencePool", "trtllm")["spec"]["targetPorts"][0]["number"]
