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
    """Results kept per recurring array and a ``key`` of what else they
    depend on; :meth:`clear` when anything they read changes. ``limit``:
    at most that many arrays held (all dropped when one more comes), for
    results kept for the whole process."""

    __slots__ = ("_entries", "_limit")

    def __init__(self, limit: int | None = None) -> None:
        self._entries: dict[int, tuple[np.ndarray, Hashable, Any]] = {}
        self._limit = limit

    def get(self, array: np.ndarray, key: Hashable) -> Any | None:
        entry = self._entries.get(id(array))
        if entry is None or entry[0] is not array or entry[1] != key:
            return None
        return entry[2]

    def put(self, array: np.ndarray, key: Hashable, value: Any) -> None:
        if self._limit is not None and len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[id(array)] = (array, key, value)

    def clear(self) -> None:
        self._entries.clear()
