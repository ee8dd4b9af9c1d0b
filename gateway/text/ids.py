"""`TokenIds`: a long prompt's token ids as one int32 array, behind the sequence interface.

A 62k-token prompt as Python ints is 62k objects: joining its cached pieces, copying it into a
tuple, into a numpy array for the gRPC tensor or a list for the HTTP body, and packing it again
for prefix hashing each walked all of them (about 4 ms per request together). As one array, each
of those is a memcpy: the encoder joins its pieces' arrays, the Triton request takes the bytes,
the JSON body serializes the array, the prefix hashes read it as bytes. Code that only wants a
sequence of ints (counting, slicing, comparing) still gets one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt


class TokenIds(Sequence[int]):
    """An immutable sequence of token ids over a read-only int32 array (`array`). Equal to any
    sequence of the same ints (a tuple or list of them too, as a tuple of ids would compare)."""

    __slots__ = ("array",)

    def __init__(self, ids: npt.ArrayLike) -> None:
        array = np.ascontiguousarray(ids, dtype=np.int32).reshape(-1)
        if array.flags.writeable:
            if array is ids or array.base is not None:
                array = array.copy()  # never a view of something its owner can still change
            array.flags.writeable = False
        self.array: npt.NDArray[np.int32] = array

    def __len__(self) -> int:
        return int(self.array.shape[0])

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> TokenIds: ...

    def __getitem__(self, index: int | slice) -> int | TokenIds:
        if isinstance(index, slice):
            return TokenIds(self.array[index])
        return int(self.array[index])

    def __iter__(self) -> Iterator[int]:
        return iter(self.array.tolist())

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and bool((self.array == value).any())

    def __add__(self, other: Sequence[int]) -> Any:
        # As the sequence it stands for: joined with a list, a list; with a tuple, a tuple.
        if isinstance(other, TokenIds):
            return TokenIds(np.concatenate([self.array, other.array]))
        if isinstance(other, list):
            return self.tolist() + other
        if isinstance(other, tuple):
            return tuple(self.tolist()) + other
        return NotImplemented

    def __radd__(self, other: Sequence[int]) -> Any:
        if isinstance(other, list):
            return other + self.tolist()
        if isinstance(other, tuple):
            return other + tuple(self.tolist())
        return NotImplemented

    def tolist(self) -> list[int]:
        return list(self.array.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return bool(np.array_equal(self.array, other.array))
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and self.array.tolist() == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self.array.tolist()))

    def __repr__(self) -> str:
        return f"TokenIds({self.array.tolist()!r})"


def int32_array(ids: Sequence[int]) -> npt.NDArray[np.int32]:
    """`ids` as an int32 array: a TokenIds' own (no copy), else converted."""
    if isinstance(ids, TokenIds):
        return ids.array
    return np.asarray(ids, dtype=np.int32)


def json_ids(ids: Sequence[int]) -> Any:
    """`ids` as a JSON body takes them (orjson writes a numpy array with OPT_SERIALIZE_NUMPY)."""
    return ids.array if isinstance(ids, TokenIds) else list(ids)
