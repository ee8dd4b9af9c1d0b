"""Vision-language models on GPU hosts, checked offline: upstream's C++ multimodal repository assembled
and filled by `deploy.model_repo render-multimodal`, the visual-engine step of deploy/build_engine.sh
(--dry-run), and the llmapi model with `triton_config.multimodal` (render-llmapi, launch_llmapi.sh).

Upstream's templates are not in this repository: a small tree with their layout and parameter names
stands in (TRITON_ALL_MODELS=<triton_backend/all_models> runs the same checks on a real one)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from tritonclient.grpc import model_config_pb2

from deploy.model_repo import (
    LlmapiSettings,
    ModelConfigValidationError,
    ModelRepoError,
    MultimodalSettings,
    load_model_configs,
    main,
    render_llmapi_repository,
    render_multimodal_repository,
)

REPO = Path(__file__).resolve().parents[3]


def _tensor(name: str, dtype: str, dims: str, *, optional: bool = False) -> str:
    return f'{{ name: "{name}" data_type: {dtype} dims: [ {dims} ]{" optional: true" if optional else ""} }}'


def _param(key: str) -> str:
    """A parameter as upstream writes it: `name` or `key=placeholder` where they differ."""
    key, _, placeholder = key.partition("=")
    return f'parameters {{ key: "{key}" value: {{ string_value: "${{{placeholder or key}}}" }} }}'


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1{maps} }}'


def fake_upstream(root: Path, *, visual_key: str = "multimodal_model_path") -> Path:
    """A triton_backend/all_models tree with upstream's layout, tensor and parameter names."""
    batching = (
        "dynamic_batching { max_queue_delay_microseconds: ${max_queue_delay_microseconds} "
        "default_queue_policy: { max_queue_size: ${max_queue_size} } }"
    )
    models = {
        "inflight_batcher_llm/preprocessing": [
            'name: "preprocessing"\nbackend: "python"\nmax_batch_size: ${triton_max_batch_size}',
            batching,
            "input [ "
            + ", ".join(
                [
                    _tensor("QUERY", "TYPE_STRING", "1"),
                    _tensor("IMAGE_URL", "TYPE_STRING", "-1", optional=True),
                    _tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", "1"),
                ]
            )
            + " ]",
            "output [ "
            + ", ".join(
                [
                    _tensor("INPUT_ID", "TYPE_INT32", "-1"),
                    _tensor("REQUEST_INPUT_LEN", "TYPE_INT32", "1"),
                    _tensor("PIXEL_VALUES", "TYPE_FP16", "-1, -1, -1, -1"),
                    _tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", "-1"),
                ]
            )
            + " ]",
            *map(
                _param,
                (
                    "tokenizer_dir",
                    "add_special_tokens",
                    visual_key,
                    "gpt_model_path=engine_dir",
                    "max_num_images",
                ),
            ),
            "instance_group [ { count: ${preprocessing_instance_count} kind: KIND_CPU } ]",
        ],
        "multimodal/multimodal_encoders": [
            'name: "multimodal_encoders"\nbackend: "python"\nmax_batch_size: ${triton_max_batch_size}',
            batching,
            "input [ " + _tensor("pixel_values", "TYPE_FP16", "-1, -1, -1, -1", optional=True) + " ]",
            "output [ "
            + ", ".join(
                [
                    _tensor("OUT_PROMPT_EMBEDDING_TABLE", "${prompt_embedding_table_data_type}", "-1, -1"),
                    _tensor("OUT_PROMPT_VOCAB_SIZE", "TYPE_INT32", "1"),
                    _tensor("ENCODER_INPUT_FEATURES", "${encoder_input_features_data_type}", "-1, -1"),
                ]
            )
            + " ]",
            *map(_param, (visual_key, "hf_model_path")),
        ],
        "inflight_batcher_llm/tensorrt_llm": [
            'name: "tensorrt_llm"\nbackend: "${triton_backend}"\nmax_batch_size: ${triton_max_batch_size}',
            "model_transaction_policy { decoupled: ${decoupled_mode} }",
            batching,
            "input [ "
            + ", ".join(
                [
                    _tensor("input_ids", "TYPE_INT32", "-1"),
                    _tensor("input_lengths", "TYPE_INT32", "1"),
                    _tensor("request_output_len", "TYPE_INT32", "1"),
                    _tensor("prompt_embedding_table", "TYPE_FP16", "-1, -1", optional=True),
                    _tensor("prompt_vocab_size", "TYPE_INT32", "1", optional=True),
                    _tensor(
                        "encoder_input_features",
                        "${encoder_input_features_data_type}",
                        "-1, -1",
                        optional=True,
                    ),
                    _tensor("streaming", "TYPE_BOOL", "1", optional=True),
                ]
            )
            + " ]",
            "output [ "
            + ", ".join(
                [
                    _tensor("output_ids", "TYPE_INT32", "-1, -1"),
                    _tensor("sequence_length", "TYPE_INT32", "-1"),
                ]
            )
            + " ]",
            *map(
                _param,
                (
                    "max_beam_width",
                    "gpt_model_type=batching_strategy",
                    "gpt_model_path=engine_dir",
                    "encoder_model_path=encoder_engine_dir",
                    "batch_scheduler_policy",
                    "kv_cache_free_gpu_mem_fraction",
                    "cross_kv_cache_fraction",
                    "exclude_input_in_output",
                    "enable_kv_cache_reuse",
                    "enable_chunked_context",
                    "lora_cache_max_adapter_size",
                ),
            ),
        ],
        "inflight_batcher_llm/postprocessing": [
            'name: "postprocessing"\nbackend: "python"\nmax_batch_size: ${triton_max_batch_size}',
            "input [ "
            + ", ".join(
                [
                    _tensor("TOKENS_BATCH", "TYPE_INT32", "-1, -1"),
                    _tensor("SEQUENCE_LENGTH", "TYPE_INT32", "-1"),
                ]
            )
            + " ]",
            "output [ " + _tensor("OUTPUT", "TYPE_STRING", "-1") + " ]",
            *map(_param, ("tokenizer_dir", "skip_special_tokens")),
            "instance_group [ { count: ${postprocessing_instance_count} kind: KIND_CPU } ]",
        ],
        "multimodal/ensemble": [
            'name: "ensemble"\nplatform: "ensemble"\nmax_batch_size: ${triton_max_batch_size}',
            "input [ "
            + ", ".join(
                [
                    _tensor("text_input", "TYPE_STRING", "1"),
                    _tensor("image_url_input", "TYPE_STRING", "-1", optional=True),
                    _tensor("max_tokens", "TYPE_INT32", "1"),
                    _tensor("stream", "TYPE_BOOL", "1", optional=True),
                ]
            )
            + " ]",
            "output [ " + _tensor("text_output", "TYPE_STRING", "-1") + " ]",
            "ensemble_scheduling { step [ "
            + ", ".join(
                [
                    _step(
                        "preprocessing",
                        {
                            "QUERY": "text_input",
                            "IMAGE_URL": "image_url_input",
                            "REQUEST_OUTPUT_LEN": "max_tokens",
                        },
                        {
                            "INPUT_ID": "_INPUT_ID",
                            "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
                            "PIXEL_VALUES": "_PIXEL_VALUES",
                            "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
                        },
                    ),
                    _step(
                        "multimodal_encoders",
                        {"pixel_values": "_PIXEL_VALUES"},
                        {"OUT_PROMPT_EMBEDDING_TABLE": "_TABLE", "OUT_PROMPT_VOCAB_SIZE": "_VOCAB"},
                    ),
                    _step(
                        "tensorrt_llm",
                        {
                            "input_ids": "_INPUT_ID",
                            "input_lengths": "_REQUEST_INPUT_LEN",
                            "request_output_len": "_REQUEST_OUTPUT_LEN",
                            "prompt_embedding_table": "_TABLE",
                            "prompt_vocab_size": "_VOCAB",
                            "streaming": "stream",
                        },
                        {"output_ids": "_TOKENS", "sequence_length": "_LENGTH"},
                    ),
                    _step(
                        "postprocessing",
                        {"TOKENS_BATCH": "_TOKENS", "SEQUENCE_LENGTH": "_LENGTH"},
                        {"OUTPUT": "text_output"},
                    ),
                ]
            )
            + " ] }",
        ],
    }
    for path, lines in models.items():
        model_dir = root / "all_models" / path
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text("\n".join(lines) + "\n")
        if "ensemble" not in path and "tensorrt_llm" not in path:
            (model_dir / "1" / "model.py").write_text("# upstream's model\n")
    return root / "all_models"


SETTINGS = MultimodalSettings(engine_dir="/e/llm", visual_engine_dir="/e/vision", hf_model_dir="/hf/llava")


def _params(config: object) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}  # type: ignore[attr-defined]


def test_the_repository_is_upstreams_five_models_filled_in_and_wired(tmp_path: Path) -> None:
    upstream = Path(os.environ.get("TRITON_ALL_MODELS") or fake_upstream(tmp_path))
    out = render_multimodal_repository(tmp_path / "repo", SETTINGS, upstream=upstream)
    configs = load_model_configs(out)
    assert set(configs) == {
        "preprocessing",
        "multimodal_encoders",
        "tensorrt_llm",
        "postprocessing",
        "ensemble",
    }
    assert [step.model_name for step in configs["ensemble"].ensemble_scheduling.step] == [
        "preprocessing", "multimodal_encoders", "tensorrt_llm", "postprocessing",
    ]  # fmt: skip
    engine = _params(configs["tensorrt_llm"])
    assert configs["tensorrt_llm"].backend == "tensorrtllm"
    assert configs["tensorrt_llm"].model_transaction_policy.decoupled is True
    assert engine["gpt_model_path"] == "/e/llm" and engine["exclude_input_in_output"] == "true"
    assert engine["gpt_model_type"] == "inflight_fused_batching"
    # Reuse stays off unless asked: it needs a prompt_table_extra_id per image on every request.
    assert engine["enable_kv_cache_reuse"] == "false"
    # What is not set stays upstream's unset marker, which the backend reads as its default.
    assert engine["lora_cache_max_adapter_size"] == "${lora_cache_max_adapter_size}"
    pre = _params(configs["preprocessing"])
    # Releases before 0.19 call the visual engine visual_model_path.
    visual = "multimodal_model_path" if "multimodal_model_path" in pre else "visual_model_path"
    assert (pre[visual], pre["gpt_model_path"], pre["tokenizer_dir"]) == ("/e/vision", "/e/llm", "/hf/llava")
    assert pre["max_num_images"] == "1"
    encoders = _params(configs["multimodal_encoders"])
    assert (encoders[visual], encoders["hf_model_path"]) == ("/e/vision", "/hf/llava")
    assert all(c.max_batch_size == 8 for name, c in configs.items())
    assert (out / "preprocessing" / "1" / "model.py").is_file()
    assert "image_url_input" in {t.name for t in configs["ensemble"].input}


def test_releases_before_0_19_name_the_visual_engine_visual_model_path(tmp_path: Path) -> None:
    upstream = fake_upstream(tmp_path, visual_key="visual_model_path")
    configs = load_model_configs(render_multimodal_repository(tmp_path / "repo", SETTINGS, upstream=upstream))
    assert _params(configs["preprocessing"])["visual_model_path"] == "/e/vision"
    assert _params(configs["multimodal_encoders"])["visual_model_path"] == "/e/vision"


def test_the_cli_takes_the_engines_and_per_model_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream = fake_upstream(tmp_path)
    code = main(
        ["render-multimodal", "--upstream", str(upstream), "--out", str(tmp_path / "repo"),
         "--engine-dir", "/e/llm", "--visual-engine-dir", "/e/v", "--hf-model-dir", "/hf/m",
         "--max-batch-size", "4", "--max-num-images", "2", "--no-decoupled",
         "--encoder-dtype", "TYPE_BF16", "--cross-kv-cache-fraction", "0.5",
         "--set", "tensorrt_llm.enable_chunked_context=true"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    configs = load_model_configs(tmp_path / "repo")
    engine = configs["tensorrt_llm"]
    assert engine.model_transaction_policy.decoupled is False and engine.max_batch_size == 4
    assert _params(engine)["enable_chunked_context"] == "true"
    assert _params(engine)["cross_kv_cache_fraction"] == "0.5"
    assert _params(configs["preprocessing"])["max_num_images"] == "2"
    features = {t.name: t for t in configs["multimodal_encoders"].output}["ENCODER_INPUT_FEATURES"]
    assert model_config_pb2.DataType.Name(features.data_type) == "TYPE_BF16"
    assert main(["render-multimodal", "--upstream", str(upstream), "--out", str(tmp_path / "r2"),
                 "--engine-dir", "/e", "--visual-engine-dir", "/v", "--hf-model-dir", "/m",
                 "--set", "enable_chunked_context=true"]) == 2  # fmt: skip
    assert "expected --set MODEL.KEY=VALUE" in capsys.readouterr().err


def test_a_tree_that_is_not_the_multimodal_layout_is_refused_by_name(tmp_path: Path) -> None:
    upstream = fake_upstream(tmp_path)
    with pytest.raises(ModelRepoError, match=r"a release up to 1\.2"):
        render_multimodal_repository(tmp_path / "r", SETTINGS, upstream=tmp_path)
    # A release whose engine template has no engine_dir would leave the engine unconfigured.
    engine = upstream / "inflight_batcher_llm" / "tensorrt_llm" / "config.pbtxt"
    engine.write_text(engine.read_text().replace("${engine_dir}", "${gpt_model_path}"))
    with pytest.raises(ModelConfigValidationError, match=r"has no \$\{engine_dir\}"):
        render_multimodal_repository(tmp_path / "r", SETTINGS, upstream=upstream)
    assert not (tmp_path / "r").exists()


def test_a_placeholder_left_outside_a_parameter_is_an_error(tmp_path: Path) -> None:
    upstream = fake_upstream(tmp_path)
    post = upstream / "inflight_batcher_llm" / "postprocessing" / "config.pbtxt"
    post.write_text(post.read_text() + "dynamic_batching { max_queue_delay_microseconds: ${post_delay} }\n")
    with pytest.raises(ModelConfigValidationError, match=r"\$\{post_delay\} is not filled in"):
        render_multimodal_repository(tmp_path / "r", SETTINGS, upstream=upstream)


def test_an_ensemble_without_image_inputs_is_not_the_multimodal_one(tmp_path: Path) -> None:
    upstream = fake_upstream(tmp_path)
    ensemble = upstream / "multimodal" / "ensemble" / "config.pbtxt"
    text = ensemble.read_text()
    text = text.replace(", " + _tensor("image_url_input", "TYPE_STRING", "-1", optional=True), "")
    ensemble.write_text(text.replace(' input_map { key: "IMAGE_URL" value: "image_url_input" }', ""))
    with pytest.raises(ModelConfigValidationError, match="not the multimodal ensemble"):
        render_multimodal_repository(tmp_path / "r", SETTINGS, upstream=upstream)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_num_images": 0}, "max_num_images must be >= 1"),
        (
            {"encoder_input_features_data_type": "TYPE_INT8"},
            "encoder_input_features_data_type must be one of",
        ),
        ({"engine_dir": '/e/"x'}, "must not contain quotes"),
    ],
)
def test_bad_settings_are_refused_by_name(tmp_path: Path, change: dict[str, object], message: str) -> None:
    settings = MultimodalSettings(
        **{**{f: getattr(SETTINGS, f) for f in ("engine_dir", "visual_engine_dir", "hf_model_dir")}, **change}
    )  # type: ignore[arg-type]
    with pytest.raises(ModelRepoError, match=message):
        render_multimodal_repository(tmp_path / "r", settings, upstream=fake_upstream(tmp_path))


# --- the llmapi model with images ----------------------------------------------------------------------


def test_llmapi_multimodal_sets_triton_config_multimodal(tmp_path: Path) -> None:
    out = render_llmapi_repository(
        tmp_path / "r", LlmapiSettings(model="Qwen/Qwen2.5-VL-3B-Instruct", multimodal=True)
    )
    data = yaml.safe_load((out / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert data["triton_config"] == {"max_batch_size": 0, "decoupled": True, "multimodal": True}
    text_only = render_llmapi_repository(tmp_path / "t", LlmapiSettings(model="m"))
    assert (
        "multimodal"
        not in yaml.safe_load((text_only / "tensorrt_llm" / "1" / "model.yaml").read_text())["triton_config"]
    )


def test_llmapi_multimodal_needs_a_config_with_the_image_url_input(tmp_path: Path) -> None:
    # TensorRT-LLM 1.2's config.pbtxt has no image_url: Triton would refuse every request with images.
    with pytest.raises(ModelRepoError, match="declares no image_url input"):
        render_llmapi_repository(tmp_path / "r", LlmapiSettings(model="m", profile="v1.2", multimodal=True))
    assert not (tmp_path / "r").exists()


def test_launch_llmapi_passes_multimodal_to_the_renderer() -> None:
    for args, env in ((["--multimodal"], {}), ([], {"LLMAPI_MULTIMODAL": "1"})):
        result = subprocess.run(
            ["bash", str(REPO / "deploy" / "launch_llmapi.sh"), "--dry-run", "--model-repo", "/r",
             "--hf-model", "m", *args],
            capture_output=True, text=True, timeout=30, check=True, env={**os.environ, **env},
        )  # fmt: skip
        render = shlex.split(result.stdout.splitlines()[0][2:])
        assert render[3] == "render-llmapi" and "--multimodal" in render


# --- build_engine.sh: the visual engine beside the LLM engine --------------------------------------------


def _dry_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    model = tmp_path / "hf" / "llava"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(
        '{"model_type": "llava", "torch_dtype": "float16", '
        '"text_config": {"model_type": "llama", "max_position_embeddings": 4096}}'
    )
    (tmp_path / "examples" / "models" / "core" / "llama").mkdir(parents=True, exist_ok=True)
    (tmp_path / "examples" / "models" / "core" / "llama" / "convert_checkpoint.py").write_text("")
    return subprocess.run(
        ["bash", str(REPO / "deploy" / "build_engine.sh"), "--hf-model", str(model), "--examples-dir",
         str(tmp_path / "examples"), "--cache-dir", "/eng", "--repo-out", "/repo", "--dry-run", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LC_ALL": "C"},
    )  # fmt: skip


def _commands(stdout: str) -> list[list[str]]:
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


def test_build_engine_builds_the_visual_engine_and_renders_the_multimodal_repository(tmp_path: Path) -> None:
    result = _dry_run(tmp_path, "--multimodal", "auto", "--max-batch-size", "8", "--max-images", "2")
    assert result.returncode == 0, result.stderr
    cmds = _commands(result.stdout)
    # The language model's family comes from text_config (llava's LLM is a llama).
    (convert,) = [
        c
        for c in cmds
        if c[:2] == ["python3", str(tmp_path / "examples/models/core/llama/convert_checkpoint.py")]
    ]
    (build,) = [c for c in cmds if c[0] == "trtllm-build"]
    # Prompt-table rows: batch 8 x 576 features (llava) x 2 images.
    assert build[build.index("--max_multimodal_len") + 1] == str(8 * 576 * 2)
    assert build[build.index("--max_seq_len") + 1] == "4096"
    (visual,) = [
        c
        for c in cmds
        if c[:2] == ["python3", str(tmp_path / "examples/models/core/multimodal/build_multimodal_engine.py")]
    ]
    options = dict(zip(visual[2::2], visual[3::2], strict=True))
    assert options["--model_type"] == "llava" and options["--model_path"] == str(tmp_path / "hf" / "llava")
    assert options["--max_batch_size"] == "16"
    visual_dir = options["--output_dir"].removesuffix(".partial")
    assert visual_dir.startswith("/eng/visual/llava-llava-")
    assert ["mv", options["--output_dir"], visual_dir] in cmds
    (render,) = [c for c in cmds if "render-multimodal" in c]
    assert render[5:6] == ["render-multimodal"] and "--overwrite" in render
    flags = {
        arg: render[i + 1] for i, arg in enumerate(render) if arg.startswith("--") and arg != "--overwrite"
    }
    engine_dir = build[build.index("--output_dir") + 1].removesuffix(".partial")
    assert flags["--upstream"] == str(tmp_path / "triton_backend" / "all_models")
    assert (flags["--engine-dir"], flags["--visual-engine-dir"]) == (engine_dir, visual_dir)
    assert flags["--max-num-images"] == "2" and flags["--encoder-dtype"] == "TYPE_FP16"
    assert f"VISUAL_ENGINE_DIR={visual_dir}" in result.stdout.splitlines()
    assert convert


def test_build_engine_text_models_get_no_visual_step(tmp_path: Path) -> None:
    result = _dry_run(tmp_path, "--family", "llama")
    assert result.returncode == 0, result.stderr
    assert "build_multimodal_engine" not in result.stdout and "--max_multimodal_len" not in result.stdout
    assert "render-multimodal" not in result.stdout


def test_build_engine_asks_for_image_features_it_cannot_know(tmp_path: Path) -> None:
    result = _dry_run(tmp_path, "--multimodal", "qwen2_vl")
    assert result.returncode != 0 and "pass --image-features" in result.stderr
    result = _dry_run(tmp_path, "--multimodal", "qwen2_vl", "--image-features", "324")
    assert result.returncode == 0, result.stderr
    assert "--max_multimodal_len 20736" in result.stdout  # 64 x 324 x 1
