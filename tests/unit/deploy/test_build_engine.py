"""deploy/build_engine.sh: the exact convert / trtllm-build / render command lines, the cache, the errors.

No GPU or TensorRT-LLM here: --dry-run shows the commands, and fake `trtllm-build`, `nvidia-smi`,
convert_checkpoint.py and tensorrt_llm metadata stand in for the real ones where a test runs steps.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "deploy" / "build_engine.sh"

# Tools the script uses; the hermetic PATH links exactly these, so a missing GPU tool stays missing.
HOST_TOOLS = (
    "bash", "env", "python3", "sha256sum", "cut", "find", "sort", "basename", "dirname", "sed", "grep",
    "mkdir", "rm", "mv", "cat", "git",
)  # fmt: skip


def make_hf_model(
    root: Path, *, model_type: str = "llama", dtype: str = "bfloat16", positions: int = 131072
) -> Path:
    model = root / "hf" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(
        json.dumps({"model_type": model_type, "torch_dtype": dtype, "max_position_embeddings": positions})
    )
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    return model


def make_examples(root: Path, family: str = "llama", *, layout: str = "core") -> Path:
    examples = root / "examples"
    family_dir = examples / "models" / "core" / family if layout == "core" else examples / family
    family_dir.mkdir(parents=True)
    (family_dir / "convert_checkpoint.py").write_text(FAKE_CONVERT)
    return examples


def hermetic_path(tmp: Path) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in HOST_TOOLS:
        # `python3` on PATH may be a version-manager shim needing more tools; the real interpreter is not.
        found = os.path.realpath(sys.executable) if tool == "python3" else shutil.which(tool)
        if found and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(found)
    return bin_dir


def write_tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": str(cwd), "LC_ALL": "C"}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def commands(stdout: str) -> list[list[str]]:
    """The `+ ...` lines of a run, split back into argv lists the way a shell would."""
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


def command_starting(cmds: list[list[str]], *prefix: str) -> list[str]:
    matches = [c for c in cmds if c[: len(prefix)] == list(prefix)]
    assert len(matches) == 1, f"expected one command starting {prefix}, got {matches}"
    return matches[0]


def flags(argv: list[str]) -> dict[str, str]:
    """`--flag value` pairs of an argv (every flag here takes exactly one value)."""
    pairs = {}
    it = iter(argv)
    for arg in it:
        if arg.startswith("--"):
            pairs[arg] = next(it)
    return pairs


# --- dry run: the command lines ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tp", "workers"),
    [(1, "1"), (4, "4")],
    ids=["1-gpu", "tp4"],
)
def test_dry_run_prints_convert_build_and_render_commands(tmp_path: Path, tp: int, workers: str) -> None:
    model = make_hf_model(tmp_path)
    examples = make_examples(tmp_path)
    result = run(
        ["--hf-model", str(model), "--examples-dir", str(examples), "--tp", str(tp),
         "--cache-dir", "/engines", "--repo-out", "/engines/model_repo", "--dry-run"],
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "not checking for python3, trtllm-build, git, nvidia-smi or GPUs" in result.stderr
    cmds = commands(result.stdout)

    convert = command_starting(cmds, "python3", str(examples / "models/core/llama/convert_checkpoint.py"))
    ckpt = convert[convert.index("--output_dir") + 1]
    assert re.fullmatch(rf"/engines/checkpoints/model-bfloat16-tp{tp}-pp1-[0-9a-f]{{12}}\.partial", ckpt)
    assert flags(convert[2:]) == {
        "--model_dir": str(model),
        "--output_dir": ckpt,
        "--dtype": "bfloat16",
        "--tp_size": str(tp),
        "--pp_size": "1",
    }

    build = command_starting(cmds, "trtllm-build")
    engine_partial = build[build.index("--output_dir") + 1]
    assert re.fullmatch(
        rf"/engines/engines/model-bfloat16-tp{tp}-pp1-[0-9a-f]{{12}}\.partial", engine_partial
    )
    assert flags(build[1:]) == {
        "--checkpoint_dir": ckpt.removesuffix(".partial"),
        "--output_dir": engine_partial,
        "--gemm_plugin": "bfloat16",
        "--gpt_attention_plugin": "bfloat16",
        "--kv_cache_type": "paged",
        "--remove_input_padding": "enable",
        "--context_fmha": "enable",
        "--use_paged_context_fmha": "enable",
        "--max_batch_size": "64",
        "--max_input_len": "4096",
        "--max_seq_len": "8192",
        "--max_num_tokens": "8192",
        "--max_beam_width": "1",
        "--workers": workers,
    }
    # The partial directories become the real ones only after each step succeeded.
    assert ["mv", ckpt, ckpt.removesuffix(".partial")] in cmds
    assert ["mv", engine_partial, engine_partial.removesuffix(".partial")] in cmds

    render = command_starting(
        cmds, "env", f"PYTHONPATH={REPO}", "python3", "-m", "deploy.model_repo", "render"
    )
    sets = [render[i + 1] for i, arg in enumerate(render) if arg == "--set"]
    assert sets == [
        f"engine_dir={engine_partial.removesuffix('.partial')}",
        f"tokenizer_dir={model}",
        "max_batch_size=64",
        "decoupled=true",
        "exclude_input_in_output=true",
        "kv_cache_free_gpu_mem_fraction=0.9",
        "enable_kv_cache_reuse=true",
        "batch_scheduler_policy=guaranteed_no_evict",
    ]
    assert render[6:13] == [
        "--backend",
        "tensorrtllm",
        "--variant",
        "current",
        "--out",
        "/engines/model_repo",
        "--overwrite",
    ]
    assert result.stdout.splitlines()[-2:] == [
        f"ENGINE_DIR={engine_partial.removesuffix('.partial')}",
        "MODEL_REPO_DIR=/engines/model_repo",
    ]


def test_dry_run_reads_dtype_and_context_from_config_json(tmp_path: Path) -> None:
    model = make_hf_model(tmp_path, model_type="qwen2", dtype="float32", positions=2048)
    examples = make_examples(tmp_path, "qwen")
    result = run(["--hf-model", str(model), "--examples-dir", str(examples), "--dry-run"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    cmds = commands(result.stdout)
    convert = command_starting(cmds, "python3", str(examples / "models/core/qwen/convert_checkpoint.py"))
    # float32 checkpoints are served in float16, as convert_checkpoint.py's own `auto` does.
    assert flags(convert[2:])["--dtype"] == "float16"
    build = flags(command_starting(cmds, "trtllm-build")[1:])
    assert (build["--gemm_plugin"], build["--gpt_attention_plugin"]) == ("float16", "float16")
    # Defaults never exceed the model's context.
    assert (build["--max_seq_len"], build["--max_input_len"]) == ("2048", "2048")


def test_dry_run_finds_convert_checkpoint_in_the_pre_2025_examples_layout(tmp_path: Path) -> None:
    model = make_hf_model(tmp_path)
    examples = make_examples(tmp_path, layout="legacy")
    result = run(["--hf-model", str(model), "--examples-dir", str(examples), "--dry-run"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    command_starting(commands(result.stdout), "python3", str(examples / "llama" / "convert_checkpoint.py"))


def test_dry_run_uses_the_deprecated_paged_kv_cache_flag_when_asked(tmp_path: Path) -> None:
    model = make_hf_model(tmp_path)
    examples = make_examples(tmp_path)
    result = run(
        [
            "--hf-model",
            str(model),
            "--examples-dir",
            str(examples),
            "--kv-cache-flag",
            "paged_kv_cache",
            "--dry-run",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    build = flags(command_starting(commands(result.stdout), "trtllm-build")[1:])
    assert build["--paged_kv_cache"] == "enable"
    assert "--kv_cache_type" not in build


def test_dry_run_fetch_examples_prints_a_sparse_clone_of_the_matching_tag(tmp_path: Path) -> None:
    model = make_hf_model(tmp_path)
    result = run(
        [
            "--hf-model",
            str(model),
            "--fetch-examples",
            "--trtllm-version",
            "0.20.0",
            "--cache-dir",
            "/engines",
            "--dry-run",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    cmds = commands(result.stdout)
    dest = "/engines/src/TensorRT-LLM-v0.20.0"
    clone = command_starting(cmds, "env", "GIT_LFS_SKIP_SMUDGE=1", "git", "clone")
    assert clone[4:] == [
        "--quiet", "--depth", "1", "--filter=blob:none", "--sparse", "--branch", "v0.20.0",
        "https://github.com/NVIDIA/TensorRT-LLM.git", f"{dest}.partial",
    ]  # fmt: skip
    assert ["git", "-C", f"{dest}.partial", "sparse-checkout", "set", "examples"] in cmds
    command_starting(cmds, "python3", f"{dest}/examples/models/core/llama/convert_checkpoint.py")
    # The clone precedes the conversion that needs it.
    assert cmds.index(clone) < next(i for i, c in enumerate(cmds) if c[0] == "python3")


def test_dry_run_downloads_a_hub_model_before_converting_it(tmp_path: Path) -> None:
    examples = make_examples(tmp_path)
    target = tmp_path / "store" / "hf" / "model"
    result = run(
        ["--hf-model", str(target), "--hf-model-id", "org/model", "--hf-revision", "main",
         "--family", "llama", "--dtype", "float16", "--examples-dir", str(examples), "--dry-run"],
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    cmds = commands(result.stdout)
    download = command_starting(cmds, "python3", "-c")
    assert "snapshot_download" in download[2]
    assert download[3:] == ["org/model", "main", f"{target}.partial"]
    assert ["mv", f"{target}.partial", str(target)] in cmds


# --- errors -------------------------------------------------------------------------------------------


def test_a_missing_model_directory_is_a_clear_error(tmp_path: Path) -> None:
    result = run(["--hf-model", str(tmp_path / "nope"), "--dry-run"], cwd=tmp_path)
    assert result.returncode == 1
    assert f"Hugging Face model directory not found: {tmp_path / 'nope'}" in result.stderr


def test_an_unknown_model_type_asks_for_a_family(tmp_path: Path) -> None:
    model = make_hf_model(tmp_path, model_type="mamba2")
    result = run(["--hf-model", str(model), "--dry-run"], cwd=tmp_path)
    assert result.returncode == 1
    assert "model_type 'mamba2' has no known convert_checkpoint.py family; pass --family" in result.stderr


def test_missing_examples_name_the_ways_to_provide_them(tmp_path: Path) -> None:
    model = make_hf_model(tmp_path)
    result = run(
        ["--hf-model", str(model), "--trtllm-version", "0.20.0", "--cache-dir", "/c", "--dry-run"],
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert "--examples-dir" in result.stderr
    assert "--fetch-examples" in result.stderr
    assert "/c/src/TensorRT-LLM-v0.20.0" in result.stderr


def test_an_examples_dir_without_the_family_script_is_a_clear_error(tmp_path: Path) -> None:
    model = make_hf_model(tmp_path)
    examples = make_examples(tmp_path, "gpt")
    result = run(["--hf-model", str(model), "--examples-dir", str(examples), "--dry-run"], cwd=tmp_path)
    assert result.returncode == 1
    assert f"no convert_checkpoint.py for family 'llama' under {examples}" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "0"], "--tp must be a positive integer, got '0'"),
        (["--dtype", "int8"], "--dtype must be auto, float16 or bfloat16"),
        (
            ["--max-input-len", "9000", "--max-seq-len", "8192"],
            "--max-input-len 9000 exceeds --max-seq-len 8192",
        ),
        (["--variant", "old"], "--variant must be current or legacy"),
        (["--bogus"], "unknown option: --bogus"),
    ],
)
def test_bad_options_are_rejected_by_name(tmp_path: Path, args: list[str], message: str) -> None:
    model = make_hf_model(tmp_path)
    result = run(["--hf-model", str(model), "--dry-run", *args], cwd=tmp_path)
    assert result.returncode == 1
    assert message in result.stderr


def test_without_dry_run_a_missing_trtllm_build_is_named(tmp_path: Path) -> None:
    model = make_hf_model(tmp_path)
    bin_dir = hermetic_path(tmp_path)
    result = run(["--hf-model", str(model), "--examples-dir", "/x"], cwd=tmp_path, env={"PATH": str(bin_dir)})
    assert result.returncode == 1
    assert "trtllm-build not found on PATH" in result.stderr


def test_without_dry_run_a_missing_gpu_driver_is_named(tmp_path: Path) -> None:
    model = make_hf_model(tmp_path)
    bin_dir = hermetic_path(tmp_path)
    write_tool(bin_dir, "trtllm-build", "#!/bin/sh\nexit 0\n")
    result = run(["--hf-model", str(model), "--examples-dir", "/x"], cwd=tmp_path, env={"PATH": str(bin_dir)})
    assert result.returncode == 1
    assert "nvidia-smi not found on PATH: building an engine needs an NVIDIA GPU" in result.stderr


# --- real runs with fake tools: the cache -----------------------------------------------------------------

# Stands in for a family's convert_checkpoint.py: records its argv, writes a TensorRT-LLM checkpoint config.
FAKE_CONVERT = """\
import json, os, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write("convert " + " ".join(sys.argv[1:]) + "\\n")
tp, pp = int(args["--tp_size"]), int(args["--pp_size"])
os.makedirs(args["--output_dir"], exist_ok=True)
with open(os.path.join(args["--output_dir"], "config.json"), "w") as f:
    json.dump({"mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}}, f)
"""

FAKE_TRTLLM_BUILD = """\
#!/usr/bin/env python3
import json, os, sys
if sys.argv[1:] == ["--help"]:
    print("usage: trtllm-build [--checkpoint_dir CHECKPOINT_DIR] [--kv_cache_type KV_CACHE_TYPE]")
    sys.exit(0)
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write("build " + " ".join(sys.argv[1:]) + "\\n")
ckpt = json.load(open(os.path.join(args["--checkpoint_dir"], "config.json")))
os.makedirs(args["--output_dir"], exist_ok=True)
for rank in range(ckpt["mapping"]["world_size"]):
    open(os.path.join(args["--output_dir"], f"rank{rank}.engine"), "wb").close()
with open(os.path.join(args["--output_dir"], "config.json"), "w") as f:
    json.dump({"pretrained_config": {"mapping": ckpt["mapping"]}}, f)
"""

FAKE_NVIDIA_SMI = """\
#!/bin/sh
case "$*" in
  *--list-gpus*) for i in $(seq 1 "${FAKE_GPUS:-1}"); do echo "GPU $i: NVIDIA H100 (UUID: G-$i)"; done ;;
  *--query-gpu*) for i in $(seq 1 "${FAKE_GPUS:-1}"); do echo "NVIDIA H100, 9.0"; done ;;
esac
"""


@pytest.fixture
def fake_toolchain(tmp_path: Path) -> dict[str, str]:
    """PATH and PYTHONPATH of a machine with a GPU and tensorrt_llm 0.20.0 (all fakes)."""
    bin_dir = hermetic_path(tmp_path)
    for tool in ("seq",):
        found = shutil.which(tool)
        assert found
        (bin_dir / tool).symlink_to(found)
    write_tool(bin_dir, "trtllm-build", FAKE_TRTLLM_BUILD.replace("/usr/bin/env python3", sys.executable))
    write_tool(bin_dir, "nvidia-smi", FAKE_NVIDIA_SMI)
    site = tmp_path / "site"
    dist = site / "tensorrt_llm-0.20.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 0.20.0\n")
    return {"PATH": str(bin_dir), "PYTHONPATH": str(site), "FAKE_LOG": str(tmp_path / "steps.log")}


def steps(env: dict[str, str]) -> list[str]:
    log = Path(env["FAKE_LOG"])
    lines = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return [line.split(" ", 1)[0] for line in lines]


def test_a_second_run_with_the_same_inputs_does_no_work(
    tmp_path: Path, fake_toolchain: dict[str, str]
) -> None:
    model = make_hf_model(tmp_path)
    examples = make_examples(tmp_path)
    args = [
        "--hf-model",
        str(model),
        "--examples-dir",
        str(examples),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--tp",
        "2",
    ]
    env = {**fake_toolchain, "FAKE_GPUS": "2"}

    first = run(args, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    assert steps(env) == ["convert", "build"]
    engine = Path(first.stdout.splitlines()[-1].removeprefix("ENGINE_DIR="))
    assert sorted(p.name for p in engine.iterdir()) == [
        ".complete",
        "config.json",
        "rank0.engine",
        "rank1.engine",
    ]
    assert not list((tmp_path / "cache").rglob("*.partial"))

    second = run(args, cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stderr
    assert steps(env) == []
    assert "checkpoint cached" in second.stderr and "engine cached" in second.stderr
    assert second.stdout.splitlines()[-1] == f"ENGINE_DIR={engine}"


def test_changing_an_engine_limit_rebuilds_the_engine_but_reuses_the_checkpoint(
    tmp_path: Path, fake_toolchain: dict[str, str]
) -> None:
    model = make_hf_model(tmp_path)
    examples = make_examples(tmp_path)
    args = ["--hf-model", str(model), "--examples-dir", str(examples), "--cache-dir", str(tmp_path / "cache")]
    assert run(args, cwd=tmp_path, env=fake_toolchain).returncode == 0
    assert steps(fake_toolchain) == ["convert", "build"]

    bigger = run([*args, "--max-batch-size", "128"], cwd=tmp_path, env=fake_toolchain)
    assert bigger.returncode == 0, bigger.stderr
    assert steps(fake_toolchain) == ["build"]
    # The fake trtllm-build --help advertises --kv_cache_type, so the current flag was chosen.
    build = flags(command_starting(commands(bigger.stdout), "trtllm-build")[1:])
    assert (build["--kv_cache_type"], build["--max_batch_size"]) == ("paged", "128")

    forced = run([*args, "--force"], cwd=tmp_path, env=fake_toolchain)
    assert forced.returncode == 0, forced.stderr
    assert steps(fake_toolchain) == ["convert", "build"]


def test_new_weights_invalidate_the_cached_checkpoint(tmp_path: Path, fake_toolchain: dict[str, str]) -> None:
    model = make_hf_model(tmp_path)
    examples = make_examples(tmp_path)
    args = ["--hf-model", str(model), "--examples-dir", str(examples), "--cache-dir", str(tmp_path / "cache")]
    assert run(args, cwd=tmp_path, env=fake_toolchain).returncode == 0
    steps(fake_toolchain)
    (model / "model.safetensors").write_bytes(b"\0" * 128)
    again = run(args, cwd=tmp_path, env=fake_toolchain)
    assert again.returncode == 0, again.stderr
    assert steps(fake_toolchain) == ["convert", "build"]


def test_a_failed_build_leaves_no_engine_that_looks_complete(
    tmp_path: Path, fake_toolchain: dict[str, str]
) -> None:
    model = make_hf_model(tmp_path)
    examples = make_examples(tmp_path)
    broken = Path(fake_toolchain["PATH"]) / "trtllm-build"
    broken.unlink()
    write_tool(
        broken.parent,
        "trtllm-build",
        "#!/bin/sh\n[ \"$1\" = --help ] && exit 0\necho 'out of memory' >&2\nexit 3\n",
    )
    args = ["--hf-model", str(model), "--examples-dir", str(examples), "--cache-dir", str(tmp_path / "cache")]
    failed = run(args, cwd=tmp_path, env=fake_toolchain)
    assert failed.returncode == 3
    assert not list((tmp_path / "cache" / "engines").glob("*/.complete"))
    # The checkpoint step had finished and stays cached for the retry.
    assert steps(fake_toolchain) == ["convert"]
    assert len(list((tmp_path / "cache" / "checkpoints").glob("*/.complete"))) == 1


def test_a_tensorrt_llm_version_mismatch_is_refused(tmp_path: Path, fake_toolchain: dict[str, str]) -> None:
    model = make_hf_model(tmp_path)
    examples = make_examples(tmp_path)
    result = run(
        ["--hf-model", str(model), "--examples-dir", str(examples), "--trtllm-version", "0.19.0"],
        cwd=tmp_path,
        env=fake_toolchain,
    )
    assert result.returncode == 1
    assert "--trtllm-version 0.19.0, but tensorrt_llm 0.20.0 is installed" in result.stderr


# --- checkpoint to rendered GPU repository in one command ---------------------------------------------------

LAUNCH = REPO / "deploy" / "launch_triton.sh"


def parameters(config: Any) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


@pytest.mark.parametrize("variant", ["current", "legacy"])
def test_one_command_takes_a_checkpoint_to_a_valid_gpu_repository(
    tmp_path: Path, fake_toolchain: dict[str, str], variant: str
) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    model = make_hf_model(tmp_path)
    examples = make_examples(tmp_path)
    repo = tmp_path / "model_repo"
    env = {**fake_toolchain, "FAKE_GPUS": "2", "DEPLOY_PYTHON": sys.executable}
    args = ["--hf-model", str(model), "--examples-dir", str(examples), "--cache-dir", str(tmp_path / "cache")]
    args += ["--tp", "2", "--repo-out", str(repo), "--variant", variant]
    result = run(args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    engine = result.stdout.splitlines()[-2].removeprefix("ENGINE_DIR=")
    assert result.stdout.splitlines()[-1] == f"MODEL_REPO_DIR={repo}"

    configs = {}
    for name in ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble"):
        configs[name] = text_format.Parse(
            (repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
        )
    engine_model = configs["tensorrt_llm"]
    assert engine_model.backend == "tensorrtllm"
    assert engine_model.model_transaction_policy.decoupled is True
    assert engine_model.max_batch_size == 64
    params = parameters(engine_model)
    assert params["gpt_model_path"] == engine
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["exclude_input_in_output"] == "true"
    assert params["enable_kv_cache_reuse"] == "true"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert params["batch_scheduler_policy"] == "guaranteed_no_evict"
    for name in ("preprocessing", "postprocessing"):
        assert parameters(configs[name])["tokenizer_dir"] == str(model)
    # The stock tensor contract the gateway relies on.
    inputs = {i.name for i in configs["ensemble"].input}
    assert {"text_input", "max_tokens", "stream", "stop_words", "end_id", "pad_id"} <= inputs
    assert ("seed" in inputs, "random_seed" in inputs) == (
        (True, False) if variant == "current" else (False, True)
    )
    assert "text_output" in {o.name for o in configs["ensemble"].output}

    # launch_triton.sh reads the engine's world size through the rendered gpt_model_path.
    launched = subprocess.run(
        ["bash", str(LAUNCH), "--model-repo", str(repo), "--tritonserver", "/bin/true"],
        env={"PATH": env["PATH"], "FAKE_GPUS": "1"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert launched.returncode == 1
    assert "the engine needs 2 GPU(s), nvidia-smi lists 1" in launched.stderr


def test_a_bad_renderer_variable_fails_the_command_by_name(
    tmp_path: Path, fake_toolchain: dict[str, str]
) -> None:
    model = make_hf_model(tmp_path)
    examples = make_examples(tmp_path)
    env = {**fake_toolchain, "DEPLOY_PYTHON": sys.executable}
    args = ["--hf-model", str(model), "--examples-dir", str(examples), "--cache-dir", str(tmp_path / "cache")]
    args += ["--repo-out", str(tmp_path / "repo"), "--set", "max_beam_widht=2"]
    result = run(args, cwd=tmp_path, env=env)
    assert result.returncode == 2
    assert "max_beam_widht" in result.stderr
    assert not (tmp_path / "repo").exists()


def test_a_renderer_that_cannot_run_is_reported_before_any_build_work(
    tmp_path: Path, fake_toolchain: dict[str, str]
) -> None:
    model = make_hf_model(tmp_path)
    examples = make_examples(tmp_path)
    # The bare interpreter (not this venv, where the project is installed) with an empty path: no renderer.
    bare = os.path.realpath(sys.executable)
    env = {**fake_toolchain, "DEPLOY_PYTHON": bare, "DEPLOY_PYTHONPATH": str(tmp_path / "empty")}
    args = ["--hf-model", str(model), "--examples-dir", str(examples), "--repo-out", str(tmp_path / "repo")]
    result = run([*args, "--cache-dir", str(tmp_path / "cache")], cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert "the repository renderer (deploy.model_repo) does not import" in result.stderr
    assert steps(fake_toolchain) == []
