"""Serving TensorRT-LLM's llmapi model: the repository renderer's CLI, deploy/launch_llmapi.sh's
command lines (one GPU, tensor parallel, several nodes under Slurm) by --dry-run, and
deploy/compose.llmapi.yaml with deploy/.env.example. Offline: nothing is started."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.model_repo import load_model_configs
from tests.unit.deploy.test_compose import ENV, interpolate

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "deploy" / "launch_llmapi.sh"
TRITONSERVER = "/opt/tritonserver/bin/tritonserver"


def dry_run(*args: str) -> list[list[str]]:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    return [shlex.split(line[2:]) for line in result.stdout.splitlines() if line.startswith("+ ")]


def test_one_gpu_is_one_tritonserver_with_auto_complete_left_on() -> None:
    (server,) = dry_run("--model-repo", "/repo")
    assert server == [
        TRITONSERVER,
        "--model-repository=/repo",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
    ]
    # Upstream's model.py takes decoupled and max_batch_size from model.yaml through auto-complete.
    assert "--disable-auto-complete-config" not in server


def test_rendering_comes_first_with_the_model_yaml_settings() -> None:
    render, server = dry_run(
        "--model-repo", "/repo", "--hf-model", "meta-llama/Llama-3.1-8B-Instruct", "--tp", "4",
        "--max-batch-size", "32", "--no-kv-cache-reuse", "--upstream", "/src/llmapi/tensorrt_llm",
    )  # fmt: skip
    assert render[:4] == ["python3", "-m", "deploy.model_repo", "render-llmapi"]
    options = dict(zip(render[4::2], render[5::2], strict=False))
    assert options["--model"] == "meta-llama/Llama-3.1-8B-Instruct" and options["--out"] == "/repo"
    assert options["--tensor-parallel-size"] == "4" and options["--max-batch-size"] == "32"
    assert options["--upstream"] == "/src/llmapi/tensorrt_llm"
    assert "--no-kv-cache-reuse" in render and "--no-decoupled" not in render
    # Tensor parallel on one node: the LLM API starts its own workers; no MPI launcher.
    assert server[0] == TRITONSERVER


def test_several_nodes_run_under_srun_with_pmix_and_trtllm_llmapi_launch() -> None:
    (server,) = dry_run(
        "--model-repo", "/repo", "--tp", "16", "--slurm", "--nodes", "2",
        "--srun-arg", "--container-image=img",
    )  # fmt: skip
    assert server[:5] == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks-per-node=8", "--container-image=img"]
    assert server[5:7] == ["trtllm-llmapi-launch", TRITONSERVER]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "3", "--slurm", "--nodes", "2"], "do not split evenly"),
        (["--tp", "4", "--slurm", "--nodes", "2", "--gpus-per-node", "4"], "tp*pp is 4"),
        (["--nodes", "2"], "--nodes needs --slurm"),
        (["--profile", "v9"], "--profile must be current or v1.2"),
    ],
)
def test_impossible_layouts_are_one_line(args: list[str], message: str) -> None:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--model-repo", "/repo", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1 and message in result.stderr


def test_the_renderer_cli_writes_model_yaml_and_upstreams_interface(tmp_path: Path) -> None:
    out = tmp_path / "repo"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.model_repo",
            "render-llmapi",
            "--model",
            "org/model",
            "--out",
            str(out),
            "--tensor-parallel-size",
            "2",
            "--max-batch-size",
            "8",
            "--no-decoupled",
            "--profile",
            "v1.2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    settings = yaml.safe_load((out / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert settings["model"] == "org/model" and settings["backend"] == "pytorch"
    assert settings["tensor_parallel_size"] == 2 and settings["max_batch_size"] == 8
    assert settings["kv_cache_config"]["enable_block_reuse"] is True
    assert settings["triton_config"] == {"max_batch_size": 0, "decoupled": False}
    config = load_model_configs(out)["tensorrt_llm"]
    assert config.backend == "python" and config.max_batch_size == 0
    assert not config.model_transaction_policy.decoupled
    assert "lora_id" not in {i.name for i in config.input}


def test_upstreams_files_are_copied_unchanged(tmp_path: Path) -> None:
    upstream = tmp_path / "upstream"
    (upstream / "1").mkdir(parents=True)
    config = (REPO / "tests" / "data" / "llmapi" / "current" / "config.pbtxt").read_text()
    (upstream / "config.pbtxt").write_text(config)
    (upstream / "1" / "model.py").write_text("# upstream's model\n")
    (upstream / "1" / "model.yaml").write_text("model: placeholder\n")
    out = tmp_path / "repo"
    done = subprocess.run(
        [sys.executable, "-m", "deploy.model_repo", "render-llmapi", "--model", "org/model",
         "--out", str(out), "--upstream", str(upstream)],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (out / "tensorrt_llm" / "config.pbtxt").read_text() == config
    assert (out / "tensorrt_llm" / "1" / "model.py").read_text() == "# upstream's model\n"
    assert "org/model" in (out / "tensorrt_llm" / "1" / "model.yaml").read_text()


def compose() -> dict[str, Any]:
    return yaml.safe_load(interpolate((REPO / "deploy" / "compose.llmapi.yaml").read_text(), ENV))


def test_compose_serves_the_model_by_the_launcher_and_the_gateway_finds_the_contract() -> None:
    doc = compose()
    assert set(doc["services"]) == {"triton", "gateway"}
    command = doc["services"]["triton"]["command"]
    assert command[0] == "/opt/trtllm-gateway/deploy/launch_llmapi.sh"
    options = dict(zip(command[1::2], command[2::2], strict=False))
    assert options["--hf-model"] == "/models/hf" and options["--tp"] == ENV["TP_SIZE"]
    assert options["--upstream"] == "/models/llmapi-upstream"
    from gateway.cli import build_parser, settings_from_args

    settings = settings_from_args(build_parser().parse_args(doc["services"]["gateway"]["command"]))
    (model,) = settings.models
    # As a new user configures it: a name, a tokenizer and the model's name in Triton.
    assert (model.triton_model, str(model.tokenizer), model.route) == ("tensorrt_llm", "/models/hf", "auto")
    assert doc["services"]["gateway"]["depends_on"]["triton"]["condition"] == "service_healthy"


def test_the_triton_image_carries_the_llmapi_launcher() -> None:
    dockerfile = (REPO / "deploy" / "triton.Dockerfile").read_text()
    assert "deploy/launch_llmapi.sh" in dockerfile
    assert "!deploy/launch_llmapi.sh" in (REPO / "deploy" / "triton.Dockerfile.dockerignore").read_text()


def test_the_kubernetes_overlay_renders_the_llmapi_repository_and_serves_it() -> None:
    from tests.unit.deploy.test_k8s import KUBERNETES_VERSIONS, build, container, one, validate

    docs = build(REPO / "deploy" / "k8s" / "overlays" / "llmapi")
    for doc in docs:
        validate(doc, KUBERNETES_VERSIONS[-1])
    job = one(docs, "Job", "engine-build")
    render = " ".join(container(job, "build")["args"])
    assert "render-llmapi" in render and '--upstream "$LLMAPI_UPSTREAM_DIR"' in render
    assert "nvidia.com/gpu" not in container(job, "build")["resources"]["limits"]
    triton = one(docs, "StatefulSet", "triton")
    assert container(triton, "triton")["args"] == ["launch_llmapi.sh", "--model-repo", "/store/model_repo"]
    config = one(docs, "ConfigMap", "engine-config")["data"]
    # Every variable the Job's command reads is in the ConfigMap it loads.
    for name in ("HF_MODEL_ID", "HF_MODEL_DIR", "MODEL_REPO_DIR", "LLMAPI_MODEL_NAME", "LLMAPI_PROFILE",
                 "TP_SIZE", "PP_SIZE", "MAX_BATCH_SIZE", "LLMAPI_UPSTREAM_DIR"):  # fmt: skip
        assert name in config and f"${name}" in render.replace('"', ""), name
    from gateway.config import Settings

    gateway = yaml.safe_load(one(docs, "ConfigMap", "gateway-config")["data"]["config.yaml"])
    (model,) = Settings(**gateway).models
    assert (model.triton_model, model.route) == ("tensorrt_llm", "auto")
