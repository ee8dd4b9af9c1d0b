"""The per-choice streaming state machine (gateway.core.choices), fed token by token without a server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.core.choices import ChoiceEvent, ChoiceState, GenerationTotals, make_choices, run_generation
from gateway.engine import GenerationDelta, GenerationRequest, SamplingParams, TokenLogprob
from gateway.text.detokenizer import Utf8TextAssembler, ids_decoder
from gateway.text.tokenizer import Tokenizer
from tests.support.tokenizers import loaded_tokenizer


@pytest.fixture(scope="module")
def tok(tiny_bpe_dir: Path) -> Tokenizer:
    return loaded_tokenizer(tiny_bpe_dir)


def _choice(
    tok: Tokenizer,
    *,
    stops: tuple[str, ...] = (),
    end_ids: frozenset[int] = frozenset(),
    max_tokens: int = 100,
) -> ChoiceState:
    return ChoiceState(0, ids_decoder(tok), stops=stops, end_ids=end_ids, max_tokens=max_tokens)


def _feed_one_by_one(choice: ChoiceState, ids: list[int]) -> list[str]:
    return [choice.feed(GenerationDelta(0, token_ids=(t,), num_tokens=1)) for t in ids]


def test_text_arrives_token_by_token_and_a_partial_character_waits_for_its_end(tok: Tokenizer) -> None:
    ids = tok.encode("Hi 🎉 there", add_special_tokens=False)
    partial = [i for i, t in enumerate(ids) if not _whole(tok.token_raw_bytes(t))]
    assert partial, "the reply must split a character across tokens"
    choice = _choice(tok)
    outs = _feed_one_by_one(choice, ids)
    # The token that ends inside the emoji does not give it yet, the one that completes it does;
    # no piece ever holds half a character.
    assert "🎉" not in outs[partial[0]]
    assert next(i for i, o in enumerate(outs) if "🎉" in o) > partial[0]
    assert all("\ufffd" not in o for o in outs)
    assert "".join(outs) + choice.finish() == "Hi 🎉 there"
    assert choice.completion_tokens == len(ids)
    assert choice.finish_reason == "stop"


def test_stop_string_split_across_tokens_is_cut_and_finishes_the_choice(tok: Tokenizer) -> None:
    ids = tok.encode("Hello world and more", add_special_tokens=False)
    choice = _choice(tok, stops=("o wor",))
    outs = []
    for t in ids:
        outs.append(choice.feed(GenerationDelta(0, token_ids=(t,), num_tokens=1)))
        if choice.done:
            break
    assert "".join(outs) == "Hell"
    assert choice.finish_reason == "stop"
    # Nothing more once done, whatever arrives.
    assert choice.feed(GenerationDelta(0, token_ids=(ids[-1],), num_tokens=1)) == ""
    assert choice.finish() == ""


def test_an_end_of_generation_id_ends_the_choice_counts_as_a_token_and_is_never_text(tok: Tokenizer) -> None:
    ids = tok.encode("Hi there", add_special_tokens=False)
    end = 0
    choice = _choice(tok, end_ids=frozenset({end}))
    lps = tuple(TokenLogprob(t, -0.5) for t in (*ids, end))
    text = choice.feed(GenerationDelta(0, token_ids=(*ids, end), num_tokens=len(ids) + 1, logprobs=lps))
    assert text == "Hi there"
    assert choice.finish_reason == "stop"
    assert choice.completion_tokens == len(ids) + 1
    # The end token gets no logprob entry either.
    assert [e.token_id for e in choice.take_logprobs()] == ids
    assert choice.take_logprobs() == ()


def test_finish_without_a_stop_is_length_at_the_limit_else_stop(tok: Tokenizer) -> None:
    ids = tok.encode("Hi there", add_special_tokens=False)
    at_limit = _choice(tok, max_tokens=len(ids))
    _feed_one_by_one(at_limit, ids)
    at_limit.finish()
    assert at_limit.finish_reason == "length"
    below = _choice(tok, max_tokens=len(ids) + 1)
    _feed_one_by_one(below, ids)
    below.finish()
    assert below.finish_reason == "stop"


def test_held_back_text_releases_at_finish_with_its_logprobs_kept_until_taken(tok: Tokenizer) -> None:
    ids = tok.encode("Hello world", add_special_tokens=False)
    choice = _choice(tok, stops=("world!",))
    texts = []
    for t in ids:
        texts.append(
            choice.feed(GenerationDelta(0, token_ids=(t,), num_tokens=1, logprobs=(TokenLogprob(t, -1.0),)))
        )
    # "world" might start the stop string: held back until the engine ends the sequence.
    assert "".join(texts) == "Hello "
    assert [e.token_id for e in choice.take_logprobs()] == ids
    assert choice.finish() == "world"
    assert choice.finish_reason == "stop"


def test_text_bytes_from_an_ensemble_are_one_utf8_stream(tok: Tokenizer) -> None:
    data = "a 你好 🎉".encode()
    choice = ChoiceState(0, Utf8TextAssembler(), stops=(), end_ids=frozenset(), max_tokens=50)
    outs = [choice.feed(GenerationDelta(0, text=data[i : i + 1], num_tokens=1)) for i in range(len(data))]
    assert all("\ufffd" not in o for o in outs)
    assert "".join(outs) + choice.finish() == "a 你好 🎉"
    assert choice.completion_tokens == len(data)


def _request(*, num_sequences: int = 1, ignore_eos: bool = False, max_tokens: int = 20) -> GenerationRequest:
    return GenerationRequest(
        "r",
        "p",
        (1,),
        SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
        num_sequences=num_sequences,
        end_id=0,
        end_token_ids=(7,),
    )


def test_make_choices_numbers_them_and_ignore_eos_drops_the_end_ids(tok: Tokenizer) -> None:
    choices = make_choices(tok, _request(num_sequences=3), token_ids=True, first_index=4, stops=())
    assert [c.index for c in choices] == [4, 5, 6]
    assert choices[0]._end_ids == frozenset({0, 7})
    ignoring = make_choices(tok, _request(ignore_eos=True), token_ids=True, first_index=0, stops=())
    assert ignoring[0]._end_ids == frozenset()


class _ScriptedEngine:
    def __init__(self, deltas: list[GenerationDelta]) -> None:
        self.deltas = deltas
        self.closed = False

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        try:
            for delta in self.deltas:
                yield delta
        finally:
            self.closed = True


async def test_run_generation_stops_the_engine_once_every_choice_is_done(tok: Tokenizer) -> None:
    hi = tok.encode("Hi STOP more", add_special_tokens=False)
    deltas = [GenerationDelta(i, token_ids=(t,), num_tokens=1) for t in hi for i in (0, 1)]
    request = _request(num_sequences=2)
    choices = make_choices(tok, request, token_ids=True, first_index=0, stops=(" STOP",))
    totals = GenerationTotals(prompt_tokens=1)
    engine = _ScriptedEngine(deltas)
    events: list[ChoiceEvent] = [e async for e in run_generation(engine, request, choices, totals)]  # type: ignore[arg-type]
    assert engine.closed and totals.stopped_early
    for index in (0, 1):
        mine = [e for e in events if e.index == index]
        assert "".join(e.text for e in mine) == "Hi"
        assert [e.finish_reason for e in mine][-1] == "stop"


async def test_run_generation_finishes_choices_the_engine_left_open(tok: Tokenizer) -> None:
    ids = tok.encode("Hi there", add_special_tokens=False)
    request = _request(max_tokens=len(ids))
    choices = make_choices(tok, request, token_ids=True, first_index=0, stops=())
    engine = _ScriptedEngine(
        [GenerationDelta(0, token_ids=(t,), num_tokens=1, num_input_tokens=3) for t in ids]
    )
    totals = GenerationTotals(prompt_tokens=None)
    events = [e async for e in run_generation(engine, request, choices, totals)]  # type: ignore[arg-type]
    assert "".join(e.text for e in events) == "Hi there"
    assert events[-1].finish_reason == "length"
    assert totals.prompt_tokens == 3 and not totals.stopped_early


def _whole(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _text_choice(tok: Tokenizer, *, stops: tuple[str, ...] = (), max_tokens: int = 100) -> ChoiceState:
    return ChoiceState(
        0,
        Utf8TextAssembler(),
        stops=stops,
        end_ids=frozenset(),
        max_tokens=max_tokens,
        count_text=lambda text: len(tok.encode(text, add_special_tokens=False)),
    )


def test_a_text_engines_finish_reason_is_taken_and_its_text_counted_again(tok: Tokenizer) -> None:
    choice = _text_choice(tok)
    assert choice.feed(GenerationDelta(0, text=b"Hello ")) == "Hello "
    assert choice.feed(GenerationDelta(0, text=b"world", finish_reason="stop")) == "world"
    assert choice.finish() == ""
    assert choice.finish_reason == "stop"
    assert choice.completion_tokens == len(tok.encode("Hello world", add_special_tokens=False))


def test_a_length_finish_counts_exactly_max_tokens(tok: Tokenizer) -> None:
    choice = _text_choice(tok, max_tokens=3)
    choice.feed(GenerationDelta(0, text=b"a b c d e", finish_reason="length"))
    choice.finish()
    assert (choice.finish_reason, choice.completion_tokens) == ("length", 3)


def test_a_stop_string_counts_the_text_generated_up_to_where_it_stopped(tok: Tokenizer) -> None:
    choice = _text_choice(tok, stops=("STOP",))
    assert choice.feed(GenerationDelta(0, text=b"one two STOP three")) == "one two "
    assert choice.finish_reason == "stop"
    assert choice.completion_tokens == len(tok.encode("one two STOP three", add_special_tokens=False))
