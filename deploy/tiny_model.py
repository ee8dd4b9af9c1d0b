"""Build (once, deterministically, cached) a tiny tokenizer + random causal LM for the local stack.

Two tokenizer kinds cover the two detokenization families the gateway must get right:
``bpe`` (byte-level BPE, GPT-2/Llama-3/Qwen style) and ``metaspace`` (SentencePiece-style
"▁" word marks with byte fallback, Llama-2/Mistral style). Both are trained on a small built-in
corpus with English, CJK and emoji, so some tokens are partial UTF-8 characters.

The third, ``agent`` (what ``make run`` serves), takes the prompts agent clients send (tens of
thousands of tokens: Codex CLI's ~21 KB of instructions, Claude Code's ~75 KB of JSON): a
byte-level BPE trained to a larger vocabulary on a larger built-in corpus (`deploy.tiny_corpus`),
so English and JSON take well under one token per byte, a 64k-token context (long rotary
positions cost nothing at this size), the ``<think>`` / ``</think>`` tokens of a reasoning model
(added but not special, like the tool-call tokens), the harmony markers of gpt-oss (special, as
there), and a chat template that renders ``enable_thinking``, ``reasoning_effort`` and assistant
messages' ``reasoning_content``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from deploy.publish import library_versions, publish_dir
from deploy.tiny_corpus import AGENT_CORPUS

logger = logging.getLogger(__name__)

SEED: Final = 20240611

PAD_TOKEN: Final = "<|pad|>"
BOS_TOKEN: Final = "<|bos|>"
EOS_TOKEN: Final = "<|eos|>"
EOT_TOKEN: Final = "<|eot|>"
IM_START_TOKEN: Final = "<|im_start|>"
UNK_TOKEN: Final = "<unk>"
SPECIAL_TOKENS: Final = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, EOT_TOKEN, IM_START_TOKEN)
# Added but not special: they survive skip_special_tokens, like real tool-call markers do.
TOOL_CALL_TOKENS: Final = ("<tool_call>", "</tool_call>")
THINK_TOKENS: Final = ("<think>", "</think>")
# The harmony format's markers (gpt-oss), special as in its tokenizer: parser detection sees them
# beside a template of another format (the gpt_oss parser itself needs gpt-oss's own vocabulary).
HARMONY_TOKENS: Final = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
)

VOCAB_SIZE: Final = {"bpe": 640, "metaspace": 700, "agent": 4096}
# Keeps rare characters (most CJK, all emoji) out of the metaspace alphabet so they use byte fallback.
METASPACE_ALPHABET_LIMIT: Final = 90

MODEL_PARAMS: Final[dict[str, Any]] = {
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    # Larger than the usual 0.02 so logits are peaked enough that greedy ties are implausible.
    "initializer_range": 0.1,
}
# The agent model differs only in its context: rotary positions are computed, not stored, so a long
# context costs attention time on long prompts and nothing else.
AGENT_MODEL_PARAMS: Final[dict[str, Any]] = {
    **MODEL_PARAMS,
    "max_position_embeddings": 65536,
    "rope_theta": 1_000_000.0,
}

# The GPU preset: the agent model's tokenizer and context with a Llama-style body of about 380M
# parameters (8 layers of width 2048, grouped-query attention), stored in bfloat16, so the reference
# engine on a GPU produces tokens at GPU rates from real matrix work. Built on the host at run time
# (about 0.8 GB), never carried; the usual initializer range (0.02) keeps bfloat16 activations tame.
GPU_MODEL_PARAMS: Final[dict[str, Any]] = {
    **AGENT_MODEL_PARAMS,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "initializer_range": 0.02,
}

# ChatML-like, written in the explicit-string style so that template layout never leaks whitespace.
CHAT_TEMPLATE: Final = """\
{%- set ns = namespace(system=none, start=0) %}
{%- if messages and messages[0].role == 'system' %}
    {%- set ns.system = messages[0].content %}
    {%- set ns.start = 1 %}
{%- endif %}
{%- if ns.system is not none or tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if ns.system is not none %}
        {{- ns.system }}
    {%- endif %}
    {%- if tools %}
        {%- if ns.system is not none %}
            {{- '\\n\\n' }}
        {%- endif %}
        {{- '# Tools\\nTo call a function reply with ' }}
        {{- '<tool_call>{"name": <name>, "arguments": <object>}</tool_call>.' }}
        {%- for tool in tools %}
            {{- '\\n' + (tool | tojson) }}
        {%- endfor %}
    {%- endif %}
    {{- '<|eot|>\\n' }}
{%- endif %}
{%- for message in messages[ns.start:] %}
    {{- '<|im_start|>' + message.role + '\\n' }}
    {%- if message.content is string %}
        {{- message.content }}
    {%- elif message.content %}
        {%- for part in message.content %}
            {%- if part.type == 'text' %}
                {{- part.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {%- for call in message.tool_calls %}
            {%- set args = call.function.arguments %}
            {{- '<tool_call>{"name": ' + (call.function.name | tojson) + ', "arguments": ' }}
            {{- (args if args is string else args | tojson) + '}</tool_call>' }}
        {%- endfor %}
    {%- endif %}
    {{- '<|eot|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}"""

# The ChatML-like template above, plus what a reasoning model's template does (Qwen3's conventions):
# `enable_thinking` true opens the think block in the prompt, false closes an empty one, unset
# leaves it to the model; `reasoning_effort` is a line of the system turn; an assistant turn after
# the last user turn (a tool-calling loop) carries its `reasoning_content` back in a think block.
AGENT_CHAT_TEMPLATE: Final = """\
{%- set ns = namespace(system=none, start=0, last_user=-1) %}
{%- if messages and messages[0].role == 'system' %}
    {%- set ns.system = messages[0].content %}
    {%- set ns.start = 1 %}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- set ns.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- set effort = reasoning_effort if reasoning_effort is defined and reasoning_effort else none %}
{%- if ns.system is not none or tools or effort is not none %}
    {{- '<|im_start|>system\\n' }}
    {%- if ns.system is not none %}
        {{- ns.system }}
    {%- endif %}
    {%- if effort is not none %}
        {%- if ns.system is not none %}
            {{- '\\n\\n' }}
        {%- endif %}
        {{- 'Reasoning: ' + effort }}
    {%- endif %}
    {%- if tools %}
        {%- if ns.system is not none or effort is not none %}
            {{- '\\n\\n' }}
        {%- endif %}
        {{- '# Tools\\nTo call a function reply with ' }}
        {{- '<tool_call>{"name": <name>, "arguments": <object>}</tool_call>.' }}
        {%- for tool in tools %}
            {{- '\\n' + (tool | tojson) }}
        {%- endfor %}
    {%- endif %}
    {{- '<|eot|>\\n' }}
{%- endif %}
{%- for message in messages[ns.start:] %}
    {{- '<|im_start|>' + message.role + '\\n' }}
    {%- if message.role == 'assistant' and loop.index0 + ns.start > ns.last_user %}
        {%- set thought = message.reasoning_content if message.reasoning_content is string
            else message.reasoning %}
        {%- if thought is string and thought %}
            {{- '<think>\\n' + thought + '\\n</think>\\n\\n' }}
        {%- endif %}
    {%- endif %}
    {%- if message.content is string %}
        {{- message.content }}
    {%- elif message.content %}
        {%- for part in message.content %}
            {%- if part.type == 'text' %}
                {{- part.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {%- for call in message.tool_calls %}
            {%- set args = call.function.arguments %}
            {{- '<tool_call>{"name": ' + (call.function.name | tojson) + ', "arguments": ' }}
            {{- (args if args is string else args | tojson) + '}</tool_call>' }}
        {%- endfor %}
    {%- endif %}
    {{- '<|eot|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is not none %}
        {{- '<think>\\n' if enable_thinking else '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

CORPUS: Final = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Hello, world! How are you today? I am fine, thank you. What would you like to talk about?
Once upon a time there was a little model that learned to speak in many languages.
It counted tokens, streamed them one by one, and never lost a space or a byte.
The weather is nice today: sunny, 24 degrees, with a light breeze from the west.
def add(a, b):
    return a + b
for i in range(10):
    print(i * i)
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 1000 3.14159 2.71828
Café, naïve, façade, jalapeño, Ångström, Straße, crème brûlée.
你好，世界！今天天气很好。我们一起去公园散步吧。
机器学习是人工智能的一个分支。大语言模型可以生成文本。
こんにちは、世界。今日はいい天気ですね。日本語のテキストも少し入れます。
안녕하세요, 세계! 오늘 날씨가 좋네요.
Emoji time 🙂 🚀 🎉 👍🏽 ❤️ 👨‍👩‍👧‍👦 🇫🇷 — the family emoji is several code points joined.
Mixed: the model said 你好 and then 🙂, then continued in English.
Streaming text must stay exact: spaces, newlines,
tabs\tand unicode like 日本 and 🚀 must survive byte by byte.
"""


@dataclass(frozen=True, slots=True)
class Recipe:
    """What one kind is made of; all of it goes into the cache key."""

    family: str  # "bpe" (byte-level) or "metaspace" (SentencePiece-style with byte fallback)
    vocab_size: int
    corpus: str
    # Added but not special: they survive skip_special_tokens, like real tool-call and think markers.
    added_tokens: tuple[str, ...]
    # Special beyond the common ones (dropped by skip_special_tokens).
    extra_special_tokens: tuple[str, ...]
    chat_template: str
    model: Mapping[str, Any]
    # The dtype the weights are saved in (initialised in float32 either way).
    dtype: str = "float32"


RECIPES: Final[dict[str, Recipe]] = {
    "bpe": Recipe("bpe", VOCAB_SIZE["bpe"], CORPUS, TOOL_CALL_TOKENS, (), CHAT_TEMPLATE, MODEL_PARAMS),
    "metaspace": Recipe(
        "metaspace", VOCAB_SIZE["metaspace"], CORPUS, TOOL_CALL_TOKENS, (), CHAT_TEMPLATE, MODEL_PARAMS
    ),
    "agent": Recipe(
        "bpe",
        VOCAB_SIZE["agent"],
        CORPUS + AGENT_CORPUS,
        (*TOOL_CALL_TOKENS, *THINK_TOKENS),
        HARMONY_TOKENS,
        AGENT_CHAT_TEMPLATE,
        AGENT_MODEL_PARAMS,
    ),
    "gpu": Recipe(
        "bpe",
        VOCAB_SIZE["agent"],
        CORPUS + AGENT_CORPUS,
        (*TOOL_CALL_TOKENS, *THINK_TOKENS),
        HARMONY_TOKENS,
        AGENT_CHAT_TEMPLATE,
        GPU_MODEL_PARAMS,
        dtype="bfloat16",
    ),
}
# Built on demand only, never by the tests: hundreds of MB of weights, meant for a GPU host.
LARGE_KINDS: Final = ("gpu",)
# The tiny kinds (what tests and the local stack build).
KINDS: Final = tuple(k for k in RECIPES if k not in LARGE_KINDS)
ALL_KINDS: Final = tuple(RECIPES)
# What `make run` (gateway dev) and `python -m deploy.devstack` serve.
DEV_KIND: Final = "agent"


def default_cache_root() -> Path:
    """Where built models live: ``$GATEWAY_CACHE_DIR`` or ``~/.cache/trtllm-gateway``."""
    env = os.environ.get("GATEWAY_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "trtllm-gateway"


def _recipe_key(kind: str) -> str:

    recipe = RECIPES[kind]
    key = {
        # Any edit of this recipe (code included) gets a new directory instead of a stale cached model.
        "source": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "kind": kind,
        "family": recipe.family,
        "seed": SEED,
        "corpus": recipe.corpus,
        "vocab_size": recipe.vocab_size,
        "alphabet_limit": METASPACE_ALPHABET_LIMIT,
        "special_tokens": SPECIAL_TOKENS,
        "added_tokens": recipe.added_tokens,
        "extra_special_tokens": recipe.extra_special_tokens,
        "chat_template": recipe.chat_template,
        "model": dict(recipe.model),
        "dtype": recipe.dtype,
        # Training and random init may change across library versions; a new version gets a new dir.
        "versions": library_versions(),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _train_tokenizer(recipe: Recipe):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    lines = recipe.corpus.splitlines(keepends=True)
    if recipe.family == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=recipe.vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(lines, trainer=trainer)
    else:
        tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN, byte_fallback=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first", split=True
        )
        trainer = trainers.BpeTrainer(
            vocab_size=recipe.vocab_size - 256,
            special_tokens=[UNK_TOKEN, *SPECIAL_TOKENS],
            limit_alphabet=METASPACE_ALPHABET_LIMIT,
            show_progress=False,
        )
        tokenizer.train_from_iterator(lines, trainer=trainer)
        tokenizer = _with_byte_fallback_tokens(tokenizer)
        # The Llama-2 decoder chain: marks back to spaces, byte tokens back to bytes, drop the leading space.
        tokenizer.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        bos_id = tokenizer.token_to_id(BOS_TOKEN)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, bos_id)]
        )
    return tokenizer


def _with_byte_fallback_tokens(tokenizer):  # (tokenizers.Tokenizer) -> tokenizers.Tokenizer
    """Insert <0x00>..<0xFF> as ordinary vocab entries right after the special tokens, like SentencePiece.

    Handing them to the trainer as special tokens would make them *special* added tokens, which
    skip_special_tokens would then drop from decoded text.
    """
    from tokenizers import Tokenizer

    data = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    special = {t["content"] for t in data["added_tokens"]}
    ordered = sorted(vocab, key=vocab.__getitem__)
    specials = [t for t in ordered if t in special]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    rest = [t for t in ordered if t not in special and t not in byte_tokens]
    data["model"]["vocab"] = {t: i for i, t in enumerate([*specials, *byte_tokens, *rest])}
    for added in data["added_tokens"]:
        added["id"] = data["model"]["vocab"][added["content"]]
    return Tokenizer.from_str(json.dumps(data))


def _save_tokenizer(recipe: Recipe, out: Path):  # -> PreTrainedTokenizerFast
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    backend = _train_tokenizer(recipe)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in recipe.added_tokens])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN if recipe.family == "metaspace" else None,
        additional_special_tokens=[EOT_TOKEN, IM_START_TOKEN, *recipe.extra_special_tokens],
        chat_template=recipe.chat_template,
        clean_up_tokenization_spaces=False,
        model_max_length=recipe.model["max_position_embeddings"],
    )
    # The chat template goes into tokenizer_config.json (not chat_template.jinja): gateways read it there.
    tokenizer.save_pretrained(out, save_jinja_files=False)
    return tokenizer


def _save_model(recipe: Recipe, tokenizer, out: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    eot_id = tokenizer.convert_tokens_to_ids(EOT_TOKEN)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS_TOKEN),
        eos_token_id=eos_id,
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        tie_word_embeddings=False,
        dtype="float32",
        **recipe.model,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config)
    if recipe.dtype != "float32":
        model.to(getattr(torch, recipe.dtype))
        model.config.dtype = recipe.dtype
    model.eval()
    # Like Llama 3 instruct: the tokenizer's eos ends a document, the extra eos id ends a chat turn.
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[eos_id, eot_id],
        pad_token_id=config.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out)


def parameter_count(model_dir: Path) -> int:
    """The parameters of a saved model, read from its safetensors headers (no torch import)."""
    total = 0
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with file.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= int(dim)
                total += count
    return total


@contextlib.contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def build_tiny_model(kind: str = "bpe", *, cache_root: Path | None = None) -> Path:
    """Return the directory of the tiny model of ``kind``, building it on first use.

    The directory is keyed by the recipe's content, built in a temporary directory and renamed into
    place, so concurrent callers and interrupted builds never see a half-written model.
    """
    if kind not in ALL_KINDS:
        raise ValueError(f"unknown tiny model kind {kind!r}; expected one of {', '.join(ALL_KINDS)}")
    root = (cache_root or default_cache_root()).expanduser()
    final = root / f"tiny-{kind}-{_recipe_key(kind)}"

    def build(out: Path) -> None:
        with _quiet_progress_bars():
            tokenizer = _save_tokenizer(RECIPES[kind], out)
            _save_model(RECIPES[kind], tokenizer, out)

    if publish_dir(final, build, marker="config.json"):
        logger.info("built tiny %s model in %s", kind, final)
    return final


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.tiny_model", description=__doc__)
    parser.add_argument("--kind", choices=ALL_KINDS, default="bpe")
    parser.add_argument(
        "--cache-root", type=Path, default=None, help="default: $GATEWAY_CACHE_DIR or ~/.cache"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = build_tiny_model(args.kind, cache_root=args.cache_root)
    # The path is the command's output, meant for shell use: $(python -m deploy.tiny_model).
    sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
