"""The model repository renderer: stock tensor contract per variant, parameters, and its failure modes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from deploy import model_repo
from deploy.model_repo import (
    ModelConfigValidationError,
    ModelRepoError,
    TemplateSyntaxError,
    TemplateVariableError,
    load_model_configs,
    render_repository,
    render_text,
)

TYPE = model_config_pb2.DataType.Value
BOTH = ("current", "legacy")
CURRENT = ("current",)
LEGACY = ("legacy",)
# (name, data type, dims, variants that declare it), as in the stock repositories.
Row = tuple[str, str, list[int], tuple[str, ...]]

ENSEMBLE_INPUTS: list[Row] = [
    ("text_input", "TYPE_STRING", [1], BOTH),
    ("max_tokens", "TYPE_INT32", [1], BOTH),
    ("bad_words", "TYPE_STRING", [-1], BOTH),
    ("stop_words", "TYPE_STRING", [-1], BOTH),
    ("end_id", "TYPE_INT32", [1], BOTH),
    ("pad_id", "TYPE_INT32", [1], BOTH),
    ("top_k", "TYPE_INT32", [1], BOTH),
    ("top_p", "TYPE_FP32", [1], BOTH),
    ("temperature", "TYPE_FP32", [1], BOTH),
    ("length_penalty", "TYPE_FP32", [1], BOTH),
    ("repetition_penalty", "TYPE_FP32", [1], BOTH),
    ("presence_penalty", "TYPE_FP32", [1], BOTH),
    ("frequency_penalty", "TYPE_FP32", [1], BOTH),
    ("min_tokens", "TYPE_INT32", [1], CURRENT),
    ("min_length", "TYPE_INT32", [1], LEGACY),
    ("seed", "TYPE_UINT64", [1], CURRENT),
    ("random_seed", "TYPE_UINT64", [1], LEGACY),
    ("beam_width", "TYPE_INT32", [1], BOTH),
    ("num_return_sequences", "TYPE_INT32", [1], CURRENT),
    ("exclude_input_in_output", "TYPE_BOOL", [1], CURRENT),
    ("return_log_probs", "TYPE_BOOL", [1], BOTH),
    ("return_context_logits", "TYPE_BOOL", [1], BOTH),
    ("return_generation_logits", "TYPE_BOOL", [1], BOTH),
    ("return_num_input_tokens", "TYPE_BOOL", [1], CURRENT),
    ("return_num_output_tokens", "TYPE_BOOL", [1], CURRENT),
    ("return_perf_metrics", "TYPE_BOOL", [1], CURRENT),
    ("stream", "TYPE_BOOL", [1], BOTH),
    ("embedding_bias_words", "TYPE_STRING", [-1], BOTH),
    ("embedding_bias_weights", "TYPE_FP32", [-1], BOTH),
    ("prompt_embedding_table", "TYPE_FP16", [-1, -1], BOTH),
    ("prompt_vocab_size", "TYPE_INT32", [1], BOTH),
    # Passed on by the ensemble from v0.15 (the legacy variant stands for older ones).
    ("lora_task_id", "TYPE_UINT64", [1], CURRENT),
    ("lora_weights", "TYPE_FP16", [-1, -1], CURRENT),
    ("lora_config", "TYPE_INT32", [-1, 3], CURRENT),
    ("guided_decoding_guide_type", "TYPE_STRING", [1], CURRENT),
    ("guided_decoding_guide", "TYPE_STRING", [1], CURRENT),
]
ENSEMBLE_OUTPUTS: list[Row] = [
    ("text_output", "TYPE_STRING", [-1], BOTH),
    ("cum_log_probs", "TYPE_FP32", [-1], BOTH),
    ("output_log_probs", "TYPE_FP32", [-1, -1], BOTH),
    ("context_logits", "TYPE_FP32", [-1, -1], BOTH),
    ("generation_logits", "TYPE_FP32", [-1, -1, -1], BOTH),
    ("batch_index", "TYPE_INT32", [1], CURRENT),
    ("sequence_index", "TYPE_INT32", [1], CURRENT),
    ("num_input_tokens", "TYPE_INT32", [1], CURRENT),
    ("num_output_tokens", "TYPE_INT32", [1], CURRENT),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32", [1], CURRENT),
    ("arrival_time_ns", "TYPE_INT64", [1], CURRENT),
    ("acceptance_rate", "TYPE_FP32", [1], CURRENT),
]
OUTPUT_IDS: list[Row] = [
    ("output_ids", "TYPE_INT32", [-1, -1], BOTH),
    ("sequence_length", "TYPE_INT32", [-1], BOTH),
]
ENGINE_INPUTS: list[Row] = [
    ("input_ids", "TYPE_INT32", [-1], BOTH),
    ("input_lengths", "TYPE_INT32", [1], BOTH),
    ("request_output_len", "TYPE_INT32", [1], BOTH),
    ("end_id", "TYPE_INT32", [1], BOTH),
    ("pad_id", "TYPE_INT32", [1], BOTH),
    ("stop_words_list", "TYPE_INT32", [2, -1], BOTH),
    ("bad_words_list", "TYPE_INT32", [2, -1], BOTH),
    ("embedding_bias", "TYPE_FP32", [-1], BOTH),
    ("beam_width", "TYPE_INT32", [1], BOTH),
    ("temperature", "TYPE_FP32", [1], BOTH),
    ("runtime_top_k", "TYPE_INT32", [1], BOTH),
    ("runtime_top_p", "TYPE_FP32", [1], BOTH),
    ("len_penalty", "TYPE_FP32", [1], BOTH),
    ("repetition_penalty", "TYPE_FP32", [1], BOTH),
    ("presence_penalty", "TYPE_FP32", [1], BOTH),
    ("frequency_penalty", "TYPE_FP32", [1], BOTH),
    ("min_tokens", "TYPE_INT32", [1], CURRENT),
    ("min_length", "TYPE_INT32", [1], LEGACY),
    ("seed", "TYPE_UINT64", [1], CURRENT),
    ("random_seed", "TYPE_UINT64", [1], LEGACY),
    ("return_log_probs", "TYPE_BOOL", [1], BOTH),
    ("return_context_logits", "TYPE_BOOL", [1], BOTH),
    ("return_generation_logits", "TYPE_BOOL", [1], BOTH),
    ("return_num_input_tokens", "TYPE_BOOL", [1], CURRENT),
    ("return_num_output_tokens", "TYPE_BOOL", [1], CURRENT),
    ("exclude_input_in_output", "TYPE_BOOL", [1], CURRENT),
    ("num_return_sequences", "TYPE_INT32", [1], CURRENT),
    ("streaming", "TYPE_BOOL", [1], BOTH),
    ("stop", "TYPE_BOOL", [1], BOTH),
]
ENGINE_OUTPUTS: list[Row] = [
    ("output_ids", "TYPE_INT32", [-1, -1], BOTH),
    ("sequence_length", "TYPE_INT32", [-1], BOTH),
    ("cum_log_probs", "TYPE_FP32", [-1], BOTH),
    ("output_log_probs", "TYPE_FP32", [-1, -1], BOTH),
    ("context_logits", "TYPE_FP32", [-1, -1], BOTH),
    ("generation_logits", "TYPE_FP32", [-1, -1, -1], BOTH),
    ("batch_index", "TYPE_INT32", [1], CURRENT),
    ("sequence_index", "TYPE_INT32", [1], CURRENT),
    ("num_input_tokens", "TYPE_INT32", [1], CURRENT),
    ("num_output_tokens", "TYPE_INT32", [1], CURRENT),
]
PREPROCESSING_INPUTS: list[Row] = [
    ("QUERY", "TYPE_STRING", [1], BOTH),
    ("REQUEST_OUTPUT_LEN", "TYPE_INT32", [1], BOTH),
    ("BAD_WORDS_DICT", "TYPE_STRING", [-1], BOTH),
    ("STOP_WORDS_DICT", "TYPE_STRING", [-1], BOTH),
    ("EMBEDDING_BIAS_WORDS", "TYPE_STRING", [-1], BOTH),
    ("EMBEDDING_BIAS_WEIGHTS", "TYPE_FP32", [-1], BOTH),
    ("END_ID", "TYPE_INT32", [1], BOTH),
    ("PAD_ID", "TYPE_INT32", [1], BOTH),
]
PREPROCESSING_OUTPUTS: list[Row] = [
    ("INPUT_ID", "TYPE_INT32", [-1], BOTH),
    ("REQUEST_INPUT_LEN", "TYPE_INT32", [1], BOTH),
    ("BAD_WORDS_IDS", "TYPE_INT32", [2, -1], BOTH),
    ("STOP_WORDS_IDS", "TYPE_INT32", [2, -1], BOTH),
    ("EMBEDDING_BIAS", "TYPE_FP32", [-1], BOTH),
    ("REQUEST_OUTPUT_LEN", "TYPE_INT32", [-1], BOTH),
    ("OUT_END_ID", "TYPE_INT32", [1], BOTH),
    ("OUT_PAD_ID", "TYPE_INT32", [1], BOTH),
]
POSTPROCESSING_INPUTS: list[Row] = [
    ("TOKENS_BATCH", "TYPE_INT32", [-1, -1], BOTH),
    ("SEQUENCE_LENGTH", "TYPE_INT32", [-1], BOTH),
]
POSTPROCESSING_OUTPUTS: list[Row] = [("OUTPUT", "TYPE_STRING", [-1], BOTH)]

TABLES: dict[tuple[str, str], list[Row]] = {
    ("ensemble", "input"): ENSEMBLE_INPUTS,
    ("ensemble", "output"): ENSEMBLE_OUTPUTS + OUTPUT_IDS,
    ("tensorrt_llm", "input"): ENGINE_INPUTS,
    ("tensorrt_llm", "output"): ENGINE_OUTPUTS,
    ("preprocessing", "input"): PREPROCESSING_INPUTS,
    ("preprocessing", "output"): PREPROCESSING_OUTPUTS,
    ("postprocessing", "input"): POSTPROCESSING_INPUTS,
    ("postprocessing", "output"): POSTPROCESSING_OUTPUTS,
}


def _variables(backend: str, **extra: object) -> dict[str, object]:
    base: dict[str, object] = {"tokenizer_dir": "/models/tokenizer"}
    if backend == "tensorrtllm":
        base["engine_dir"] = "/engines/llama"
    base.update(extra)
    return base


def _render(
    tmp_path: Path, backend: str, variant: str, **extra: object
) -> dict[str, model_config_pb2.ModelConfig]:
    out = render_repository(
        tmp_path / "repo", backend=backend, variant=variant, variables=_variables(backend, **extra)
    )
    return load_model_configs(out)


def _parameters(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


# The backends that render the four stock models (the native engine's own test: test_native_engine.py).
@pytest.mark.parametrize("backend", sorted(model_repo.BOTH))
@pytest.mark.parametrize("variant", model_repo.VARIANTS)
def test_every_model_renders_and_parses_with_the_stock_tensor_contract(
    tmp_path: Path, backend: str, variant: str
) -> None:
    configs = _render(tmp_path, backend, variant)

    assert sorted(configs) == sorted(model_repo.MODELS)
    for (model, direction), table in TABLES.items():
        declared = {t.name: t for t in getattr(configs[model], direction)}
        for name, dtype, dims, variants in table:
            if variant in variants:
                assert name in declared, f"{model} {direction} {name} missing in {variant}"
                if backend == "cpu" and name == "prompt_embedding_table":
                    # The CPU engine computes in float32: a float16 table would round image features.
                    dtype = "TYPE_FP32"
                assert declared[name].data_type == TYPE(dtype), f"{model} {direction} {name} dtype"
                assert list(declared[name].dims) == dims, f"{model} {direction} {name} dims"
            else:
                assert name not in declared, f"{model} {direction} {name} must not exist in {variant}"
    for config in configs.values():
        assert config.max_batch_size == 64


@pytest.mark.parametrize("variant", model_repo.VARIANTS)
def test_legacy_variant_has_none_of_the_newer_tensors(tmp_path: Path, variant: str) -> None:
    configs = _render(tmp_path, "cpu", variant)
    newer = {
        "seed",
        "min_tokens",
        "exclude_input_in_output",
        "num_return_sequences",
        "return_num_input_tokens",
        "return_num_output_tokens",
        "return_perf_metrics",
        "guided_decoding_guide",
    }
    names = {t.name for t in configs["ensemble"].input} | {t.name for t in configs["tensorrt_llm"].input}
    outputs = {t.name for t in configs["ensemble"].output}
    if variant == "legacy":
        assert not names & newer
        assert not outputs & {"sequence_index", "batch_index", "num_input_tokens", "num_output_tokens"}
        assert {"random_seed", "min_length"} <= names
    else:
        assert newer <= names
        assert not names & {"random_seed", "min_length"}


def test_stock_shaped_ensemble_has_no_output_ids_and_still_feeds_postprocessing(tmp_path: Path) -> None:
    configs = _render(tmp_path, "cpu", "current", ensemble_output_ids=False)
    ensemble = configs["ensemble"]

    assert {t.name for t in ensemble.output}.isdisjoint({"output_ids", "sequence_length"})
    engine_step, post_step = ensemble.ensemble_scheduling.step[1], ensemble.ensemble_scheduling.step[2]
    assert engine_step.output_map["output_ids"] == post_step.input_map["TOKENS_BATCH"] == "_TOKENS_BATCH"
    assert engine_step.output_map["sequence_length"] == post_step.input_map["SEQUENCE_LENGTH"]


def test_our_ensemble_exposes_output_ids_that_postprocessing_also_consumes(tmp_path: Path) -> None:
    ensemble = _render(tmp_path, "cpu", "legacy")["ensemble"]
    steps = ensemble.ensemble_scheduling.step

    assert steps[1].output_map["output_ids"] == "output_ids" == steps[2].input_map["TOKENS_BATCH"]
    assert steps[1].output_map["sequence_length"] == "sequence_length"
    assert [s.model_name for s in steps] == ["preprocessing", "tensorrt_llm", "postprocessing"]


def test_ensemble_maps_stock_names_onto_engine_names(tmp_path: Path) -> None:
    engine_step = _render(tmp_path, "cpu", "current")["ensemble"].ensemble_scheduling.step[1]
    expected = {
        "runtime_top_k": "top_k",
        "runtime_top_p": "top_p",
        "len_penalty": "length_penalty",
        "streaming": "stream",
        "seed": "seed",
        "min_tokens": "min_tokens",
        "exclude_input_in_output": "exclude_input_in_output",
        "stop_words_list": "_STOP_WORDS_IDS",
        "end_id": "_PREPROCESSOR_END_ID",
    }
    assert {key: engine_step.input_map.get(key) for key in expected} == expected


def test_name_prefix_renames_every_model_and_the_ensemble_steps(tmp_path: Path) -> None:
    out = render_repository(
        tmp_path / "repo",
        backend="cpu",
        variant="legacy",
        variables=_variables("cpu", name_prefix="bpe_legacy_"),
    )
    configs = load_model_configs(out)

    assert sorted(configs) == sorted(f"bpe_legacy_{m}" for m in model_repo.MODELS)
    assert all(configs[name].name == name for name in configs)
    steps = configs["bpe_legacy_ensemble"].ensemble_scheduling.step
    assert [s.model_name for s in steps] == [
        "bpe_legacy_preprocessing",
        "bpe_legacy_tensorrt_llm",
        "bpe_legacy_postprocessing",
    ]


def test_tensorrtllm_backend_gets_the_real_backend_parameters(tmp_path: Path) -> None:
    out = render_repository(
        tmp_path / "repo",
        backend="tensorrtllm",
        variant="current",
        variables=_variables(
            "tensorrtllm",
            kv_cache_free_gpu_mem_fraction="0.85",
            enable_kv_cache_reuse=True,
            batch_scheduler_policy="max_utilization",
            exclude_input_in_output="true",
            decoupled=False,
            max_tokens_in_paged_kv_cache=4096,
            engine_instance_count=1,
        ),
    )
    engine = load_model_configs(out)["tensorrt_llm"]
    params = _parameters(engine)

    assert engine.backend == "tensorrtllm"
    assert engine.model_transaction_policy.decoupled is False
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["gpt_model_path"] == "/engines/llama"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.85"
    assert params["enable_kv_cache_reuse"] == "true"
    assert params["batch_scheduler_policy"] == "max_utilization"
    assert params["exclude_input_in_output"] == "true"
    assert params["max_beam_width"] == "1"
    assert params["cancellation_check_period_ms"] == "100"
    assert params["max_tokens_in_paged_kv_cache"] == "4096"
    # Unset optional parameters are left out rather than rendered empty (the backend would reject "").
    assert "max_attention_window_size" not in params and "gpu_device_ids" not in params
    assert not any(v == "" for v in params.values())
    # The C++ backend needs only an empty version directory.
    assert list((out / "tensorrt_llm" / "1").iterdir()) == []
    assert (out / "preprocessing" / "1" / "model.py").is_file()


def test_cpu_backend_runs_the_python_reference_engine(tmp_path: Path) -> None:
    out = render_repository(
        tmp_path / "repo",
        backend="cpu",
        variant="current",
        variables=_variables("cpu", engine_mode="synthetic", synthetic_step_ms=5, max_active_requests=2000),
    )
    engine = load_model_configs(out)["tensorrt_llm"]
    params = _parameters(engine)

    assert engine.backend == "python"
    assert engine.model_transaction_policy.decoupled is True
    assert params["model_dir"] == "/models/tokenizer"  # defaults to tokenizer_dir
    assert params["engine_mode"] == "synthetic"
    assert params["synthetic_step_ms"] == "5"
    assert params["max_active_requests"] == "2000"
    assert "gpt_model_path" not in params
    assert {p.name for p in (out / "tensorrt_llm" / "1").iterdir()} == {"model.py", "engine.py"}
    assert {p.name for p in (out / "postprocessing" / "1").iterdir()} == {"model.py", "token_bytes.py"}


def test_the_reference_engine_runs_on_the_cpu_unless_a_device_is_set(tmp_path: Path) -> None:
    default = _parameters(
        load_model_configs(
            render_repository(tmp_path / "cpu", backend="cpu", variant="current", variables=_variables("cpu"))
        )["tensorrt_llm"]
    )
    cuda = _parameters(
        load_model_configs(
            render_repository(
                tmp_path / "cuda",
                backend="cpu",
                variant="legacy",
                variables=_variables("cpu", engine_device="cuda", engine_dtype="bfloat16"),
            )
        )["tensorrt_llm"]
    )

    assert (default["engine_device"], default["engine_dtype"]) == ("cpu", "auto")
    assert (cuda["engine_device"], cuda["engine_dtype"]) == ("cuda", "bfloat16")


@pytest.mark.parametrize(
    ("backend", "variables", "variable"),
    [
        ("cpu", {"tokenizer_dir": "/t", "max_batch_sise": 8}, "max_batch_sise"),
        ("cpu", {"tokenizer_dir": "/t", "engine_device": "gpu"}, "engine_device"),
        ("cpu", {"tokenizer_dir": "/t", "engine_dtype": "int4"}, "engine_dtype"),
        (
            "tensorrtllm",
            {"tokenizer_dir": "/t", "engine_dir": "/e", "engine_device": "cuda"},
            "engine_device",
        ),
        ("cpu", {"tokenizer_dir": "/t", "engine_dir": "/e"}, "engine_dir"),
        ("tensorrtllm", {"tokenizer_dir": "/t", "engine_dir": "/e", "engine_mode": "model"}, "engine_mode"),
        ("cpu", {}, "tokenizer_dir"),
        ("tensorrtllm", {"tokenizer_dir": "/t"}, "engine_dir"),
        ("cpu", {"tokenizer_dir": "/t", "max_batch_size": "abc"}, "max_batch_size"),
        ("cpu", {"tokenizer_dir": "/t", "max_batch_size": 0}, "max_batch_size"),
        ("cpu", {"tokenizer_dir": "/t", "decoupled": "maybe"}, "decoupled"),
        ("cpu", {"tokenizer_dir": "/t", "engine_mode": "gpu"}, "engine_mode"),
        ("cpu", {"tokenizer_dir": 'has"quote'}, "tokenizer_dir"),
        ("cpu", {"tokenizer_dir": "/t/${oops}"}, "tokenizer_dir"),
        ("cpu", {"tokenizer_dir": "/t", "name_prefix": "bad prefix"}, "name_prefix"),
        (
            "tensorrtllm",
            {"tokenizer_dir": "/t", "engine_dir": "/e", "kv_cache_free_gpu_mem_fraction": 1.5},
            "kv_cache_free_gpu_mem_fraction",
        ),
        (
            "tensorrtllm",
            {"tokenizer_dir": "/t", "engine_dir": "/e", "max_attention_window_size": "4096,x"},
            "max_attention_window_size",
        ),
    ],
)
def test_bad_variables_fail_with_a_message_naming_them_and_write_nothing(
    tmp_path: Path, backend: str, variables: dict[str, object], variable: str
) -> None:
    with pytest.raises(TemplateVariableError, match=variable) as info:
        render_repository(tmp_path / "repo", backend=backend, variant="current", variables=variables)

    assert info.value.variable == variable
    assert list(tmp_path.iterdir()) == []


def _copy_templates(tmp_path: Path) -> Path:
    templates = tmp_path / "templates"
    shutil.copytree(model_repo.TEMPLATES_DIR, templates, ignore=shutil.ignore_patterns("__pycache__"))
    return templates


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_unknown_placeholder_in_a_template_is_an_error_naming_it_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    templates = _copy_templates(tmp_path)
    _edit(templates / "postprocessing" / "config.pbtxt", "${tokenizer_dir}", "${tokenizer_path}")
    out = tmp_path / "out" / "repo"

    with pytest.raises(TemplateVariableError, match="tokenizer_path") as info:
        render_repository(
            out, backend="cpu", variant="current", variables=_variables("cpu"), templates_dir=templates
        )

    assert info.value.variable == "tokenizer_path"
    assert not out.exists()
    assert list(out.parent.iterdir()) == []  # no staging directory left behind


def test_ensemble_wiring_errors_name_the_file_and_the_tensor(tmp_path: Path) -> None:
    templates = _copy_templates(tmp_path)
    _edit(
        templates / "ensemble" / "config.pbtxt",
        'value: "_STOP_WORDS_IDS" }\n      input_map',
        'value: "_STOP_IDS" }\n      input_map',
    )
    out = tmp_path / "out" / "repo"

    with pytest.raises(ModelConfigValidationError, match="_STOP_IDS") as info:
        render_repository(
            out, backend="cpu", variant="current", variables=_variables("cpu"), templates_dir=templates
        )

    assert info.value.file == "ensemble/config.pbtxt"
    assert not out.exists()
    assert list(out.parent.iterdir()) == []


def test_dtype_mismatch_between_steps_is_reported(tmp_path: Path) -> None:
    templates = _copy_templates(tmp_path)
    postprocessing = templates / "postprocessing" / "config.pbtxt"
    _edit(
        postprocessing,
        'name: "SEQUENCE_LENGTH"\n    data_type: TYPE_INT32',
        'name: "SEQUENCE_LENGTH"\n    data_type: TYPE_INT64',
    )

    with pytest.raises(ModelConfigValidationError, match=r"SEQUENCE_LENGTH.*TYPE_INT64"):
        render_repository(
            tmp_path / "repo",
            backend="cpu",
            variant="current",
            variables=_variables("cpu"),
            templates_dir=templates,
        )


def test_unparsable_config_names_the_file(tmp_path: Path) -> None:
    templates = _copy_templates(tmp_path)
    _edit(templates / "preprocessing" / "config.pbtxt", "max_batch_size:", "max_batch_sizes:")

    with pytest.raises(ModelConfigValidationError, match=r"preprocessing/config\.pbtxt.*ModelConfig"):
        render_repository(
            tmp_path / "repo",
            backend="cpu",
            variant="current",
            variables=_variables("cpu"),
            templates_dir=templates,
        )


def test_existing_repository_is_kept_unless_overwrite_and_replaced_whole_with_it(tmp_path: Path) -> None:
    out = tmp_path / "repo"
    out.mkdir()
    (out / "keep.txt").write_text("mine")

    with pytest.raises(ModelRepoError, match="not empty"):
        render_repository(out, backend="cpu", variant="current", variables=_variables("cpu"))
    assert [p.name for p in out.iterdir()] == ["keep.txt"]

    render_repository(out, backend="cpu", variant="current", variables=_variables("cpu"), overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(model_repo.MODELS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a\n# @if decoupled\nb\n# @endif\nc\n", "a\nb\nc\n"),
        ("# @if not decoupled\nb\n# @else\nx\n# @endif\n", "x\n"),
        ("# @if variant == legacy\nL\n# @else\nC\n# @endif\n", "C\n"),
        ('# @if name_prefix != ""\nP\n# @endif\nend\n', "end\n"),
        (
            "# @if variant == legacy\n# @if decoupled\nno\n# @endif\n"
            "# @else\nyes ${max_batch_size}\n# @endif\n",
            "yes 64\n",
        ),
    ],
)
def test_directives_select_lines(text: str, expected: str) -> None:
    values = model_repo.resolve_variables("cpu", "current", {"tokenizer_dir": "/t"})
    assert render_text(text, values) == expected


@pytest.mark.parametrize(
    "text",
    [
        "# @if decoupled\nunclosed\n",
        "# @endif\n",
        "# @if decoupled\n# @else\n# @else\n# @endif\n",
        "# @if max_batch_size\n# @endif\n",
        "# @if no_such_variable\n# @endif\n",
        "# @unless decoupled\n",
        "value: ${max_batch_size\n",
    ],
)
def test_malformed_templates_are_rejected(text: str) -> None:
    values = model_repo.resolve_variables("cpu", "current", {"tokenizer_dir": "/t"})
    with pytest.raises(TemplateSyntaxError):
        render_text(text, values, source="t.pbtxt")


def test_cli_renders_and_reports_bad_variables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "repo"
    code = model_repo.main(
        ["render", "--backend", "cpu", "--variant", "legacy", "--out", str(out), "--set", "tokenizer_dir=/t"]
    )
    assert code == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert (out / "ensemble" / "config.pbtxt").is_file()

    code = model_repo.main(
        [
            "render",
            "--backend",
            "cpu",
            "--out",
            str(tmp_path / "other"),
            "--set",
            "tokenizer_dir=/t",
            "--set",
            "decoupled=perhaps",
        ]
    )
    assert code == 2
    assert "'decoupled'" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_variables_listing_and_readme_cover_every_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert model_repo.main(["variables"]) == 0
    listing = capsys.readouterr().out
    readme = (model_repo.TEMPLATES_DIR / "README.md").read_text()
    for variable in model_repo.VARIABLES:
        assert f"{variable.name} = " in listing
        assert f"`{variable.name}`" in readme, (
            f"{variable.name} is not documented in model_repo_templates/README.md"
        )


def _weights(path: Path, names: list[str]) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir()
    save_file({name: np.zeros((2, 2), dtype=np.float32) for name in names}, str(path / "model.safetensors"))
    return path


def test_the_default_lora_modules_are_those_every_decoder_layer_has(tmp_path: Path) -> None:
    llama = [f"model.layers.{i}.{m}.weight" for i in (0, 1) for m in ("self_attn.q_proj", "mlp.gate_proj")]
    # A later layer of experts (DeepSeek V3) has no gate_proj: that module cannot be hooked.
    experts = [*llama[:2], "model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.gate.weight"]
    wanted = "attn_q,attn_k,mlp_h_to_4h"
    assert model_repo.lora_modules_of(_weights(tmp_path / "llama", llama), wanted) == "attn_q,mlp_h_to_4h"
    assert model_repo.lora_modules_of(_weights(tmp_path / "moe", experts), wanted) == "attn_q"
    # No weights (a tokenizer directory, the synthetic engine): as asked.
    (tmp_path / "none").mkdir()
    assert model_repo.lora_modules_of(tmp_path / "none", wanted) == wanted
    # Said explicitly, the variable is rendered as given.
    out = render_repository(
        tmp_path / "repo",
        backend="cpu",
        variant="current",
        variables={"tokenizer_dir": tmp_path / "moe", "lora_target_modules": "attn_k"},
        models=("tensorrt_llm",),
    )
    assert 'string_value: "attn_k"' in (out / "tensorrt_llm" / "config.pbtxt").read_text()
    out = render_repository(
        tmp_path / "auto",
        backend="cpu",
        variant="current",
        variables={"tokenizer_dir": tmp_path / "moe"},
        models=("tensorrt_llm",),
    )
    assert (
        'key: "lora_target_modules"\n  value: { string_value: "attn_q" }'
        in (out / "tensorrt_llm" / "config.pbtxt").read_text()
    )
