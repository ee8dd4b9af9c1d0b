"""deploy.encoder_repo renders (dry run: no Triton) the repositories of both tiny encoders as their
exports would be configured, with the parsed configs the gateway reads as what they serve."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from deploy.encoder_repo import main
from gateway.triton.encoder import read_encoder_info
from tests.support.fixtures import tiny_embed_dir, tiny_score_dir  # noqa: F401


def _info(path: Path) -> object:
    return read_encoder_info(text_format.Parse(path.read_text(), mc.ModelConfig()))


def test_an_onnx_embedding_repository_and_its_text_model(tiny_embed_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    assert (
        main(["--model-dir", str(tiny_embed_dir), "--out", str(tmp_path), "--text-model", "embedding_text"])
        == 0
    )
    config = (tmp_path / "embedding" / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in config
    assert not (tmp_path / "embedding" / "1" / "model.py").exists()
    info = _info(tmp_path / "embedding" / "config.pbtxt")
    assert (info.takes, info.returns, info.width, info.token_types) == ("ids", "tokens", 32, True)  # type: ignore[attr-defined]
    text = _info(tmp_path / "embedding_text" / "config.pbtxt")
    assert (text.takes, text.returns) == ("text", "pooled")  # type: ignore[attr-defined]
    assert (tmp_path / "embedding_text" / "1" / "model.py").is_file()


def test_a_tensorrt_cross_encoder_repository(tiny_score_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    assert main(["--model-dir", str(tiny_score_dir), "--out", str(tmp_path), "--backend", "tensorrt"]) == 0
    config = (tmp_path / "reranker" / "config.pbtxt").read_text()
    assert 'platform: "tensorrt_plan"' in config
    info = _info(tmp_path / "reranker" / "config.pbtxt")
    assert (info.returns, info.output_name, info.width) == ("pooled", "logits", 1)  # type: ignore[attr-defined]


def test_the_dev_stack_renders_an_encoder_directory_as_python_models(
    tiny_embed_dir: Path,  # noqa: F811
    tiny_score_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    from deploy.devstack import encoder_task, prepare_encoder_repository

    assert encoder_task(tiny_embed_dir) == "embed" and encoder_task(tiny_score_dir) == "score"
    repo = prepare_encoder_repository(tmp_path / "repo", tiny_embed_dir, "embed")
    assert repo.ensemble == "embedding"
    assert sorted(p.name for p in repo.path.iterdir()) == ["embedding", "embedding_text"]
    assert 'backend: "python"' in (repo.path / "embedding" / "config.pbtxt").read_text()
    assert (repo.path / "embedding" / "1" / "model.py").is_file()
