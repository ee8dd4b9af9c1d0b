from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import build_parser, settings_from_args
from gateway.config import ServedModel, Settings


def test_list_settings_come_from_the_environment_as_comma_lists_or_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GATEWAY_TRITON_URL", "a:8001, b:8001")
    monkeypatch.setenv("GATEWAY_API_KEYS", '["k1", "k2"]')
    s = Settings()
    assert s.triton_url == ["a:8001", "b:8001"]
    assert s.api_keys == ["k1", "k2"]


def test_flags_win_over_environment_which_wins_over_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("port: 7000\nmax_n: 3\nlog_level: debug\nmodels:\n  - {name: m, tokenizer: /tok}\n")
    monkeypatch.setenv("GATEWAY_CONFIG_FILE", str(config))
    monkeypatch.setenv("GATEWAY_MAX_N", "5")
    args = build_parser().parse_args(
        ["serve", "--log-level", "warning", "--triton-url", "t:1", "--triton-url", "t:2"]
    )
    s = settings_from_args(args)
    assert (s.port, s.max_n, s.log_level, s.triton_url) == (7000, 5, "warning", ["t:1", "t:2"])
    assert s.models == [ServedModel(name="m", tokenizer=Path("/tok"))]


def test_model_specs_parse_and_reject_nonsense() -> None:
    m = ServedModel.parse_spec("name=tiny,tokenizer=/x,route=engine,engine_model=trt")
    assert (m.name, m.route, m.engine_model, m.triton_model) == ("tiny", "engine", "trt", "ensemble")
    with pytest.raises(ValueError):
        ServedModel.parse_spec("name=tiny,tokenizer=/x,route=warp")
    with pytest.raises(ValueError):
        ServedModel.parse_spec("tiny")


def test_every_flag_documents_its_environment_variable() -> None:
    text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    for name in Settings.model_fields:
        assert f"GATEWAY_{name.upper()}" in text.replace("\n", " ").replace("  ", " ")


def test_a_model_s_reasoning_parser_is_one_of_the_registered_formats(tiny_bpe_dir: Path) -> None:
    import pydantic

    from gateway.text.reasoning.registry import MODEL_FORMATS

    for name in MODEL_FORMATS:
        assert ServedModel(name="m", tokenizer=tiny_bpe_dir, reasoning_parser=name).reasoning_parser == name
    with pytest.raises(pydantic.ValidationError, match="reasoning_parser must be one of none, deepseek_r1"):
        ServedModel(name="m", tokenizer=tiny_bpe_dir, reasoning_parser="o1")
    spec = ServedModel.parse_spec(f"name=m,tokenizer={tiny_bpe_dir},reasoning_parser=qwen3")
    assert spec.reasoning_parser == "qwen3"


def test_gateway_models_takes_the_flags_own_syntax_json_and_yaml_model_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GATEWAY_MODELS", "name=a,tokenizer=/a; name=b,tokenizer=/b,route=engine")
    s = Settings()
    assert [(m.name, m.route) for m in s.models] == [("a", "auto"), ("b", "engine")]
    monkeypatch.setenv("GATEWAY_MODELS", '[{"name": "c", "tokenizer": "/c"}]')
    assert [m.name for m in Settings().models] == ["c"]
    monkeypatch.delenv("GATEWAY_MODELS")
    config = tmp_path / "gateway.yaml"
    # `model:` for one model, as a mapping or in the flag's syntax; `models:` a list of either.
    for text in (
        "model: {name: m, tokenizer: /m}\n",
        "model: name=m,tokenizer=/m\n",
        "models:\n  - name=m,tokenizer=/m\n",
    ):
        config.write_text(text)
        assert Settings.load(config_file=config).models == [ServedModel(name="m", tokenizer=Path("/m"))]
    config.write_text("model: name=m,tokenizer=/m\nmodels: []\n")
    with pytest.raises(ValueError, match="either `model:` or `models:`"):
        Settings.load(config_file=config)


@pytest.mark.parametrize(
    "url", ["127.0.0.1:8001", "triton:8001", "[::1]:8001", "dns:///triton:8001", "unix:/run/triton.sock"]
)
def test_grpc_targets_are_accepted_as_triton_urls(url: str) -> None:
    assert Settings(triton_url=[url]).triton_url == [url]


def test_triton_http_urls_pair_with_the_grpc_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TRITON_URL", "a:8001,b:8001")
    monkeypatch.setenv("GATEWAY_TRITON_HTTP_URL", "http://a:8000/, HTTP://b:8000")
    assert Settings().triton_http_url == ["http://a:8000", "http://b:8000"]
    monkeypatch.setenv("GATEWAY_TRITON_HTTP_URL", "http://a:8000")
    with pytest.raises(ValueError, match="one HTTP URL per Triton"):
        Settings()
    monkeypatch.delenv("GATEWAY_TRITON_HTTP_URL")
    assert Settings().triton_http_url == []


@pytest.mark.parametrize("url", ["a:8000", "grpc://a:8001", "http://a", "http://a:99999"])
def test_a_triton_http_url_needs_a_scheme_host_and_port(url: str) -> None:
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        Settings(triton_http_url=[url])
