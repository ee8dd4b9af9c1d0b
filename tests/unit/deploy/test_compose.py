"""deploy/compose.yaml with deploy/.env.example: parses, interpolates, and wires the stack as intended.

No Docker Compose here, so interpolation (${VAR}, ${VAR:-default}, ${VAR:?message}) is done by a
small implementation of Compose's rules, and the structure is checked field by field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
COMPOSE = REPO / "deploy" / "compose.yaml"
ENV_EXAMPLE = REPO / "deploy" / ".env.example"
PROMETHEUS = REPO / "deploy" / "prometheus.yml"

VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name, op, arg = match.group("name"), match.group("op"), match.group("arg")
        value = env.get(name)
        if op in (":?", "?") and (value is None or (op == ":?" and value == "")):
            raise KeyError(f"{name}: {arg}")
        if op == ":-" and not value:
            return arg
        if op == "-" and value is None:
            return arg
        return value or ""

    return VARIABLE.sub(substitute, text)


def load_env_file(path: Path) -> dict[str, str]:
    """Compose's .env syntax as used here: KEY=VALUE lines, comments, ${VAR} of earlier keys."""
    env: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=VALUE: {raw!r}"
        env[key] = interpolate(value, env)
    return env


ENV = load_env_file(ENV_EXAMPLE)


def compose(env: dict[str, str] = ENV) -> dict[str, Any]:
    return yaml.safe_load(interpolate(COMPOSE.read_text(), env))


def test_compose_file_parses_with_the_example_env() -> None:
    doc = compose()
    assert doc["name"] == "trtllm-gateway"
    assert set(doc["services"]) == {"engine-build", "triton", "gateway", "prometheus", "grafana"}


def test_every_variable_compose_uses_is_in_the_env_file_and_every_env_entry_is_used() -> None:
    used = {m.group("name") for m in VARIABLE.finditer(COMPOSE.read_text())}
    assert used <= set(ENV), f"not in .env.example: {sorted(used - set(ENV))}"
    # The llmapi variant shares the env file.
    used |= {m.group("name") for m in VARIABLE.finditer((COMPOSE.parent / "compose.llmapi.yaml").read_text())}
    referenced_by_env = {m.group("name") for m in VARIABLE.finditer(ENV_EXAMPLE.read_text())}
    assert set(ENV) <= used | referenced_by_env, f"unused: {sorted(set(ENV) - used - referenced_by_env)}"


@pytest.mark.parametrize(
    "name",
    ["TRITON_IMAGE", "TRITON_BASE_IMAGE", "GATEWAY_IMAGE", "PYTHON_IMAGE", "HF_MODEL_HOST_DIR", "GPU_COUNT"],
)
def test_images_versions_and_paths_are_required_variables(name: str) -> None:
    with pytest.raises(KeyError, match=name):
        compose({k: v for k, v in ENV.items() if k != name})


def test_images_are_versioned_by_variables() -> None:
    assert (
        ENV["TRITON_BASE_IMAGE"] == f"nvcr.io/nvidia/tritonserver:{ENV['TRITON_VERSION']}-trtllm-python-py3"
    )
    assert re.fullmatch(r"\d\d\.\d\d", ENV["TRITON_VERSION"])
    services = compose()["services"]
    assert (
        services["triton"]["image"]
        == services["engine-build"]["image"]
        == f"trtllm-gateway-triton:{ENV['TRITON_VERSION']}"
    )
    for service in services.values():
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", service["image"]), service["image"]
    # No image or version is written into compose.yaml itself.
    assert "nvcr.io" not in COMPOSE.read_text()
    assert not re.search(r"^\s*image:[ \t]+[^$\s]", COMPOSE.read_text(), re.M)


@pytest.mark.parametrize("name", ["engine-build", "triton"])
def test_gpu_services_reserve_nvidia_gpus_shared_memory_and_ulimits(name: str) -> None:
    service = compose()["services"][name]
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": int(ENV["GPU_COUNT"]), "capabilities": ["gpu"]}
    assert service["shm_size"] == ENV["TRITON_SHM_SIZE"]
    assert service["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert service["build"] == {
        "context": "..",
        "dockerfile": "deploy/triton.Dockerfile",
        "args": {"TRITON_BASE_IMAGE": ENV["TRITON_BASE_IMAGE"]},
    }
    assert (REPO / "deploy" / "triton.Dockerfile").exists()


def test_engine_and_triton_see_the_same_paths() -> None:
    services = compose()["services"]
    assert services["engine-build"]["volumes"] == services["triton"]["volumes"]
    targets = {v["target"]: v for v in services["triton"]["volumes"]}
    assert targets["/models/hf"]["read_only"] is True
    env = services["engine-build"]["environment"]
    assert env["HF_MODEL_DIR"] == "/models/hf" and env["ENGINE_CACHE_DIR"] == "/engines"
    assert env["MODEL_REPO_DIR"] == "/engines/model_repo"
    assert services["triton"]["command"][-2:] == ["--model-repo", env["MODEL_REPO_DIR"]]


def test_engine_build_runs_once_and_reads_every_setting_from_the_environment() -> None:
    service = compose()["services"]["engine-build"]
    assert service["restart"] == "no"
    assert service["command"] == ["/opt/trtllm-gateway/deploy/build_engine.sh"]
    script = (REPO / "deploy" / "build_engine.sh").read_text()
    for key in service["environment"]:
        assert re.search(rf"^{key}=\$\{{{key}:-", script, re.M), f"build_engine.sh does not read {key}"
    env = service["environment"]
    assert (str(env["TP_SIZE"]), str(env["PP_SIZE"])) == (ENV["TP_SIZE"], ENV["PP_SIZE"])
    assert int(ENV["GPU_COUNT"]) == int(ENV["TP_SIZE"]) * int(ENV["PP_SIZE"])


def test_services_start_in_order_with_health_conditions() -> None:
    services = compose()["services"]
    assert services["triton"]["depends_on"] == {
        "engine-build": {"condition": "service_completed_successfully"}
    }
    assert services["gateway"]["depends_on"] == {"triton": {"condition": "service_healthy"}}
    check = services["triton"]["healthcheck"]["test"]
    assert check[:3] == ["CMD", "python3", "-c"] and "/v2/health/ready" in check[3]
    compile(check[3], "<healthcheck>", "exec")


def test_gateway_reaches_triton_by_service_name_and_is_built_from_the_root_dockerfile() -> None:
    gateway = compose()["services"]["gateway"]
    assert gateway["build"] == {
        "context": "..",
        "dockerfile": "Dockerfile",
        "args": {"PYTHON_IMAGE": ENV["PYTHON_IMAGE"]},
    }
    command = gateway["command"]
    assert command[0] == "serve"
    assert command[command.index("--triton-url") + 1] == "triton:8001"
    # Generation streams over Triton's HTTP port (the service's own, in the container network).
    assert command[command.index("--triton-http-url") + 1] == "http://triton:8000"
    spec = command[command.index("--model") + 1]
    assert (
        spec == f"name={ENV['SERVED_MODEL_NAME']},triton_model=ensemble,tokenizer=/models/hf,route=ensemble"
    )
    assert gateway["ports"] == [f"{ENV['GATEWAY_PUBLISH_ADDRESS']}:{ENV['GATEWAY_HOST_PORT']}:9000"]


def test_containers_get_time_to_drain_before_sigkill() -> None:
    from gateway.config import Settings

    services = compose()["services"]
    seconds = {
        name: int(s["stop_grace_period"].removesuffix("s"))
        for name, s in services.items()
        if "stop_grace_period" in s
    }
    # The gateway's own drain (streams finish, then uvicorn's 5 s) must end before Docker's SIGKILL.
    assert seconds["gateway"] > Settings.model_fields["shutdown_grace_s"].default + 5
    # Triton: tritonserver's exit timeout plus launch_triton.sh's stop timeout.
    assert seconds["triton"] >= 30 + 60


def test_gateway_command_is_accepted_by_the_gateway_cli() -> None:
    from gateway.cli import build_parser, settings_from_args

    args = build_parser().parse_args(compose()["services"]["gateway"]["command"])
    settings = settings_from_args(args)
    assert settings.triton_url == ["triton:8001"]
    assert settings.triton_http_url == ["http://triton:8000"]
    (model,) = settings.models
    assert (model.name, model.triton_model, str(model.tokenizer)) == (
        ENV["SERVED_MODEL_NAME"],
        "ensemble",
        "/models/hf",
    )


def test_triton_ports_are_published_on_loopback_only() -> None:
    ports = compose()["services"]["triton"]["ports"]
    assert ports and all(p.startswith("127.0.0.1:") for p in ports)


def test_prometheus_is_optional_and_scrapes_both_services_by_name() -> None:
    prometheus = compose()["services"]["prometheus"]
    assert prometheus["profiles"] == ["observability"]
    config = yaml.safe_load(PROMETHEUS.read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert targets == {"gateway": ["gateway:9000"], "triton": ["triton:8002"]}


# Field names from the Compose Specification's JSON schema (compose-spec/compose-spec,
# schema/compose-spec.json), for the parts of a service this file uses: a misspelt key would
# otherwise be rejected only by `docker compose` on the GPU host.
SERVICE_KEYS = {
    "image", "build", "command", "entrypoint", "environment", "env_file", "volumes", "shm_size", "ulimits",
    "deploy", "restart", "ports", "depends_on", "healthcheck", "stop_grace_period", "stop_signal",
    "profiles", "ipc", "user", "working_dir", "labels", "networks", "gpus", "runtime", "init",
}  # fmt: skip
BUILD_KEYS = {"context", "dockerfile", "args", "target", "cache_from", "labels", "tags", "platforms"}
VOLUME_KEYS = {"type", "source", "target", "read_only", "bind", "volume", "tmpfs", "consistency"}
BIND_KEYS = {"propagation", "create_host_path", "recursive", "selinux"}
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"}
DEVICE_KEYS = {"capabilities", "count", "device_ids", "driver", "options"}
DEPENDS_KEYS = {"condition", "restart", "required"}
TOP_KEYS = {"name", "services", "volumes", "networks", "secrets", "configs", "include"}


def test_compose_uses_only_fields_of_the_compose_specification() -> None:
    doc = compose()
    assert {k for k in doc if not k.startswith("x-")} <= TOP_KEYS
    for name, service in doc["services"].items():
        assert set(service) <= SERVICE_KEYS, (name, set(service) - SERVICE_KEYS)
        if isinstance(service.get("build"), dict):
            assert set(service["build"]) <= BUILD_KEYS, name
        for volume in service.get("volumes", []):
            assert set(volume) <= VOLUME_KEYS and "type" in volume, (name, volume)
            assert set(volume.get("bind", {})) <= BIND_KEYS, (name, volume)
        assert set(service.get("healthcheck", {})) <= HEALTHCHECK_KEYS, name
        for dependency in service.get("depends_on", {}).values():
            assert set(dependency) <= DEPENDS_KEYS and "condition" in dependency, name
        for device in (
            service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        ):
            assert set(device) <= DEVICE_KEYS and "capabilities" in device, name
        for limit in service.get("ulimits", {}).values():
            assert isinstance(limit, int) or set(limit) == {"soft", "hard"}, name
