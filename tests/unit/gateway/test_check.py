"""`gateway check` and the start-up table report a model's capabilities from `Contract.capabilities`,
the same value the adapter serves as its `info`; one factory builds a model's adapter."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from gateway.check import report, table
from gateway.config import ServedModel
from gateway.routing.registry import make_policy
from gateway.triton.engine import TritonAdapter
from gateway.triton.llmapi_engine import LlmapiAdapter
from gateway.triton.models import adapter_for
from gateway.triton.pool import TritonPool
from tests.support.tokenizers import loaded_tokenizer
from tests.unit.gateway.triton.test_translation import CURRENT, LEGACY, contract_of


def test_the_report_shows_the_capabilities_the_contract_gives(tiny_bpe_dir: Path) -> None:
    model = ServedModel(name="tiny", tokenizer=tiny_bpe_dir)
    tokenizer = loaded_tokenizer(tiny_bpe_dir)
    current = contract_of(CURRENT).with_decoupled(True).capabilities()
    row = report(model, current, None, tokenizer)
    assert (row.status, row.variant, row.decoupled, row.token_ids, row.n) == (
        "ready",
        "current",
        "yes",
        "yes",
        "num_return_sequences",
    )
    assert (row.guided, row.logprobs) == ("no", "no")
    legacy = report(model, contract_of(LEGACY).capabilities(), None, tokenizer)
    assert (legacy.variant, legacy.decoupled, legacy.token_ids, legacy.n) == ("legacy", "no", "no", "fan-out")
    down = report(model, None, "no route to host", tokenizer)
    assert down.status == "unavailable: no route to host" and down.variant == "-"


async def test_one_factory_builds_each_models_adapter_on_its_route(tiny_bpe_dir: Path) -> None:
    pool = TritonPool(["127.0.0.1:1"], timeout_s=0.1)
    try:
        auto = adapter_for(pool, ServedModel(name="a", tokenizer=tiny_bpe_dir, triton_model="ens"))
        ensemble = adapter_for(pool, ServedModel(name="b", tokenizer=tiny_bpe_dir, route="ensemble"))
        engine = adapter_for(
            pool, ServedModel(name="c", tokenizer=tiny_bpe_dir, route="engine", engine_model="trt")
        )
        # The contract is detected from the model config; the C++ one's route is then chosen
        # when the ensemble's config is read (auto), unless forced.
        cpp = [m.adapter_for("tensorrt_llm") for m in (auto, ensemble, engine)]
        assert all(isinstance(a, TritonAdapter) for a in cpp)
        assert (cpp[0]._model, cpp[0]._requested_route, cpp[0]._engine_model) == ("ens", "auto", None)
        assert (cpp[1]._model, cpp[1]._requested_route) == ("ensemble", "ensemble")
        assert (cpp[2]._model, cpp[2]._requested_route) == ("trt", "engine")
        assert isinstance(auto.adapter_for("llmapi"), LlmapiAdapter)
    finally:
        await pool.close()


def test_the_adapters_info_is_the_contracts_capabilities() -> None:
    contract = contract_of(CURRENT)
    pool = SimpleNamespace(policy=make_policy("least_outstanding"))
    adapter = TritonAdapter(pool, "ensemble")  # type: ignore[arg-type]
    adapter._contract = contract
    assert adapter.info == contract.capabilities()
    assert adapter.info is adapter.info  # made once per contract learned


def test_prefix_routing_makes_the_core_tokenize_before_sending() -> None:
    contract = contract_of(CURRENT)
    assert not contract.capabilities().needs_prompt_ids
    adapter = TritonAdapter(SimpleNamespace(policy=make_policy("prefix")), "ensemble")  # type: ignore[arg-type]
    adapter._contract = contract
    assert adapter.info.needs_prompt_ids


def test_a_gpt_oss_model_on_a_route_that_returns_text_is_not_servable(tiny_bpe_dir: Path) -> None:
    import dataclasses

    tokenizer = loaded_tokenizer(tiny_bpe_dir)
    ids = contract_of(CURRENT).with_decoupled(True).capabilities()
    text_only = dataclasses.replace(ids, exposes_token_ids=False, route="ensemble")
    gpt_oss = ServedModel(name="g", tokenizer=tiny_bpe_dir, reasoning_parser="gpt_oss")
    assert report(gpt_oss, ids, None, tokenizer).status == "ready"
    row = report(gpt_oss, text_only, None, tokenizer)
    assert row.status.startswith("not servable: reasoning_parser gpt_oss needs token ids")
    assert "route=engine" in row.status
    # The think formats' markers survive a text route: those models are served there.
    qwen3 = ServedModel(name="q", tokenizer=tiny_bpe_dir, reasoning_parser="qwen3")
    assert report(qwen3, text_only, None, tokenizer).status == "ready"


def test_the_table_fits_the_terminal_and_stays_one_table_where_there_is_none(tiny_bpe_dir: Path) -> None:
    model = ServedModel(name="tiny", tokenizer=tiny_bpe_dir)
    tokenizer = loaded_tokenizer(tiny_bpe_dir)
    ready = report(model, contract_of(CURRENT).with_decoupled(True).capabilities(), None, tokenizer)
    down = report(
        ServedModel(name="other", tokenizer=tiny_bpe_dir),
        None,
        "Triton at 127.0.0.1:8001 is unreachable (connection refused): is tritonserver running?",
        tokenizer,
    )
    wide = table([ready, down])
    assert max(map(len, wide.splitlines())) > 150  # one row per model, as a pipe reads it
    assert len([line for line in wide.splitlines() if line.count("│") > 5]) == 2
    for width in (80, 60):
        narrow = table([ready, down], width)
        lines = narrow.splitlines()
        tables = [line for line in lines if "│" in line or "┃" in line or "─" in line]
        assert tables and max(map(len, tables)) <= width, narrow
        # Every capability and value is there, on its own row.
        text = " ".join(narrow.replace("│", " ").split())
        for row in (ready, down):
            assert f"served model {row.name}" in text
            for value in (row.status, row.route, row.streamed_text, row.tokenizer):
                assert " ".join(value.split()) in text or value in narrow.replace("\n", ""), value
        assert any(line.startswith("tiny: ") and "route:" in line for line in lines)
    # A table that fits stays the one wide table.
    assert table([ready], 1000) == table([ready])


def test_the_report_names_the_parsers_a_models_files_fit_and_warns_of_a_missing_tool_parser(
    tiny_bpe_dir: Path, tiny_metaspace_dir: Path
) -> None:
    import dataclasses

    from deploy.families import build_family_model
    from gateway.check import table

    ids = contract_of(CURRENT).with_decoupled(True).capabilities()
    engine_route = dataclasses.replace(ids, route="engine")
    qwen3_dir = build_family_model("qwen3")
    qwen3 = loaded_tokenizer(qwen3_dir)
    bare = report(ServedModel(name="q", tokenizer=qwen3_dir), engine_route, None, qwen3)
    assert bare.notes == (
        "its chat template and special tokens fit tool_parser=hermes (not set)",
        "its chat template and special tokens fit reasoning_parser=qwen3 (not set)",
    )
    (missing,) = bare.warnings
    assert "renders tools but no tool_parser is set" in missing and "tool_parser=hermes" in missing
    assert "q: warning: its chat template renders tools" in table([bare])
    configured = ServedModel(name="q", tokenizer=qwen3_dir, tool_parser="hermes", reasoning_parser="qwen3")
    fitting = report(configured, engine_route, None, qwen3)
    assert (fitting.notes, fitting.warnings) == ((), ())
    other = report(configured.model_copy(update={"tool_parser": "mistral"}), engine_route, None, qwen3)
    assert other.warnings == ("tool_parser=mistral is set; its chat template and special tokens fit hermes",)
    # Mistral-Nemo's files: the [TOOL_CALLS] control token and a template that renders tools.
    mistral_dir = build_family_model("mistral")
    mistral = report(
        ServedModel(name="m", tokenizer=mistral_dir), engine_route, None, loaded_tokenizer(mistral_dir)
    )
    assert mistral.notes == ("its chat template and special tokens fit tool_parser=mistral (not set)",)
    (missing,) = mistral.warnings
    assert "renders tools but no tool_parser is set" in missing and "tool_parser=mistral" in missing
    # A tokenizer that adds BOS and a template that does not write it: the text route cannot send
    # the template's own prompt.
    sp = loaded_tokenizer(tiny_metaspace_dir)
    sp_model = ServedModel(name="sp", tokenizer=tiny_metaspace_dir, tool_parser="hermes")
    on_text = report(sp_model, dataclasses.replace(ids, route="ensemble"), None, sp)
    assert any("adds '<|bos|>'" in w and "route=engine" in w for w in on_text.warnings)
    assert not report(sp_model, engine_route, None, sp).warnings
