"""Log probabilities from logits rows (generation or context logits): one log-softmax per row, in
float64, from which both a token's own log probability and its alternatives are read, so a chosen
token equals its own entry among the alternatives bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gateway.engine import TokenLogprob


def decode_logits(raw: bytes, datatype: str, vocab: int) -> np.ndarray | None:
    """[rows, vocab] logits from a response tensor's raw bytes (FP32, FP16 or BF16)."""
    if not vocab:
        return None
    if datatype == "BF16":
        # bfloat16 is the high half of a float32: widen by shifting into the upper 16 bits.
        halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return halves.view(np.float32).reshape(-1, vocab)
    dtype = np.dtype("<f2") if datatype == "FP16" else np.dtype("<f4")
    return np.frombuffer(raw, dtype=dtype).reshape(-1, vocab)


def scored_tokens(
    rows: np.ndarray, tokens: Sequence[int], top: int, *, ranks: bool = False
) -> list[TokenLogprob]:
    """Each token's log probability under its row (row i scores tokens[i]) and the `top` most likely
    alternatives of that row, best first (ties by token id); `ranks`: each token's rank too (1 =
    the most likely; vLLM's prompt logprobs give it)."""
    count = len(tokens)
    if count == 0:
        return []
    logits = np.asarray(rows[:count], dtype=np.float64)
    ids = np.asarray(tokens, dtype=np.int64)
    # log_softmax(x) = (x - max) - log(sum(exp(x - max))), the same expression for every entry read.
    shifted = logits - logits.max(axis=1, keepdims=True)
    norm = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    logsoftmax = shifted - norm
    chosen = logsoftmax[np.arange(count), ids]
    rank_of = (logsoftmax > chosen[:, None]).sum(axis=1) + 1 if ranks else None
    k = min(top, logits.shape[1])
    best: np.ndarray | None = None
    if k > 0:
        # Candidates by argpartition, then ordered by value and, among equals, by token id.
        part = np.argpartition(-logsoftmax, k - 1, axis=1)[:, :k]
        values = np.take_along_axis(logsoftmax, part, axis=1)
        order = np.lexsort((part, -values), axis=1)
        best = np.take_along_axis(part, order, axis=1)
    out = []
    for i in range(count):
        alternatives: tuple[tuple[int, float], ...] = ()
        if best is not None:
            row = logsoftmax[i]
            alternatives = tuple((int(t), float(row[t])) for t in best[i])
        out.append(
            TokenLogprob(
                int(ids[i]),
                float(chosen[i]),
                alternatives,
                rank=None if rank_of is None else int(rank_of[i]),
            )
        )
    return out


def prompt_logprobs(context: np.ndarray, prompt: Sequence[int], top: int) -> tuple[TokenLogprob | None, ...]:
    """Each prompt token's log probability given the tokens before it, from the context logits
    ([prompt tokens, vocab]: row i predicts token i + 1); the first token has none."""
    if not prompt:
        return ()
    if len(context) < len(prompt):
        raise ValueError(f"{len(context)} context logits rows for a prompt of {len(prompt)} tokens")
    scored = scored_tokens(context[: len(prompt) - 1], prompt[1:], top, ranks=True)
    return (None, *scored)
