"""The native engine's build (gcc, only libc, the Triton symbols it uses exist in the wheel's server)
and its rendering as the `tensorrt_llm` model (only what it serves, as the gateway reads it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from deploy import native_engine
from deploy.devstack import find_triton
from deploy.model_repo import ModelRepoError, TemplateVariableError, load_model_configs, render_repository
from deploy.tiny_model import build_tiny_model
from gateway.triton import contract as c

ENTRY_POINTS = {
    "TRITONBACKEND_Initialize",
    "TRITONBACKEND_ModelInitialize",
    "TRITONBACKEND_ModelFinalize",
    "TRITONBACKEND_ModelInstanceInitialize",
    "TRITONBACKEND_ModelInstanceFinalize",
    "TRITONBACKEND_ModelInstanceExecute",
}


@pytest.mark.parametrize(
    ("ids", "text"),
    [([], ""), ([7], "7"), ([3, 4, 5, 9], "3-5,9"), ([1, 3, 5], "1,3,5"), ([0, 1, 2, 10, 11], "0-2,10-11")],
)
def test_token_ids_are_written_as_ranges(ids: list[int], text: str) -> None:
    assert native_engine.ranges(ids) == text


def _symbols(library: Path, *flags: str) -> list[str]:
    out = subprocess.run(
        ["nm", "-D", *flags, str(library)], capture_output=True, text=True, check=True
    ).stdout
    return out.splitlines()


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return native_engine.build(tmp_path_factory.mktemp("native"), force=True)


def test_the_backend_needs_only_libc_and_exports_the_backend_entry_points(library: Path) -> None:
    dynamic = subprocess.run(
        ["readelf", "-d", str(library)], capture_output=True, text=True, check=True
    ).stdout
    assert re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", dynamic) == ["libc.so.6"]
    exported = {line.split()[-1] for line in _symbols(library, "--defined-only") if " T " in line}
    assert exported == ENTRY_POINTS
    versions = {
        tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_([\d.]+)", "\n".join(_symbols(library)))
    }
    assert max(versions) <= (2, 36)  # runs on this machine's glibc and every newer one


def test_every_triton_function_it_calls_exists_in_the_wheels_tritonserver(library: Path) -> None:
    used = {line.split()[-1] for line in _symbols(library, "--undefined-only") if "TRITON" in line}
    assert {"TRITONBACKEND_ResponseFactoryIsCancelled", "TRITONBACKEND_ResponseSend"} <= used
    server = next(find_triton().libs_dir.glob("libtritonserver*.so"))
    defined = {line.split()[-1] for line in _symbols(server, "--defined-only")}
    assert used - defined == set()


def test_the_native_backend_renders_the_engine_model_with_only_what_it_serves(tmp_path: Path) -> None:
    tokenizer = build_tiny_model("bpe")
    repo = render_repository(
        tmp_path / "repo",
        backend="native",
        variant="current",
        variables={"tokenizer_dir": tokenizer, "synthetic_step_ms": 5, "engine_instance_count": 3},
    )
    configs = load_model_configs(repo)
    assert list(configs) == ["tensorrt_llm"]
    config = configs["tensorrt_llm"]
    assert config.backend == native_engine.BACKEND_NAME
    assert config.model_transaction_policy.decoupled
    assert config.instance_group[0].count == 3
    assert config.parameters["step_ms"].string_value == "5"
    assert re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", config.parameters["token_ids"].string_value)
    assert {t.name for t in config.output} == {"output_ids", "sequence_length"}
    contract = c.read_contract(config, "engine")
    assert set(contract.inputs) == {
        c.PROMPT,
        c.PROMPT_LENGTH,
        c.MAX_TOKENS,
        c.STREAM,
        c.END_ID,
        c.STOP_WORDS,
        c.BEAM_WIDTH,
        c.MIN_TOKENS,
        c.SEED,
        c.EXCLUDE_INPUT_IN_OUTPUT,
    }
    assert not contract.logprobs and not contract.guided_decoding
    legacy = render_repository(
        tmp_path / "legacy", backend="native", variant="legacy", variables={"tokenizer_dir": tokenizer}
    )
    names = {t.name for t in load_model_configs(legacy)["tensorrt_llm"].input}
    assert {"random_seed", "min_length"} <= names and not {"seed", "min_tokens"} & names


def test_the_native_backend_refuses_what_it_does_not_render(tmp_path: Path) -> None:
    tokenizer = build_tiny_model("bpe")
    with pytest.raises(TemplateVariableError, match="stock_postprocessing"):
        render_repository(
            tmp_path / "a",
            backend="native",
            variant="current",
            variables={"tokenizer_dir": tokenizer, "stock_postprocessing": True},
        )
    with pytest.raises(ModelRepoError, match="tensorrt_llm model alone"):
        render_repository(
            tmp_path / "b",
            backend="native",
            variant="current",
            variables={"tokenizer_dir": tokenizer},
            models=("ensemble",),
        )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
