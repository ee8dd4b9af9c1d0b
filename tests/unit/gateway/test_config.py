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


def test_a_state_url_keeps_stored_responses_there_unless_a_store_is_chosen(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert Settings().response_store == "sqlite"
    assert Settings(state_url="redis://valkey:6379/0").response_store == "redis"
    assert Settings(state_url="redis://valkey:6379/0", response_store="memory").response_store == "memory"
    # A config file's choice wins over the state server's default when the URL comes from a flag.
    config = tmp_path / "gateway.yaml"
    config.write_text("response_store: sqlite\n")
    loaded = Settings.load(config_file=config, state_url="rediss://user:pw@valkey:6380/2")
    assert loaded.response_store == "sqlite"
    with pytest.raises(ValueError, match="response_store redis needs state_url"):
        Settings(response_store="redis")
    for bad in ("valkey:6379", "http://valkey:6379"):
        with pytest.raises(ValueError, match="redis://HOST:PORT/DB"):
            Settings(state_url=bad)


def test_key_rate_limits_come_from_flags_the_environment_and_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--api-keys",
            "k1",
            "--api-keys",
            "k2",
            "--key-rate-limit",
            "key=k1,rpm=5",
            "--key-rate-limit",
            "key=k2,tpm=9",
        ]
    )
    s = settings_from_args(args)
    assert [(k.key, k.rpm, k.tpm) for k in s.key_rate_limits] == [("k1", 5, None), ("k2", None, 9)]
    monkeypatch.setenv("GATEWAY_API_KEYS", "k1,k2")
    monkeypatch.setenv("GATEWAY_KEY_RATE_LIMITS", "key=k1,rpm=5; key=k2,rpm=7,tpm=100")
    assert [(k.key, k.rpm, k.tpm) for k in Settings().key_rate_limits] == [("k1", 5, None), ("k2", 7, 100)]
    monkeypatch.delenv("GATEWAY_KEY_RATE_LIMITS")
    config = tmp_path / "gateway.yaml"
    config.write_text("key_rate_limits:\n  - key=k1,rpm=5\n  - {key: k2, tpm: 50}\n")
    loaded = Settings.load(config_file=config)
    assert [(k.key, k.rpm, k.tpm) for k in loaded.key_rate_limits] == [("k1", 5, None), ("k2", None, 50)]


def test_key_rate_limits_name_an_accepted_key_and_positive_limits() -> None:
    with pytest.raises(ValueError, match="not one of the accepted API keys"):
        Settings(api_keys=["k1"], key_rate_limits=["key=other,rpm=5"])
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        Settings(api_keys=["k1"], key_rate_limits=["key=k1,rpm=0"])
    with pytest.raises(ValueError, match="Extra inputs"):
        Settings(api_keys=["k1"], key_rate_limits=["key=k1,rps=5"])
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        Settings(rate_limit_rpm=0)


def test_the_key_file_gives_keys_their_own_limits_and_the_setting_wins(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("k1 rpm=5 tpm=100\nk2 priority=0 tpm=7\nk3\n")
    s = Settings(api_key_file=keys, key_rate_limits=["key=k2,rpm=9"])
    assert {k: (v.rpm, v.tpm) for k, v in s.key_limits().items()} == {"k1": (5, 100), "k2": (9, None)}
    assert s.key_priorities() == {"k2": 0}
    for line, message in (("k1 rpm=0", "rpm must be at least 1"), ("k1 rpm=x", "rpm must be an integer")):
        keys.write_text(line + "\n")
        with pytest.raises(ValueError, match=message):
            Settings(api_key_file=keys)


def test_lora_adapters_come_from_flags_the_environment_and_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gateway.config import LoraModule

    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            "name=tiny,tokenizer=/t",
            "--lora",
            "a=/adapters/a",
            "--lora",
            "b=/b,base=tiny,server_path=/srv/b",
        ]
    )
    s = settings_from_args(args)
    assert s.lora_modules == [
        LoraModule(name="a", path=Path("/adapters/a")),
        LoraModule(name="b", path=Path("/b"), base="tiny", server_path="/srv/b"),
    ]
    assert [s.lora_base(m) for m in s.lora_modules] == ["tiny", "tiny"]
    monkeypatch.setenv("GATEWAY_LORA_MODULES", "a=/a; b=/b")
    assert [m.name for m in Settings().lora_modules] == ["a", "b"]
    monkeypatch.delenv("GATEWAY_LORA_MODULES")
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "lora_modules:\n  - c=/c,base=m\n  - {name: d, path: /d}\nmodels:\n  - name=m,tokenizer=/m\n"
    )
    assert [(m.name, m.base) for m in Settings.load(config_file=config).lora_modules] == [
        ("c", "m"),
        ("d", None),
    ]


@pytest.mark.parametrize(
    ("models", "lora", "needle"),
    [
        ([], ["../a=/a"], "is not allowed"),
        ([], ["a"], "does not start with NAME=PATH"),
        (["name=a,tokenizer=/a"], ["a=/x"], "already a model or adapter name"),
        (["name=a,tokenizer=/a"], ["x=/x,base=b"], "is not a served model"),
        (["name=a,tokenizer=/a", "name=b,tokenizer=/b"], ["x=/x"], "name its base model"),
        ([], ["x=/x,colour=red"], "Extra inputs"),
    ],
)
def test_bad_lora_specs_are_refused(models: list[str], lora: list[str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        Settings(models=models, lora_modules=lora)


def test_dynamic_lora_roots_need_admin_keys(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs admin_api_keys"):
        Settings(lora_dynamic_roots=[tmp_path])
    assert Settings(lora_dynamic_roots=[tmp_path], admin_api_keys=["k"]).admin_api_keys == ["k"]
