"""A serving process keeps transformers off torch (gateway.text.tokenizer.keep_torch_out): it needs
tokenizers, chat templates and image processors only, and torch cost every start seconds of CPU and
every worker hundreds of MB. Each case runs in a fresh interpreter, since the choice is made once,
before transformers is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.fixtures import tiny_bpe_dir  # noqa: F401

PROBE = """
import json, sys
{before}
from gateway.text.tokenizer import Tokenizer, keep_torch_out
keep_torch_out()
tokenizer = Tokenizer(sys.argv[1])
ids = tokenizer.encode("Hello there", add_special_tokens=False)
prompt = tokenizer.apply_chat_template([{{"role": "user", "content": "Hello there"}}])
print(json.dumps({{
    "torch": sys.modules.get("torch") is not None,
    "text": tokenizer.decode(ids),
    "prompt": prompt,
}}))
"""


def _probe(model_dir: Path, before: str = "") -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before), str(model_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_serving_process_loads_tokenizers_and_templates_without_torch(tiny_bpe_dir: Path) -> None:  # noqa: F811
    kept_out = _probe(tiny_bpe_dir)
    with_torch = _probe(tiny_bpe_dir, before="import torch")
    # Without torch the tokenizer and the chat template give what they give with it.
    assert kept_out["torch"] is False
    assert with_torch["torch"] is True
    assert kept_out["text"] == with_torch["text"] == "Hello there"
    assert kept_out["prompt"] == with_torch["prompt"]
