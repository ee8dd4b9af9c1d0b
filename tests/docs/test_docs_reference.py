"""The documentation names only what the code has: every `--flag`, `GATEWAY_*` variable, command,
make target, module and API field in README.md and docs/ exists, the generated reference tables
are complete, and the configuration examples load. Renaming any of them in the code and not in the
docs fails here. (The examples themselves run in tests/integration/test_docs_snippets.py.)"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel

from gateway import reference
from gateway.cli import build_parser
from gateway.config import Settings, env_name, flag_name
from tests.support.docs_snippets import (
    DOCS,
    ROOT,
    SHELL,
    Block,
    all_blocks,
    commands,
    known_marker,
    pages,
    prose,
)

# Flags of programs outside the project that the pages show, by program: they are not ours to check.
OUTSIDE_FLAGS = {
    "codex": {"--skip-git-repo-check"},
    "curl": {"--fail-with-body"},
    "docker": {
        "--build-arg",
        "--gpus",
        "--shm-size",
        "--ulimit",
        "--rm",
        "--env-file",
        "--profile",
        "--add-host",
        "--build",
    },
    "convert_checkpoint.py": {"--use_weight_only"},
    "trtllm-build": {"--lora_plugin", "--lora_dir", "--gather_context_logits"},
    "lm_eval": {"--model_args", "--tasks", "--limit"},
    "py-spy": {"--gil"},
    "kubectl": {"--for", "--timeout", "--from-literal"},
    "mpirun": {"--allow-run-as-root", "--mca"},
    "srun": {"--container-image"},
    "pip": {"--upgrade"},
    "optimum-cli": {"--model", "--task"},
    # llm-d-router's endpoint picker (the Inference Gateway page).
    "epp": {"--refresh-metrics-interval"},
}
OUTSIDE = frozenset().union(*OUTSIDE_FLAGS.values())
# Programs whose command lines the pages show but the project does not define.
OUTSIDE_PROGRAMS = frozenset(
    {
        "curl",
        "docker",
        "kubectl",
        "npm",
        "codex",
        "claude",
        "cp",
        "mkdir",
        "cd",
        "cat",
        "grep",
        "export",
        "sudo",
        "lm_eval",
    }
)
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_]*(?:-[a-z0-9_]+)*")
_ENV = re.compile(r"\bGATEWAY_[A-Z0-9_]+\b")
_INLINE = re.compile(r"`([^`\n]+)`")


def _sources() -> str:
    files = [
        *ROOT.glob("gateway/**/*.py"),
        *ROOT.glob("deploy/**/*.py"),
        *ROOT.glob("deploy/*.sh"),
        *ROOT.glob("loadtest/**/*.py"),
        *ROOT.glob("engines/**/*.c"),
        ROOT / "Makefile",
    ]
    return "\n".join(path.read_text(encoding="utf-8") for path in files)


def _parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    flags = {f for action in parser._actions for f in action.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _parser_flags(sub)
    return flags


def _project_flags() -> set[str]:
    # The gateway's flags are made from Settings (no literal in the source); every other tool of
    # the project spells its flags out (argparse, the shell scripts' `case`, the Makefile).
    return _parser_flags(build_parser()) | set(_FLAG.findall(_sources()))


def _mentions(pattern: re.Pattern[str]) -> dict[str, list[str]]:
    """Each match in the pages' inline code and shell blocks, with where it is."""
    found: dict[str, list[str]] = {}
    for page in pages():
        for code in _INLINE.findall(prose(page)):
            for name in pattern.findall(code):
                found.setdefault(name, []).append(str(page.relative_to(ROOT)))
    for block in all_blocks():
        if block.language in SHELL or block.language in ("yaml", "toml", "python"):
            for name in pattern.findall(block.text):
                found.setdefault(name, []).append(block.where)
    return found


def test_every_marker_is_one_the_contributing_guide_defines() -> None:
    unknown = [
        f"{b.where}: {b.requires}" for b in all_blocks() if b.requires and not known_marker(b.requires)
    ]
    assert not unknown, (
        f"unknown `<!-- requires: ... -->` values (docs/contributing.md lists them): {unknown}"
    )


def test_every_documented_flag_exists() -> None:
    known = _project_flags() | OUTSIDE
    unknown = {flag: where for flag, where in _mentions(_FLAG).items() if flag not in known}
    assert not unknown, f"flags the docs name that no CLI, script or Makefile defines: {unknown}"


def test_every_documented_environment_variable_is_a_setting_or_read_by_the_code() -> None:
    known = {env_name(name) for name in Settings.model_fields} | set(_ENV.findall(_sources()))
    unknown = {name: where for name, where in _mentions(_ENV).items() if name not in known}
    assert not unknown, f"GATEWAY_* variables the docs name that the code does not read: {unknown}"


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][a-z0-9-]*):", text, re.M))


def _check_command(words: list[str], block: Block) -> str | None:
    program = Path(words[0]).name
    if program == "gateway":
        try:
            build_parser().parse_args(words[1:])
        except SystemExit:
            return f"`{' '.join(words[:3])} ...` does not parse with the gateway's CLI"
    elif program == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        missing = [t for t in targets if t not in _makefile_targets()]
        if missing:
            return f"make targets {missing} are not in the Makefile"
    elif program.startswith("python") and "-m" in words:
        module = words[words.index("-m") + 1]
        if importlib.util.find_spec(module) is None:
            return f"python -m {module}: no such module"
    elif program.startswith("python") and len(words) > 1 and words[1].endswith(".py"):
        script_path = ROOT / words[1]
        if not script_path.is_file():
            return f"{words[1]}: no such file"
        source = script_path.read_text(encoding="utf-8")
        missing = [w for w in words[2:] if _FLAG.fullmatch(w) and f'"{w}"' not in source]
        if missing:
            return f"{words[1]} does not know {missing}"
    elif program.endswith(".sh") or program.endswith(".py"):
        script = next((p for p in (ROOT / "deploy").glob(program)), None)
        if script is None:
            return f"{program}: no such script in deploy/"
        text = script.read_text(encoding="utf-8")
        missing = [w for w in words[1:] if _FLAG.fullmatch(w) and w not in text]
        if missing:
            return f"{program} does not know {missing}"
    elif program not in OUTSIDE_PROGRAMS:
        return f"`{program}`: not a command of the project nor a listed outside program"
    return None


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.language in SHELL], ids=lambda b: b.where)
def test_every_documented_command_exists(block: Block) -> None:
    """Run or not, a block's commands are the project's: `gateway ...` parses, make targets and
    modules exist, scripts know their flags."""
    problems = [p for words in commands(block.text) if (p := _check_command(words, block)) is not None]
    assert not problems, f"{block.where}: {problems}"


# Each API page's "Fields honoured" table, and the wire models its fields must be found in.
def _api_models() -> dict[str, list[type[BaseModel]]]:
    from gateway.apis.chat_completions.protocol import ChatCompletionRequest
    from gateway.apis.completions.protocol import CompletionRequest
    from gateway.apis.embeddings.protocol import EmbeddingRequest
    from gateway.apis.messages.protocol import MessageCreateRequest
    from gateway.apis.rerank.protocol import RerankRequest
    from gateway.apis.responses.protocol import CreateResponseRequest
    from gateway.apis.score.protocol import ScoreRequest
    from gateway.apis.tokenize.protocol import DetokenizeRequest, TokenizeRequest

    return {
        "chat-completions.md": [ChatCompletionRequest],
        "completions.md": [CompletionRequest],
        "responses.md": [CreateResponseRequest],
        "messages.md": [MessageCreateRequest],
        "tokenize.md": [TokenizeRequest, DetokenizeRequest],
        "embeddings.md": [EmbeddingRequest],
        "rerank-score.md": [RerankRequest, ScoreRequest],
    }


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through lists, unions, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _has_field(models: list[type[BaseModel]], path: str) -> bool:
    head, _, rest = path.partition(".")
    for model in models:
        field = model.model_fields.get(head) or next(
            (f for f in model.model_fields.values() if f.alias == head), None
        )
        if field is None:
            continue
        if not rest:
            return True
        inner = _models_in(field.annotation)
        if not inner or _has_field(inner, rest):
            # A dict or Any field holds whatever the page says is in it.
            return True
    return False


def _honoured_fields(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    section = text.split("## Fields honoured", 1)[1].split("\n## ", 1)[0]
    names = []
    for line in section.splitlines():
        if line.startswith("| `"):
            names += _INLINE.findall(line.split("|")[1])
    return names


@pytest.mark.parametrize("page", sorted(_api_models()))
def test_every_field_an_api_page_honours_is_in_its_wire_model(page: str) -> None:
    names = _honoured_fields(DOCS / "apis" / page)
    assert names, f"docs/apis/{page} has no 'Fields honoured' table"
    models = _api_models()[page]
    missing = [name for name in names if not _has_field(models, name)]
    assert not missing, f"docs/apis/{page} names fields its request model does not have: {missing}"


def test_the_generated_settings_table_has_every_setting() -> None:
    table = reference.settings_table()
    for name in Settings.model_fields:
        assert f"| `{flag_name(name)}`<br>`{env_name(name)}`" in table, name


def test_the_generated_metrics_table_has_every_metric_the_gateway_exports() -> None:
    from gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics()
    exported = {family.name for family in metrics.registry.collect()}
    listed = {m["name"].removesuffix("_total") for m in reference.metric_families(metrics)}
    assert exported == listed


def test_the_ignored_fields_are_defined_by_openai_and_not_parsed() -> None:
    from gateway.apis.chat_completions.protocol import OPENAI_FIELDS, ChatCompletionRequest

    ignored = reference.ignored_fields("chat")
    assert "store" in ignored and "messages" not in ignored
    assert set(ignored) <= OPENAI_FIELDS - ChatCompletionRequest.model_fields.keys()


def test_every_reference_marker_expands_and_an_unknown_one_fails() -> None:
    for page in pages():
        text = page.read_text(encoding="utf-8")
        assert reference.MARKER.search(reference.expand(text)) is None, page
    with pytest.raises(KeyError, match="unknown reference"):
        reference.expand("<!-- reference: setings -->")


def _yaml_blocks(page: Path) -> list[str]:
    return [b.text for b in all_blocks() if b.path == page and b.language == "yaml"]


@pytest.mark.parametrize("page", ["operate/configuration.md", "triton/index.md"])
def test_the_configuration_examples_load_as_settings(page: str, tmp_path: Path) -> None:
    keys = tmp_path / "api-keys"
    keys.write_text("sk-a\n")
    (text,) = _yaml_blocks(DOCS / page)
    data = yaml.safe_load(text)
    unknown = set(data) - set(Settings.model_fields) - {"model"}
    assert not unknown, f"docs/{page}: keys that are no setting: {unknown}"
    config = tmp_path / "gateway.yaml"
    config.write_text(text.replace("/etc/gateway/api-keys", str(keys)))
    settings = Settings.load(config_file=config)
    assert settings.models
