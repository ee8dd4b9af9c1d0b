"""The tiny local model (deterministic, cached, loadable offline) and postprocessing's token surface bytes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from deploy import model_repo, tiny_model


def _load_token_bytes() -> ModuleType:
    path = model_repo.TEMPLATES_DIR / "postprocessing" / "1" / "token_bytes.py"
    spec = importlib.util.spec_from_file_location("postprocessing_token_bytes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


token_bytes = _load_token_bytes()

TEXTS = [
    "Hello world! How are you today?",
    "你好，世界！今天天气很好。",
    "Emoji 🙂🚀 and a family 👨‍👩‍👧‍👦 and a flag 🇫🇷.",
    "Mixed: café, naïve, Ångström, 日本語, 한국어 🎉\n\ttabs and  double  spaces ",
    '<tool_call>{"name": "f"}</tool_call> after',
]


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def directories(tiny_bpe_dir: Path, tiny_metaspace_dir: Path, tiny_agent_dir: Path) -> dict[str, Path]:
    return {"bpe": tiny_bpe_dir, "metaspace": tiny_metaspace_dir, "agent": tiny_agent_dir}


@pytest.fixture(scope="module")
def tokenizers(directories: dict[str, Path]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    return {kind: AutoTokenizer.from_pretrained(directory) for kind, directory in directories.items()}


def test_build_is_deterministic_and_cached(tmp_path: Path, tiny_bpe_dir: Path) -> None:
    built = tiny_model.build_tiny_model("bpe", cache_root=tmp_path)

    assert built.parent == tmp_path and built.name == tiny_bpe_dir.name
    assert _digest(built) == _digest(tiny_bpe_dir)
    assert tiny_model.build_tiny_model("bpe", cache_root=tmp_path) == built
    assert [p.name for p in tmp_path.iterdir()] == [built.name]  # no temporary directory left


def test_cache_root_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GATEWAY_CACHE_DIR", str(tmp_path / "cache"))
    assert tiny_model.default_cache_root() == tmp_path / "cache"
    monkeypatch.delenv("GATEWAY_CACHE_DIR")
    assert tiny_model.default_cache_root() == Path.home() / ".cache" / "trtllm-gateway"


def test_unknown_kind_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="wordpiece"):
        tiny_model.build_tiny_model("wordpiece", cache_root=tmp_path)


@pytest.mark.parametrize("kind", tiny_model.KINDS)
def test_model_and_tokenizer_load_offline_with_chat_template_and_extra_eos(
    kind: str, directories: dict[str, Path], tokenizers: dict[str, Any]
) -> None:
    from transformers import AutoModelForCausalLM

    directory = directories[kind]
    tokenizer = tokenizers[kind]
    model = AutoModelForCausalLM.from_pretrained(directory)
    generation = json.loads((directory / "generation_config.json").read_text())
    config = json.loads((directory / "tokenizer_config.json").read_text())

    eot = tokenizer.convert_tokens_to_ids(tiny_model.EOT_TOKEN)
    assert generation["eos_token_id"] == [tokenizer.eos_token_id, eot]
    assert model.config.vocab_size == len(tokenizer)
    assert "chat_template" in config
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}],
        },
        {"role": "tool", "content": "42"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|eot|>\n<|im_start|>user\nHi<|eot|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call><|eot|>\n'
        "<|im_start|>tool\n42<|eot|>\n<|im_start|>assistant\n"
    )
    with_tools = tokenizer.apply_chat_template(
        messages[1:2], tools=[{"type": "function", "function": {"name": "f"}}], tokenize=False
    )
    assert with_tools.startswith("<|im_start|>system\n# Tools\n") and '"name": "f"' in with_tools


@pytest.mark.parametrize("kind", tiny_model.KINDS)
def test_corpus_has_tokens_that_are_partial_utf8_characters(kind: str, tokenizers: dict[str, Any]) -> None:
    tokenizer = tokenizers[kind]
    surface = token_bytes.TokenBytes(tokenizer)
    partial = 0
    for token_id in tokenizer.encode(tiny_model.CORPUS, add_special_tokens=False):
        try:
            surface(token_id).decode("utf-8")
        except UnicodeDecodeError:
            partial += 1
    assert partial > 0


@pytest.mark.parametrize("kind", tiny_model.KINDS)
@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_concatenate_to_the_decoded_text(
    kind: str, text: str, tokenizers: dict[str, Any]
) -> None:
    tokenizer = tokenizers[kind]
    surface = token_bytes.TokenBytes(tokenizer)
    ids = tokenizer.encode(text)

    joined = b"".join(surface(t) for t in ids).decode("utf-8")
    decoded = tokenizer.decode(ids, skip_special_tokens=True)

    byte_level = tiny_model.RECIPES[kind].family == "bpe"
    assert surface.kind == (token_bytes.BYTE_LEVEL if byte_level else token_bytes.METASPACE)
    first = tokenizer.convert_ids_to_tokens(next(t for t in ids if t not in tokenizer.all_special_ids))
    if kind == "metaspace" and first.startswith("▁"):
        # SentencePiece decoding drops the first word's space at the start of a text; a continuation keeps it.
        decoded = " " + decoded
    assert joined == decoded


@pytest.mark.parametrize("kind", tiny_model.KINDS)
def test_streamed_continuation_bytes_equal_the_continuation_text(
    kind: str, tokenizers: dict[str, Any]
) -> None:
    tokenizer = tokenizers[kind]
    surface = token_bytes.TokenBytes(tokenizer)
    prompt = tokenizer.encode("Hello")
    completion = tokenizer.encode(" world, 你好 🙂!", add_special_tokens=False)

    streamed = b"".join(surface(t) for t in completion)
    whole = tokenizer.decode(prompt + completion, skip_special_tokens=True)
    start = tokenizer.decode(prompt, skip_special_tokens=True)

    assert whole.startswith(start)
    assert streamed.decode("utf-8") == whole[len(start) :]


@pytest.mark.parametrize("kind", tiny_model.KINDS)
def test_special_tokens_are_skipped_unless_asked_for(kind: str, tokenizers: dict[str, Any]) -> None:
    tokenizer = tokenizers[kind]
    eot = tokenizer.convert_tokens_to_ids(tiny_model.EOT_TOKEN)

    assert token_bytes.token_surface_bytes(tokenizer, eot) == b""
    assert token_bytes.token_surface_bytes(tokenizer, eot, skip_special_tokens=False) == b"<|eot|>"
    call = tokenizer.convert_tokens_to_ids("<tool_call>")
    assert token_bytes.token_surface_bytes(tokenizer, call) == b"<tool_call>"


def test_byte_fallback_and_metaspace_marks_map_to_bytes(tokenizers: dict[str, Any]) -> None:
    tokenizer = tokenizers["metaspace"]
    surface = token_bytes.TokenBytes(tokenizer)

    assert surface(tokenizer.convert_tokens_to_ids("<0xF0>")) == b"\xf0"
    assert surface(tokenizer.convert_tokens_to_ids("<0x0A>")) == b"\n"
    word = next(t for t in tokenizer.get_vocab() if t.startswith("▁") and len(t) > 2 and t[1:].isascii())
    assert surface(tokenizer.convert_tokens_to_ids(word)) == b" " + word[1:].encode()


def test_other_decoders_fall_back_to_anchored_decoding() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[SEP]": 1, "a": 2, "hello": 3, "##lo": 4, "hel": 5, "world": 6}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", sep_token="[SEP]")
    surface = token_bytes.TokenBytes(tokenizer)

    assert surface.kind == token_bytes.ANCHORED
    assert surface(6) == b" world"
    assert surface(4) == b"lo"  # a "##" continuation joins the previous word
    assert surface(1) == b""


# ---------------------------------------------------------------- the agent kind (what `make run` serves)

# Not in the training corpus: what the vocabulary does with text it has not seen.
HELD_OUT = """\
Our team maintains a small service that converts uploaded spreadsheets into reports. Last week a
customer noticed that totals were wrong whenever a sheet contained merged cells, and asked whether we
could fix it before the end of the month. You will investigate the problem, propose a change, and
verify it with the existing test suite before opening a pull request for review.

Please keep the following in mind while you work. The converter is written in Python and uses a
streaming reader, so memory stays flat even for very large files. Do not load an entire workbook at
once. Each report row is produced by a pure function that receives the parsed cells and returns a
dictionary; these functions are easy to test in isolation, and new behaviour should come with new
tests. Logging goes through the standard library; never print to standard output from library code.

When you describe your findings, start with a one-sentence summary, then list the evidence: the input
that triggers the bug, the expected and actual totals, and the line of code responsible. If you are not
certain about the cause, say what you checked and what remains open. Avoid speculative refactoring:
the goal is a minimal, well-tested fix that a reviewer can understand in a few minutes.
"""
HELD_OUT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Absolute path of the file or directory."},
                    "pattern": {"type": "string", "description": "A regular expression to search for."},
                    "max_results": {"type": "integer", "minimum": 1, "default": 50},
                },
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    }
    for name, description in [
        ("list_directory", "Lists the entries of a directory, with their sizes and modification times."),
        ("search_files", "Searches the contents of files below a directory for a regular expression."),
        ("open_spreadsheet", "Opens a spreadsheet and returns the names and dimensions of its sheets."),
        (
            "run_tests",
            "Runs the project's test suite, or the tests matching a pattern, and reports failures.",
        ),
    ]
]


def _agent_prompt(tokenizer: Any, size: int = 21_000) -> str:
    instructions = HELD_OUT * (size // len(HELD_OUT))
    messages = [{"role": "system", "content": instructions}, {"role": "user", "content": "Fix the totals."}]
    prompt = tokenizer.apply_chat_template(
        messages, tools=HELD_OUT_TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert isinstance(prompt, str)
    return prompt


def test_agent_model_has_a_long_context(tiny_agent_dir: Path, tokenizers: dict[str, Any]) -> None:
    from gateway.text.tokenizer import Tokenizer

    config = json.loads((tiny_agent_dir / "config.json").read_text())
    assert config["max_position_embeddings"] >= 32768
    assert tokenizers["agent"].model_max_length == config["max_position_embeddings"]
    assert Tokenizer(tiny_agent_dir).info.max_model_len == config["max_position_embeddings"]


def test_agent_model_computes_logits_at_far_positions(tiny_agent_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_agent_dir)
    far = model.config.max_position_embeddings - 8
    with torch.inference_mode():
        near = model(input_ids=torch.tensor([[5, 6, 7]])).logits
        shifted = model(
            input_ids=torch.tensor([[5, 6, 7]]), position_ids=torch.tensor([[far, far + 1, far + 2]])
        )
    assert torch.isfinite(shifted.logits).all()
    # Rotary attention depends on relative positions only: a shift changes nothing but rounding.
    assert torch.allclose(near, shifted.logits, atol=1e-3)


def test_agent_tokenizer_takes_an_agent_sized_prompt_in_well_under_a_token_per_byte(
    tokenizers: dict[str, Any],
) -> None:
    tokenizer = tokenizers["agent"]
    prompt = _agent_prompt(tokenizer)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    size = len(prompt.encode())

    assert size >= 21_000
    assert len(ids) / size < 0.5, f"{len(ids)} tokens for {size} bytes"
    assert len(ids) < tokenizer.model_max_length // 4
    assert tokenizer.decode(ids, skip_special_tokens=False) == prompt


def test_agent_tokenizer_has_think_tokens_that_survive_skipping_special_tokens(
    tokenizers: dict[str, Any],
) -> None:
    tokenizer = tokenizers["agent"]
    start, end = (tokenizer.convert_tokens_to_ids(t) for t in tiny_model.THINK_TOKENS)
    answer = tokenizer.encode("<think>\nweigh it\n</think>\n\nYes.", add_special_tokens=False)

    assert answer[0] == start and end in answer
    assert {start, end}.isdisjoint(tokenizer.all_special_ids)
    assert tokenizer.decode(answer, skip_special_tokens=True) == "<think>\nweigh it\n</think>\n\nYes."
    assert token_bytes.token_surface_bytes(tokenizer, end) == b"</think>"


@pytest.mark.parametrize(
    ("kwargs", "ending", "state"),
    [
        ({}, "<|im_start|>assistant\n", None),
        ({"enable_thinking": True}, "<|im_start|>assistant\n<think>\n", True),
        ({"enable_thinking": False}, "<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
    ],
)
def test_agent_template_opens_or_closes_the_think_block_on_request(
    kwargs: dict[str, Any], ending: str, state: bool | None, tokenizers: dict[str, Any]
) -> None:
    from gateway.text.reasoning.think import prompt_state

    messages = [{"role": "user", "content": "Hi"}]
    prompt = tokenizers["agent"].apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )
    assert prompt == "<|im_start|>user\nHi<|eot|>\n" + ending
    # What the qwen3 reasoning parser reads from it: where the reply starts.
    assert prompt_state(prompt) is state


def test_agent_template_renders_reasoning_effort_and_the_current_turns_reasoning(
    tokenizers: dict[str, Any],
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Old question"},
        {"role": "assistant", "content": "Old answer", "reasoning_content": "old thoughts"},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should call the tool.",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny"},
    ]
    prompt = tokenizers["agent"].apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, reasoning_effort="high"
    )
    assert prompt == (
        "<|im_start|>system\nBe brief.\n\nReasoning: high<|eot|>\n"
        "<|im_start|>user\nOld question<|eot|>\n"
        # Reasoning of turns before the last user message is dropped, as Qwen3's template does.
        "<|im_start|>assistant\nOld answer<|eot|>\n"
        "<|im_start|>user\nWeather?<|eot|>\n"
        "<|im_start|>assistant\n<think>\nI should call the tool.\n</think>\n\n"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|eot|>\n'
        "<|im_start|>tool\nsunny<|eot|>\n<|im_start|>assistant\n"
    )


def test_parameter_count_reads_the_safetensors_headers(tiny_bpe_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_bpe_dir)
    assert tiny_model.parameter_count(tiny_bpe_dir) == sum(p.numel() for p in model.parameters())


def test_the_gpu_preset_is_a_few_hundred_million_parameters_in_bfloat16_and_not_built_by_tests() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    recipe = tiny_model.RECIPES["gpu"]
    assert "gpu" in tiny_model.ALL_KINDS and "gpu" not in tiny_model.KINDS
    assert recipe.dtype == "bfloat16" and recipe.vocab_size == tiny_model.RECIPES["agent"].vocab_size
    assert recipe.chat_template == tiny_model.AGENT_CHAT_TEMPLATE
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=recipe.vocab_size, **recipe.model))
    count = sum(p.numel() for p in model.parameters())
    assert 200e6 < count < 600e6
