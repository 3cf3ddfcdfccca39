"""Stacks of register values, kept for the next run that takes them.

A run that runs as one step (:mod:`.fusion`'s loads, :mod:`.batching`'s
elementwise ops) computes one array of its results stacked on a run axis
and splits it into each op's register slot. The next run usually takes
exactly those slots, in that order (``exp`` of each register, then ``mul``
of each result): stacking them again costs more than the op itself. So the
producing step keeps its stack (:class:`Split`) under its result slots
(:class:`Splits`, one per block), and a consumer whose operand slots are
those takes the stack instead -- only while each slot still holds the very
array the split put there (checked by identity: a loop, a later write or a
different path gives a fresh stack)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Split:
    """The stack a step last split into its result slots (run axis first)."""

    __slots__ = ("stack", "values")

    def __init__(self) -> None:
        self.stack: np.ndarray | None = None
        self.values: tuple = ()

    def keep(self, stack: np.ndarray, values: Sequence) -> None:
        self.stack, self.values = stack, tuple(values)

    def stacked(self, regs: list, slots: Sequence[int]) -> np.ndarray | None:
        """The kept stack, if ``slots`` hold exactly the values split from it."""
        if self.stack is None:
            return None
        for s, v in zip(slots, self.values):
            if regs[s] is not v:
                return None
        return self.stack


class Splits:
    """A block's splits by their result slots (filled as its steps are made,
    looked up when they run: a consumer may come before its producer is made)."""

    __slots__ = ("_by_slots",)

    def __init__(self) -> None:
        self._by_slots: dict[tuple[int, ...], Split] = {}

    def made(self, slots: Sequence[int]) -> Split:
        """The split a step producing ``slots`` keeps."""
        split = self._by_slots[tuple(slots)] = Split()
        return split

    def stacked(self, regs: list, slots: tuple[int, ...]) -> np.ndarray | None:
        """The stack of the values in ``slots``, where a step split exactly those."""
        split = self._by_slots.get(slots)
        return None if split is None else split.stacked(regs, slots)
