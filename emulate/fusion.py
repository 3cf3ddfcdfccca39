"""Fusing runs of vector accesses into one access.

A layout's register tile reaches memory as one ``vector.load`` or
``vector.store`` (or ``llvm.load``/``llvm.store`` through a pointer) per
register: a (128, 128) f32 block in WGMMA's layout is 64 loads of
``vector<2xf32>``, each after a line or two of index arithmetic. Each
access costs the emulator a fixed price (addresses, the buffer, the
checker's shadow) far above its few elements, so such a run runs as one
access of all its elements, at the place of its last access.

A run is fused only where that changes nothing observable:

* its accesses are of one kind (all loads or all stores), of one memref
  value (or, through pointers, one state space and element type), one
  vector type and one op site (the same source line: a report names the
  same op and line either way);
* between them are only pure ops (:func:`.liveness.is_pure`: arithmetic,
  constants, casts, address computations), which touch no memory, and no
  op of the run uses a value one of its loads produced (the loads are done
  last);
* the module is not being profiled (the profiler counts each instruction).

Nothing between the first access and the last can synchronize, so the
checker sees every element at the same clocks as it would have access by
access; a store's values are read when the run ends, as SSA values they
are unchanged since their stores' places. The indices are stacked on a new
leading axis, each broadcast to every thread where they are mixed, so the
addresses are one computation too (a loaded value is then held per thread
even where its index was the same in every thread)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .liveness import is_pure
from .machine import Frame

Step = Callable[[Frame], None]


@dataclass(frozen=True)
class VectorAccess:
    """What a load or store step does, for fusing: what must be the same
    for two accesses to fuse (``key``: the memref's slot, or the state space
    and element type of a pointer's), its index slots (a pointer's: the
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
    # ``addresses(fr, indices)``: the element addresses at ``indices`` (one
    # array per index, of any shape that broadcasts; a pointer's: pointers)
    addresses: Callable[[Frame, list], np.ndarray]


def fuse(entries: Sequence[tuple[str, Sequence[int], Step]], steps: list[Step]) -> None:
    """Replaces, in ``steps`` (one per entry: op name, operand slots, step),
    each fusable run's accesses: all but the last by nothing, the last by the
    run's one access."""
    k = 0
    while k < len(entries):
        first = getattr(entries[k][2], "vector_access", None)
        if first is None:
            k += 1
            continue
        members = [k]
        produced: set[int] = set() if first.is_store else {first.value}
        j = k + 1
        while j < len(entries):
            name, ins, step = entries[j]
            access = getattr(step, "vector_access", None)
            if access is not None and _same_run(first, access) and produced.isdisjoint(ins):
                members.append(j)
                if not access.is_store:
                    produced.add(access.value)
            elif access is None and is_pure(name) and produced.isdisjoint(ins):
                pass
            else:
                break
            j += 1
        if len(members) > 1:
            accesses = [entries[m][2].vector_access for m in members]  # type: ignore[attr-defined]
            for m in members[:-1]:
                steps[m] = _nothing
            steps[members[-1]] = _fused(accesses)
        k = j if len(members) > 1 else k + 1


def _same_run(a: VectorAccess, b: VectorAccess) -> bool:
    return (a.is_store == b.is_store and a.key == b.key and a.vshape == b.vshape
            and a.site == b.site)


def _nothing(fr: Frame) -> None:
    """An access done by its run's last one (:func:`fuse`)."""


def _fused(accesses: list[VectorAccess]) -> Step:
    """The run's one access: the indices of every access stacked, the
    addresses computed once with the run on an axis before the vector's,
    one access of them all, the loaded values handed to each load's result."""
    first = accesses[0]
    slots = list(zip(*(a.idx for a in accesses)))  # per index position: each access's slot

    def step(fr: Frame) -> None:
        r, shape = fr.regs, (fr.T,)
        indices = [_stacked([r[s] for s in col], shape) for col in slots]
        addrs = np.moveaxis(first.addresses(fr, indices), 0, 1)  # (threads, run, *vector)
        if first.is_store:
            full = shape + first.vshape
            values = np.stack([_per_thread(r[a.value], full) for a in accesses], axis=1)
            first.run(fr, addrs, values)
            return
        got = first.run(fr, addrs, None)
        for i, a in enumerate(accesses):
            r[a.value] = got[:, i]
    return step


def _stacked(values: list, shape: tuple[int]) -> np.ndarray:
    """The run's values of one index, (run, threads): stacked as they are
    where all are per thread (or all the same in every thread), each
    broadcast to every thread first where they are mixed."""
    arrays = [np.asarray(v, np.int64) for v in values]
    if all(a.shape == shape for a in arrays):
        return np.stack(arrays)
    if all(a.ndim == 0 for a in arrays):
        return np.broadcast_to(np.array(arrays)[:, None], (len(arrays),) + shape)
    return np.stack([np.broadcast_to(a, shape) for a in arrays])


def _per_thread(value: Any, full: tuple[int, ...]) -> np.ndarray:
    """``value`` as every thread's (``full``): itself where it already is."""
    value = np.asarray(value)
    return value if value.shape == full else np.broadcast_to(value, full)
