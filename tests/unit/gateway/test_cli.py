"""The real `gateway` command in a subprocess: every misconfiguration is one clear line on stderr
naming the flag, file or value, with a non-zero exit code and no traceback, before the port is
bound (and, for `gateway dev`, before Triton is started)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fake_triton import FakeTriton, start_fake_triton
from tests.support.tokenizers import loaded_tokenizer

GATEWAY = Path(sys.executable).with_name("gateway")


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return {**env, "HF_HUB_OFFLINE": "1", **(extra or {})}


def gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GATEWAY), *args], capture_output=True, text=True, timeout=180, env=_env(env), check=False
    )


def one_line(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.returncode == code, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


@pytest.fixture
def taken_port() -> object:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_missing_tokenizer_directory_is_one_line_naming_it() -> None:
    line = one_line(gateway("serve", "--model", "name=tiny,tokenizer=/models/nope"), 2, "/models/nope")
    assert line == "gateway serve: model 'tiny': tokenizer directory /models/nope does not exist"


def test_an_empty_tokenizer_directory_is_one_line_naming_it(tmp_path: Path) -> None:
    one_line(
        gateway("serve", "--model", f"name=tiny,tokenizer={tmp_path}"), 2, str(tmp_path), "has no tokenizer"
    )


def test_a_missing_chat_template_is_one_line_naming_it(tiny_bpe_dir: Path, tmp_path: Path) -> None:
    spec = f"name=tiny,tokenizer={tiny_bpe_dir},chat_template={tmp_path}/none.jinja"
    one_line(gateway("serve", "--model", spec), 2, f"{tmp_path}/none.jinja", "No such file")


def test_a_harmony_parser_on_a_tokenizer_that_is_not_gpt_osss_is_one_line(
    tiny_bpe_dir: Path, tmp_path: Path
) -> None:
    spec = f"name=tiny,tokenizer={tiny_bpe_dir},tool_parser=openai"
    one_line(
        gateway("serve", "--model", spec, "--state-dir", str(tmp_path)),
        2,
        "model 'tiny'",
        "needs the o200k-harmony vocabulary of gpt-oss",
        str(tiny_bpe_dir),
    )


def test_a_missing_config_file_is_one_line_naming_it() -> None:
    one_line(gateway("serve", "--config-file", "/nope/gateway.yaml"), 2, "--config-file /nope/gateway.yaml")


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("port: 9000\nmodels: [\n  name: x\n")
    line = one_line(gateway("serve", "--config-file", str(config)), 2, str(config), "YAML syntax error")
    assert "line" in line and "<unicode string>" not in line


def test_a_bad_value_in_the_config_file_names_the_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("port: 70000\nmax_nn: 3\n")
    line = one_line(gateway("serve", "--config-file", str(config)), 2, str(config))
    assert "`port`" in line and "unknown setting 'max_nn'" in line


def test_a_missing_api_key_file_is_one_line_naming_it(tiny_bpe_dir: Path) -> None:
    result = gateway("serve", "--api-key-file", "/nope/keys", "--model", f"name=t,tokenizer={tiny_bpe_dir}")
    one_line(result, 2, "--api-key-file", "/nope/keys: no such file")


def test_an_unknown_log_level_lists_the_choices_in_one_line() -> None:
    line = one_line(gateway("serve", "--log-level", "verbose"), 2, "--log-level", "'verbose'")
    assert "debug" in line and "usage:" not in line


def test_an_argument_error_is_one_line_without_the_usage_block() -> None:
    one_line(gateway("serve", "--max-n", "many"), 2, "--max-n", "gateway serve --help")
    one_line(gateway("serve", "--model", "name=tiny,tokenizer=/x,rout=engine"), 2, "rout", "unknown key")


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://127.0.0.1:47123", "without a scheme (try '127.0.0.1:47123'"),
        ("127.0.0.1", "is not HOST:PORT"),
        ("triton:99999", "is not HOST:PORT"),
    ],
)
def test_a_triton_url_that_is_not_a_grpc_address_is_refused_before_start(url: str, fragment: str) -> None:
    one_line(
        gateway("serve", "--triton-url", url, "--model", "name=a,tokenizer=/x"), 2, "--triton-url", fragment
    )


def test_a_model_name_given_twice_is_refused(tiny_bpe_dir: Path) -> None:
    spec = f"name=tiny,tokenizer={tiny_bpe_dir}"
    one_line(
        gateway("serve", "--model", spec, "--model", spec + ",route=engine"), 2, "'tiny' is configured twice"
    )
    one_line(gateway("serve", env={"GATEWAY_MODELS": f"{spec};{spec}"}), 2, "GATEWAY_MODELS", "twice")


def test_a_taken_port_is_one_line_before_serving(tiny_bpe_dir: Path, taken_port: int) -> None:
    result = gateway("serve", "--port", str(taken_port), "--model", f"name=t,tokenizer={tiny_bpe_dir}")
    one_line(result, 1, f"cannot listen on 127.0.0.1:{taken_port}", "in use")


def test_gateway_dev_with_a_taken_port_fails_at_once_without_starting_triton(taken_port: int) -> None:
    result = gateway("dev", "--port", str(taken_port), "--engine-mode", "synthetic")
    one_line(result, 1, f"gateway dev: cannot listen on 127.0.0.1:{taken_port}")
    assert "READY" not in result.stdout and "serving" not in result.stdout


# What takes seconds to import; the checks that take well under one come before any of it.
HEAVY_MODULES = ("transformers", "torch", "uvicorn", "fastapi", "gateway.app")


def gateway_in_process(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`gateway ARGS` in a fresh interpreter, and which heavy modules it had imported when it exited."""
    seen = tmp_path / "imported"
    code = (
        "import atexit, sys\n"
        f"atexit.register(lambda: open({str(seen)!r}, 'w').write("
        # A None entry is no import: a serving process marks torch absent (keep_torch_out).
        f"' '.join(m for m in {HEAVY_MODULES!r} if sys.modules.get(m) is not None)))\n"
        "from gateway.cli import main\n"
        f"main({list(args)!r})\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=_env(), check=False
    )
    return result, seen.read_text().split()


def test_a_missing_tokenizer_or_a_taken_port_is_found_before_the_heavy_imports(
    tmp_path: Path, tiny_bpe_dir: Path, taken_port: int
) -> None:
    result, imported = gateway_in_process(tmp_path, "serve", "--model", "name=t,tokenizer=/models/nope")
    one_line(result, 2, "tokenizer directory /models/nope does not exist")
    assert imported == []
    spec = f"name=t,tokenizer={tiny_bpe_dir}"
    result, imported = gateway_in_process(tmp_path, "serve", "--port", str(taken_port), "--model", spec)
    one_line(result, 1, f"cannot listen on 127.0.0.1:{taken_port}")
    assert imported == []


def test_gateway_dev_with_a_wrong_model_dir_fails_at_once_without_starting_triton(tmp_path: Path) -> None:
    result, imported = gateway_in_process(tmp_path, "dev", "--port", "0", "--model-dir", "/models/nope")
    line = one_line(result, 2, "--model-dir")
    assert line == "gateway dev: --model-dir: tokenizer directory /models/nope does not exist"
    assert imported == [] and "READY" not in result.stdout


def test_gateway_dev_with_a_missing_chat_template_fails_at_once_without_starting_triton(
    tmp_path: Path,
) -> None:
    result, imported = gateway_in_process(
        tmp_path, "dev", "--port", "0", "--chat-template", f"{tmp_path}/none.jinja"
    )
    line = one_line(result, 2, "--chat-template")
    assert line == f"gateway dev: --chat-template: {tmp_path}/none.jinja: No such file"
    assert imported == [] and "READY" not in result.stdout


def test_help_shows_each_flags_own_value_choices_and_defaults() -> None:
    text = " ".join(gateway("serve", "--help").stdout.split())
    assert "--api-keys KEY" in text and "--cors-origins ORIGIN" in text and "--triton-url HOST:PORT" in text
    assert "--api-keys HOST:PORT" not in text
    for key in ("chat_template=FILE", "max_model_len=N", "tool_parser=none|llama3_json", "engine_model="):
        assert key in text
    assert "add_special_tokens=true|false" in text
    assert "(default: 127.0.0.1:8001)" in text
    assert "--log-level {critical,error,warning,info,debug}" in text and "--log-format {text,json}" in text
    check = " ".join(gateway("check", "--help").stdout.split())
    assert "--triton-url" in check and "--model" in check
    assert "--max-n" not in check and "--cors-origins" not in check and "--workers" not in check
    dev = " ".join(gateway("dev", "--help").stdout.split())
    assert "--tool-parser {none,llama3_json,hermes,qwen3_coder,mistral,deepseek_v3,openai,qwen3_xml}" in dev
    assert "--reasoning-parser {none,deepseek_r1,qwen3,gpt_oss,openai_gptoss}" in dev


async def test_check_exits_non_zero_for_a_model_serve_refuses_and_names_its_triton(
    tiny_bpe_dir: Path, tmp_path: Path
) -> None:
    tok = loaded_tokenizer(tiny_bpe_dir)
    server, url = await start_fake_triton(FakeTriton(tokens=tok.encode("Hi", add_special_tokens=False)))
    try:

        async def check(*args: str) -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(
                str(GATEWAY), "check", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env()
            )
            out, err = await proc.communicate()
            assert proc.returncode is not None
            return proc.returncode, out.decode(), err.decode()

        code, out, err = await check("--triton-url", url, "--model", f"name=good,tokenizer={tiny_bpe_dir}")
        assert code == 0, out + err
        assert f"Triton: {url}\n" in out and " ready " in out
        code, out, err = await check("--triton-url", url, "--model", f"name=bad,tokenizer={tmp_path}")
        assert code == 1, out + err
        assert "not servable" in out and "Traceback" not in err
    finally:
        await server.stop(None)
    # Without --triton-url it says which address it asks.
    result = gateway("check", "--model", "name=x,tokenizer=/nope", "--triton-connect-timeout-s", "1")
    assert result.stdout.startswith("Triton: 127.0.0.1:8001 (the default; set --triton-url)")
    assert result.returncode == 1 and "Traceback" not in result.stderr
