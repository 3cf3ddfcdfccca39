"""What is worked out once for an address array that recurs.

A WGMMA's operand addresses are one read-only array per matrix descriptor
(``ops.wgmma._operand_addresses``, cached), read by every instruction of a
pipeline: where they point (memory) and which shadow cells they cover (the
checker) need not be worked out again. :class:`Kept` holds such results by
the array itself: only read-only arrays take part (a writable one could
change under its result), and each is held by the entry, so its ``id()``
-- the key -- names it for as long as the entry lives (an id is reused
only after its object is freed).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np


def recurs(array: Any) -> bool:
    """Whether ``array`` may have results kept: a read-only numpy array."""
    return isinstance(array, np.ndarray) and not array.flags.writeable


class Kept:
    """Results kept per recurring address array and a ``key`` of what else
    they depend on, for the whole process (at most ``limit`` arrays: all
    dropped when one more comes). A result holds for the buffer the
    addresses lie in: it is kept with their range and that buffer's base,
    and handed out only where the space finds a buffer with the same base
    there -- each launch's buffers are new objects at the same addresses."""

    __slots__ = ("_entries", "_limit")

    def __init__(self, limit: int) -> None:
        self._entries: dict[int, tuple[np.ndarray, Hashable, tuple]] = {}
        self._limit = limit

    def get(self, array: np.ndarray, key: Hashable, space: Any, where: str
            ) -> tuple[Any, Any] | None:
        """(the buffer ``space`` holds at ``array``'s addresses, the result),
        or None. ``space.find`` raises where no buffer holds them now."""
        entry = self._entries.get(id(array))
        if entry is None or entry[0] is not array or entry[1] != key:
            return None
        lo, hi, base, value = entry[2]
        region = space.find(lo, hi, where)
        return (region, value) if region.base == base else None

    def put(self, array: np.ndarray, key: Hashable, lo: int, hi: int, region: Any,
            value: Any) -> None:
        """Keeps ``value``, the result for addresses [``lo``, ``hi``) of ``region``."""
        if len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[id(array)] = (array, key, (lo, hi, region.base, value))
