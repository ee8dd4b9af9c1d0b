"""Pooling as sentence-transformers does it, read from the model's own files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.core.pooling import Classifier, detect_task, pool, read_classifier, read_pooling, relevance
from gateway.errors import ServerConfigError


def _layout(root: Path, pooling: dict[str, object], normalize: bool = True) -> Path:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    (root / "1_Pooling").mkdir(parents=True)
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (root / "config.json").write_text(
        json.dumps({"architectures": ["BertModel"], "matryoshka_dimensions": [8, 4]})
    )
    return root


@pytest.mark.parametrize(
    ("config", "modes"),
    [
        ({"pooling_mode_mean_tokens": True}, ("mean",)),
        ({"pooling_mode_cls_token": True}, ("cls",)),
        ({"pooling_mode": "lasttoken"}, ("lasttoken",)),
        ({"pooling_mode": ["cls", "mean"]}, ("cls", "mean")),
    ],
)
def test_pooling_modes_are_read_in_both_spellings(
    tmp_path: Path, config: dict[str, object], modes: tuple[str, ...]
) -> None:
    pooling = read_pooling(_layout(tmp_path, config))
    assert pooling.modes == modes
    assert pooling.normalize
    assert pooling.matryoshka == (8, 4)
    assert detect_task(tmp_path) == "embed"


def test_a_mode_the_gateway_cannot_apply_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ServerConfigError):
        read_pooling(_layout(tmp_path, {"pooling_mode_weightedmean_tokens": True}))


def test_pooling_matches_its_definitions() -> None:
    states = np.array([[1.0, 2.0], [3.0, 6.0], [5.0, -2.0]])
    assert pool(states, ["mean"]).tolist() == [3.0, 2.0]
    assert pool(states, ["cls"]).tolist() == [1.0, 2.0]
    assert pool(states, ["lasttoken"]).tolist() == [5.0, -2.0]
    assert pool(states, ["max"]).tolist() == [5.0, 6.0]
    assert pool(states, ["cls", "mean"]).tolist() == [1.0, 2.0, 3.0, 2.0]


def test_a_sequence_classifier_scores_with_sigmoid_unless_asked_for_the_logit(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}})
    )
    assert detect_task(tmp_path) == "score"
    classifier = read_classifier(tmp_path)
    assert classifier == Classifier(1, "sigmoid")
    assert relevance(np.array([0.0]), classifier, activate=True) == 0.5
    assert relevance(np.array([1.5]), classifier, activate=False) == 1.5
