"""Fixtures shared by the unit and API suites (imported by their conftest files)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_bpe_dir() -> Path:
    from deploy.tiny_model import build_tiny_model

    return build_tiny_model("bpe")


@pytest.fixture(scope="session")
def tiny_metaspace_dir() -> Path:
    from deploy.tiny_model import build_tiny_model

    return build_tiny_model("metaspace")


@pytest.fixture(scope="session")
def tiny_agent_dir() -> Path:
    """The model `make run` serves: long context, trained vocabulary, think tokens."""
    from deploy.tiny_model import build_tiny_model

    return build_tiny_model("agent")


def build_tiny(kind: str) -> Path:
    from deploy.tiny_model import build_tiny_model

    return build_tiny_model(kind)


@pytest.fixture(scope="session")
def tiny_gemma3_vlm_dir() -> Path:
    from deploy.tiny_vlm import build_vlm_model

    return build_vlm_model("gemma3")


@pytest.fixture(scope="session")
def tiny_embed_dir() -> Path:
    from deploy.tiny_encoder import build_tiny_encoder

    return build_tiny_encoder("embed")


@pytest.fixture(scope="session")
def tiny_score_dir() -> Path:
    from deploy.tiny_encoder import build_tiny_encoder

    return build_tiny_encoder("score")
