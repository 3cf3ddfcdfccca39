"""Runtime values other than plain numpy arrays.

Registers are numpy arrays. A value with a leading thread axis (shape
``(T, *vector_shape)``) differs per thread; one without it (shape
``vector_shape``) is the same in every thread ("uniform"). LLVM aggregates are
tuples; memrefs are :class:`MemRef` descriptors (what MLIR's own lowering makes
of them: pointers, offset, sizes, strides)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

Int = Any  # a Python int, a 0-d numpy integer, or an int64 array with a thread axis


@dataclass(frozen=True)
class MemRef:
    """A strided memref: element (i0, i1, ...) lives at byte address
    ``aligned + (offset + sum(i_k * strides[k])) * itemsize`` of ``space``."""

    space: str
    dtype: np.dtype
    allocated: Int
    aligned: Int
    offset: Int
    sizes: tuple
    strides: tuple

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def with_(self, **kw: Any) -> MemRef:
        return replace(self, **kw)

    def as_struct(self) -> tuple:
        return (self.allocated, self.aligned, self.offset, tuple(self.sizes), tuple(self.strides))


@dataclass(frozen=True)
class Bundle:
    """A Warpgroup-level vector that only exists as the registers it was cast
    from (``unrealized_conversion_cast`` of per-thread vectors to a big vector
    with a layout attribute). Only the inverse cast may read it."""

    parts: tuple
    layout: str


class Undef:
    """``llvm.mlir.undef``/``poison`` of an aggregate, before it is filled."""

    def __repr__(self) -> str:
        return "undef"


UNDEF = Undef()


def insert(agg: Any, pos: tuple[int, ...], value: Any) -> tuple:
    items = [] if agg is UNDEF or agg is None else list(agg)
    while len(items) <= pos[0]:
        items.append(UNDEF)
    items[pos[0]] = value if len(pos) == 1 else insert(items[pos[0]], pos[1:], value)
    return tuple(items)


def extract(agg: Any, pos: tuple[int, ...]) -> Any:
    """The field at ``pos``; :data:`UNDEF` if no insert reached it."""
    for p in pos:
        if agg is UNDEF or agg is None or p >= len(agg):
            return UNDEF
        agg = agg[p]
    return agg


def lead(x: Any, vrank: int) -> int:
    """1 when ``x`` has a thread axis, 0 when it is uniform."""
    return np.ndim(x) - vrank
