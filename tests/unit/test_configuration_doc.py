"""docs/configuration.md stays the whole truth: every setting with its flag, variable and YAML key,
every model key, and a complete YAML example that loads."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gateway.config import ServedModel, Settings, env_name, flag_name

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _rows(text: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| `")
    ]


def test_every_setting_is_listed_with_its_flag_variable_and_yaml_key() -> None:
    rows = {row[0]: row for row in _rows(DOC.read_text())}
    for name in Settings.model_fields:
        row = rows[f"`{flag_name(name)}`"]
        assert row[1] == f"`{env_name(name)}`"
        if name != "config_file":
            assert row[2].startswith(f"`{name}`")


def test_every_model_key_is_listed() -> None:
    keys = {row[0] for row in _rows(DOC.read_text())}
    assert {f"`{name}`" for name in ServedModel.model_fields} <= keys


def test_the_complete_example_sets_every_setting_and_loads(tmp_path: Path) -> None:
    text = DOC.read_text().split("## Complete example", 1)[1]
    example = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert example is not None
    data = yaml.safe_load(example.group(1))
    assert set(data) == set(Settings.model_fields) - {"config_file"}
    assert set(data["models"][0]) == set(ServedModel.model_fields)
    # The key file must exist at start-up: here, one written for the test.
    keys = tmp_path / "api-keys"
    keys.write_text("# one per line\nsk-from-file\n")
    config = tmp_path / "gateway.yaml"
    config.write_text(example.group(1).replace("/etc/gateway/api-keys", str(keys)))
    s = Settings.load(config_file=config)
    assert s.triton_url == ["triton-0.triton:8001", "triton-1.triton:8001"]
    assert [(m.name, m.route, m.tool_parser) for m in s.models] == [
        ("llama-3.1-8b-instruct", "engine", "llama3_json"),
        ("qwen2.5-7b-instruct", "auto", "hermes"),
    ]
    assert s.accepted_keys() == ["sk-gateway-first-key", "sk-from-file"]
    assert s.state_dir == Path("/var/lib/gateway")
    assert [(k.key, k.rpm, k.tpm) for k in s.key_rate_limits] == [("sk-gateway-first-key", 60, 200000)]
    assert [(m.name, m.base) for m in s.lora_modules] == [
        ("sql-adapter", "llama-3.1-8b-instruct"),
        ("support-tone", "qwen2.5-7b-instruct"),
    ]
    assert s.lora_dynamic_roots == [Path("/adapters/uploads")]
    for name, value in data.items():
        if name not in (
            "models",
            "api_key_file",
            "state_dir",
            "key_rate_limits",
            "lora_modules",
            "lora_dynamic_roots",
        ):
            assert getattr(s, name) == value, name
