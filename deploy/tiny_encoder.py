"""Build (once, deterministically, cached) the tiny encoders of the local stack: a BERT-class
sentence embedding model (sentence-transformers layout: mean pooling, normalized, Matryoshka
dimensions) and a BERT cross-encoder (`BertForSequenceClassification`, one relevance logit), both
with a real WordPiece tokenizer trained on the built-in corpus (`deploy.tiny_corpus`).

``python -m deploy.tiny_encoder --kind embed|score`` prints the model directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from deploy.publish import library_versions, publish_dir
from deploy.tiny_corpus import AGENT_CORPUS
from deploy.tiny_model import default_cache_root

logger = logging.getLogger(__name__)

SEED: Final = 20240611
KINDS: Final = ("embed", "score")
VOCAB_SIZE: Final = 1024
BERT_PARAMS: Final[dict[str, Any]] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "max_position_embeddings": 128,
    "type_vocab_size": 2,
    # Larger than BERT's 0.02, so that embeddings of different texts are far apart.
    "initializer_range": 0.2,
}
# The embedding model's Matryoshka dimensions (config.json `matryoshka_dimensions`, as vLLM reads).
MATRYOSHKA: Final = (32, 16, 8)
MAX_SEQ_LENGTH: Final = 128


def _key(kind: str) -> str:

    key = {
        "source": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "kind": kind,
        "corpus": hashlib.sha256(AGENT_CORPUS.encode()).hexdigest(),
        "versions": library_versions(),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _tokenizer():  # -> transformers.BertTokenizerFast
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials, show_progress=False)
    backend.train_from_iterator(AGENT_CORPUS.splitlines(), trainer=trainer)
    cls, sep = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return BertTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=MAX_SEQ_LENGTH,
    )


def _save(kind: str, out: Path) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    tokenizer = _tokenizer()
    tokenizer.save_pretrained(out)
    torch.manual_seed(SEED)
    config = BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **BERT_PARAMS)
    if kind == "embed":
        model: Any = BertModel(config, add_pooling_layer=False)
        model.config.matryoshka_dimensions = list(MATRYOSHKA)
        model.save_pretrained(out)
        _write(
            out / "modules.json",
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                },
            ],
        )
        _write(out / "sentence_bert_config.json", {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False})
        _write(
            out / "1_Pooling" / "config.json",
            {
                "word_embedding_dimension": BERT_PARAMS["hidden_size"],
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
                "pooling_mode_weightedmean_tokens": False,
                "pooling_mode_lasttoken": False,
                "include_prompt": True,
            },
        )
        (out / "2_Normalize").mkdir()
    else:
        config.num_labels = 1
        model = BertForSequenceClassification(config)
        model.save_pretrained(out)


def _write(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def build_tiny_encoder(kind: str = "embed", *, cache_root: Path | None = None) -> Path:
    """The directory of the tiny encoder of ``kind``, built on first use (in a temporary directory
    renamed into place, so concurrent builds never see half a model)."""
    if kind not in KINDS:
        raise ValueError(f"unknown tiny encoder kind {kind!r}; expected one of {', '.join(KINDS)}")
    root = (cache_root or default_cache_root()).expanduser()
    final = root / f"tiny-encoder-{kind}-{_key(kind)}"
    if publish_dir(final, lambda out: _save(kind, out), marker="config.json"):
        logger.info("built tiny %s encoder in %s", kind, final)
    return final


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.tiny_encoder", description=__doc__)
    parser.add_argument("--kind", choices=KINDS, default="embed")
    parser.add_argument("--cache-root", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.stdout.write(f"{build_tiny_encoder(args.kind, cache_root=args.cache_root)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
