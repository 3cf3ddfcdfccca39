"""Fusing runs of memory accesses into one access.

A layout's register tile reaches memory one register at a time: a (128, 128)
f32 block in WGMMA's layout is 64 ``vector.load``\\ s or ``vector.store``\\ s
(or ``llvm.load``/``llvm.store`` through pointers) of ``vector<2xf32>``,
and a tile of 16-bit elements in swizzled SMEM moves by ``ldmatrix`` and
``stmatrix``, four 8x8 matrices per instruction, each after a few lines of
address arithmetic. Each access costs the emulator a fixed price (addresses,
the buffer, the checker's shadow) far above its few elements, so such a run
runs as one access of all its elements, at the place of its last access.

A step that can run so carries a :class:`Fusable` (``step.fusable``): what
must be equal for two accesses to fuse (``fusion_key``: the kind, the
buffer or state space, the vector type, the op site) and how to run a run of
them as one step. A run is fused only where that changes nothing
observable:

* its accesses agree on ``fusion_key``, so they are of one kind, to one
  buffer, from one source line (a report names the same op and line either
  way);
* between them are only pure ops (:func:`.liveness.is_pure`: arithmetic,
  constants, casts, address computations, register moves), which touch no
  memory, and none whose rule refused it (its error comes where it would
  have);
* no access of the run uses a value a load of the run produced, directly
  or through the ops between;
* the module is not being profiled (the profiler counts each instruction).

Nothing between the first access and the last can synchronize, so the
checker sees every element at the same clocks as it would have access by
access; a store's values are read when the run ends, as SSA values they
are unchanged since their stores' places. Pure ops between that use a
loaded value (the ``extractvalue``\\ s taking an ``ldmatrix``'s registers
apart) run right after the fused access, in their order: they depend on
nothing else that moved, and nothing that stays in place depends on them.
The WGMMA accumulator guards (:meth:`.compiler.Compiler.finish`) stay at
the ops' places, so a moved op's operands are still checked where it was.

How each access kind stacks a run is its rule's: vector accesses here
(:class:`VectorAccess`), ``ldmatrix``/``stmatrix`` in :mod:`.ops.nvvm`."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from .liveness import is_pure
from .machine import Frame
from .stacks import Splits

Step = Callable[[Frame], None]


class Fusable(Protocol):
    """What :func:`fuse` needs of a step that can run with its neighbours."""

    @property
    def fusion_key(self) -> Hashable:
        """Equal for accesses that may fuse (kind, buffer, shape, site)."""

    def fused(self, run: Sequence[Any], alone: Sequence[Step], splits: Splits) -> Step:
        """One step doing the accesses of ``run`` (this one's kind, in program
        order) at once; ``alone``: each one's own step, for a run that cannot
        go as one this time; ``splits``: the block's stacked values
        (:mod:`.stacks`), to keep loaded ones in and take stored ones from."""


class Entry(NamedTuple):
    """One op of a block as :func:`fuse` sees it."""

    name: str
    ins: Sequence[int]  # operand slots
    outs: Sequence[int]  # result slots
    step: Step


def fuse(entries: Sequence[Entry], steps: list[Step], splits: Splits) -> None:
    """Replaces, in ``steps`` (one per entry), each fusable run: its accesses
    but the last, and the ops that wait for its loads, by nothing; the last
    by the run's one access followed by those ops. Stacked loaded values are
    kept in ``splits`` (:mod:`.stacks`), and stores take theirs from there."""
    k = 0
    while k < len(entries):
        first = _fusable(entries[k].step)
        if first is None:
            k += 1
            continue
        members, waiting = [k], []
        produced = set(entries[k].outs)  # the run's loaded values, and what is made of them
        j = k + 1
        while j < len(entries):
            name, ins, outs, step = entries[j]
            access = _fusable(step)
            uses = not produced.isdisjoint(ins)
            if access is not None and access.fusion_key == first.fusion_key and not uses:
                members.append(j)
                produced.update(outs)
            elif access is None and is_pure(name) and not hasattr(step, "refused"):
                if uses:
                    waiting.append(j)
                    produced.update(outs)
            else:
                break
            j += 1
        if len(members) == 1:
            k += 1
            continue
        last = members[-1]
        moved = [steps[m] for m in waiting if m < last]
        for m in members[:-1] + [m for m in waiting if m < last]:
            steps[m] = nothing
        one = first.fused([entries[m].step.fusable for m in members],  # type: ignore[attr-defined]
                          [entries[m].step for m in members], splits)
        steps[last] = _then(one, moved) if moved else one
        k = last + 1


def _fusable(step: Step) -> Fusable | None:
    return getattr(step, "fusable", None)


def nothing(fr: Frame) -> None:
    """A step done by its run's last one (:func:`fuse`, :func:`.batching.batch`)."""


def _then(access: Step, moved: list[Step]) -> Step:
    """The fused ``access``, then the ops that waited for its values."""
    def step(fr: Frame) -> None:
        access(fr)
        for s in moved:
            s(fr)
    return step


# --- vector.load/store, llvm.load/store ----------------------------------------------------

@dataclass(frozen=True)
class VectorAccess:
    """A vector load or store, for fusing: what must be the same for two
    accesses to fuse (``key``: the memref's slot, or the state space and
    element type of a pointer's), its index slots (a pointer's: the
    pointer), its vector shape, the slot it loads into or stores from, and
    its site."""

    is_store: bool
    key: Any
    idx: tuple[int, ...]
    vshape: tuple[int, ...]
    value: int
    site: Any
    loc: str
    # ``run(fr, addrs, values)``: the access itself, given every thread's
    # addresses and, for a store, the values
    run: Callable[..., Any]
    # ``addresses(fr, indices, uniform)``: the element addresses at
    # ``indices`` (one (threads, run) array per index; a pointer's:
    # pointers), (threads, run, *vector); with ``uniform``, indices of
    # (run,) the same in every thread, and (run, *vector) addresses, or None
    # where the buffer's place differs by thread
    addresses: Callable[..., np.ndarray | None]

    @property
    def fusion_key(self) -> Hashable:
        return ("vector", self.is_store, self.key, self.vshape, self.site)

    def fused(self, accesses: Sequence[VectorAccess], alone: Sequence[Step],
              splits: Splits) -> Step:
        """The run's one access: the indices of every access stacked, the
        addresses computed once with the run on an axis before the
        vector's, one access of them all, the loaded values handed to each
        load's result. Loads at the same place in every thread (a kernel
        argument, a pointer) give the same value in every thread: they run
        as one where all threads run, else one by one."""
        slots = list(zip(*(a.idx for a in accesses)))  # per index position: each access's slot
        value_slots = tuple(a.value for a in accesses)

        def addresses(fr: Frame) -> Any:  # (threads, run, *vector)
            indices = [_stacked([fr.regs[s] for s in col], (fr.T,)) for col in slots]
            return self.addresses(fr, indices)

        if self.is_store:
            def store(fr: Frame) -> None:
                self.run(fr, addresses(fr), self._stored(fr, value_slots, splits))
            return store

        split = splits.made(value_slots)

        def load(fr: Frame) -> None:
            r = fr.regs
            if all(np.ndim(r[s]) == 0 for col in slots for s in col):
                indices = [np.array([r[s] for s in col], np.int64) for col in slots]
                addrs = None if fr.mask is not None else self.addresses(fr, indices, True)
                if addrs is None:
                    for one in alone:
                        one(fr)
                    return
                stack = self.run(fr, addrs, None)  # (run, *vector)
            else:
                stack = np.moveaxis(self.run(fr, addresses(fr), None), 1, 0)
            values = list(stack)
            for slot, v in zip(value_slots, values):
                r[slot] = v
            split.keep(stack, values)
        return load

    def _stored(self, fr: Frame, value_slots: tuple[int, ...], splits: Splits) -> np.ndarray:
        """A store run's values, (threads, run, *vector): a stack a run split
        into those slots where there is one, else stacked now."""
        full = (fr.T,) + self.vshape
        stack = splits.stacked(fr.regs, value_slots)  # (run, [threads,] *vector)
        if stack is None:
            return np.stack([_per_thread(fr.regs[s], full) for s in value_slots], axis=1)
        if stack.ndim == len(full) + 1:
            return np.moveaxis(stack, 0, 1)
        return np.broadcast_to(stack, (fr.T,) + stack.shape)


def _stacked(values: list, shape: tuple[int]) -> np.ndarray:
    """The run's values of one index, (threads, run) -- thread-major, as the
    memory and the checker take addresses --: stacked as they are where all
    are per thread (or all the same in every thread), each broadcast to
    every thread first where they are mixed."""
    arrays = [np.asarray(v, np.int64) for v in values]
    if all(a.shape == shape for a in arrays):
        return np.stack(arrays, axis=1)
    if all(a.ndim == 0 for a in arrays):
        return np.broadcast_to(np.array(arrays), shape + (len(arrays),))
    return np.stack([np.broadcast_to(a, shape) for a in arrays], axis=1)


def _per_thread(value: Any, full: tuple[int, ...]) -> np.ndarray:
    """``value`` as every thread's (``full``): itself where it already is."""
    value = np.asarray(value)
    return value if value.shape == full else np.broadcast_to(value, full)
