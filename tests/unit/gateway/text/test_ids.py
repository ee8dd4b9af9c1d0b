"""TokenIds: a long prompt's ids as one int32 array, behaving as the sequence of ints it holds."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from gateway.text.ids import TokenIds, int32_array, json_ids


def test_token_ids_are_the_sequence_of_their_ints() -> None:
    ids = TokenIds([5, 6, 7, 151_643])
    assert len(ids) == 4 and bool(ids) and not TokenIds([])
    assert ids[0] == 5 and type(ids[0]) is int and ids[-1] == 151_643
    assert ids[1:3] == (6, 7) and isinstance(ids[1:3], TokenIds)
    assert list(ids) == [5, 6, 7, 151_643] and all(type(i) is int for i in ids)
    assert ids.tolist() == [5, 6, 7, 151_643]
    assert 6 in ids and 8 not in ids
    # Equal to any sequence of the same ints, as a tuple of them would be (and hashed the same).
    same = (5, 6, 7, 151_643)
    assert ids == same and same == ids and ids == list(same)
    assert ids != (5, 6, 7) and ids != (5, 6, 7, 0)
    assert hash(ids) == hash((5, 6, 7, 151_643))
    assert ids == TokenIds(np.array([5, 6, 7, 151_643]))
    # Joined as the list or tuple it stands for.
    assert ids + [1] == [5, 6, 7, 151_643, 1] and [0] + ids == [0, 5, 6, 7, 151_643]  # noqa: RUF005
    assert ids[:1] + (9,) == (5, 9) and (9,) + ids[:1] == (9, 5)  # noqa: RUF005
    assert ids[:1] + ids[1:2] == TokenIds([5, 6])


def test_token_ids_cannot_be_changed_through_their_array_or_its_source() -> None:
    source = np.array([1, 2, 3], dtype=np.int32)
    ids = TokenIds(source)
    source[0] = 9  # the caller's array is not the one held
    assert ids == (1, 2, 3)
    with pytest.raises(ValueError):
        ids.array[0] = 9
    view = TokenIds(np.arange(10, dtype=np.int32)[2:5])
    assert view == (2, 3, 4) and not view.array.flags.writeable


def test_the_engine_request_takes_their_array_as_is() -> None:
    ids = TokenIds([1, 2, 3])
    assert int32_array(ids) is ids.array
    assert int32_array((1, 2, 3)).dtype == np.int32 and list(int32_array([1, 2, 3])) == [1, 2, 3]
    body = orjson.dumps({"input_ids": json_ids(ids)}, option=orjson.OPT_SERIALIZE_NUMPY)
    assert body == orjson.dumps({"input_ids": json_ids((1, 2, 3))}) == b'{"input_ids":[1,2,3]}'
