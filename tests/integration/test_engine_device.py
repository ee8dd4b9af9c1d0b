"""The reference engine's engine_device=cuda on a machine whose torch sees no GPU: the model does not
load, and Triton's log says why in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.devstack import TritonServer, TritonStartError, prepare_dev_repository
from deploy.tiny_model import build_tiny_model

torch = pytest.importorskip("torch")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_engine_device_cuda_without_a_gpu_fails_the_model_load_with_the_reason(tmp_path: Path) -> None:
    repo = prepare_dev_repository(
        tmp_path / "repo",
        model_dir=build_tiny_model("bpe"),
        variables={"engine_device": "cuda", "engine_dtype": "bfloat16"},
    )
    server = TritonServer([repo.path], work_dir=tmp_path / "work", log_file=tmp_path / "triton.log")
    with pytest.raises(TritonStartError), server:
        pass
    log = (tmp_path / "triton.log").read_text()
    failures = [line for line in log.splitlines() if "engine_device=cuda but torch" in line]
    assert failures, log[-3000:]
    assert "sees no CUDA GPU" in failures[0] and "use engine_device=cpu" in failures[0]
    assert not server.is_running()
