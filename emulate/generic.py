"""Generic addressing: PTX's generic state space as windows over the others.

A generic address (an ``!llvm.ptr``, a memref without a memory space) lies in
one of the windows the PTX ISA defines, and an access through it is the
access to the location the window maps it to:

* the **shared window** is every address from ``1 << 40`` up: the
  shared::cluster addresses themselves (:func:`.memory.cluster_address`, the
  CTA rank plus one above bit 40 over the block's SMEM address). The window
  of the block's own rank is its **shared::cta window**. So ``cvta.shared``
  (``addrspacecast`` 3 -> 0) of SMEM address ``a`` in the block of rank ``r``
  is ``cluster_address(r, a)``; ``cvta.shared::cluster`` (7 -> 0) is the
  identity, and ``mapa`` followed by a cast to generic lands in the peer's
  SMEM. A generic address of another rank is reached through ``cluster``
  (the peer's SMEM); one of the block's own rank through its ``shared``
  space, so the checker sees the same bytes whichever way they are reached.
* everything below ``1 << 40`` is the **global window**: global addresses are
  generic addresses (1 <-> 0 is the identity), and so is the **local window**
  -- per-thread ``alloca``s live in the global space's address range
  (5 <-> 0 is the identity too).

Casting into a window (0 -> 3, 0 -> 7, 0 -> 1) an address an active thread
holds outside it is undefined in PTX: :class:`.errors.EmulationError`, naming
the op, the address and the window. An access through a generic pointer is
split per thread by window (:func:`spaces`); a thread whose elements straddle
a window's edge is :class:`.sync.reports.OutOfBounds`, and an address in no
buffer of its window is the space's own out-of-bounds error. Other address
spaces (constant, TMEM) have no generic window here: :class:`Unsupported`."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .errors import EmulationError, Unsupported
from .memory import CLUSTER_SHIFT, _full_mask
from .sync.reports import OutOfBounds

#: the first generic address of the shared window
SHARED_WINDOW = 1 << CLUSTER_SHIFT
_LOW = SHARED_WINDOW - 1
FRAME_MASK = object()  # spaces(): the frame's active threads

GENERIC, GLOBAL, SHARED, LOCAL, CLUSTER = 0, 1, 3, 5, 7
#: LLVM address spaces with a generic window, by number
WINDOWS = {GLOBAL: "global", SHARED: "shared::cta", LOCAL: "local", CLUSTER: "shared::cluster"}


def address_space(type_text: str) -> int:
    """The LLVM address space number of an ``!llvm.ptr`` type's text."""
    m = re.fullmatch(r"!llvm\.ptr(?:<(\d+)>)?", type_text)
    if m is None:
        raise Unsupported(f"pointer type {type_text}")
    return int(m.group(1) or 0)


def _active(a: np.ndarray, mask) -> np.ndarray:
    """The addresses of the active threads (every one of a uniform pointer)."""
    if mask is None or a.ndim == 0:
        return a.reshape(-1)
    return a[_full_mask(np.asarray(mask), a.shape)]


def _rank(fr, what: str, where: str) -> tuple[int, int]:
    """(this block's CTA rank, its cluster's size)."""
    b = fr.need_block(what, where)
    return b.rank, b.cluster.size


def cast(fr, addr, src: int, dst: int, what: str, where: str) -> np.ndarray:
    """``addr`` of address space ``src`` as an address of ``dst``, through
    the generic space, checked for the active threads as the module
    docstring says (both spaces are GENERIC or in WINDOWS)."""
    a = np.asarray(addr, np.int64)
    if src == SHARED:  # this block's shared::cta window
        rank, _ = _rank(fr, what, where)
        a = ((rank + 1) << CLUSTER_SHIFT) | a
    if dst == GENERIC:
        return a
    act = _active(a, fr.mask)
    in_shared = act >= SHARED_WINDOW
    if dst in (GLOBAL, LOCAL):
        bad = act[in_shared]
    else:
        rank, size = _rank(fr, what, where)
        r = (act >> CLUSTER_SHIFT) - 1
        bad = act[~in_shared | ((r != rank) if dst == SHARED else (r >= size))]
    if bad.size:
        raise EmulationError(
            f"{what}: generic address {int(bad[0]):#x} is outside the {WINDOWS[dst]} window "
            f"(undefined in PTX) at {where}")
    return a & _LOW if dst == SHARED else a


def spaces(fr, space_name: str, addrs, vrank: int, where: str, op: str = "an access",
           mask: Any = FRAME_MASK):
    """The parts of an access at ``addrs`` (per thread, or the same in each:
    ``vrank`` trailing dims) of space ``space_name``: ``(space name,
    addresses in it, mask of the threads that access it)``, one per space the
    active threads reach. Only generic (``global``) accesses are split; the
    common one below the shared window comes back as it was, with the
    frame's mask (or ``mask``, per thread, where the access has its own).
    ``op`` names the access in errors."""
    if mask is FRAME_MASK:
        mask = fr.mask
    a = np.asarray(addrs, np.int64)
    if space_name != "global" or a.size == 0 or int(a.max()) < SHARED_WINDOW:
        return ((space_name, a, mask),)
    act = _active(a, mask)
    if act.size == 0 or int(act.max()) < SHARED_WINDOW:
        return (("global", a, mask),)
    rank, size = _rank(fr, f"{op} through a generic pointer into shared memory", where)
    peer = (a >> CLUSTER_SHIFT) - 1
    # 0: global window, 1: this block's shared::cta window, 2: a peer's SMEM
    kind = np.where(a < SHARED_WINDOW, 0, np.where(peer == rank, 1, 2))
    per_thread = a.ndim > vrank
    each = kind.reshape(a.shape[0], -1) if per_thread else kind.reshape(1, -1)
    if np.any(each != each[:, :1]):  # judged on active threads below
        lead = each[:, 0:1]
        mixed = np.any(each != lead, axis=1)
        if mask is not None and per_thread:
            mixed &= np.asarray(mask, bool)
        if mixed.any():
            raise OutOfBounds(f"{op} through a generic pointer straddles the edge of the "
                              f"shared window (addresses {int(a.min()):#x} to {int(a.max()):#x}) "
                              f"at {where}")
    thread_kind = each[:, 0]
    bad = _active(np.where(kind == 2, peer, 0), mask)
    if np.any((bad < 0) | (bad >= size)):
        k = int(bad[(bad < 0) | (bad >= size)][0])
        raise OutOfBounds(f"{op} through a generic pointer into the shared window of CTA "
                          f"rank {k}, in no window: the cluster has {size} block(s) (only "
                          f"cvta/mapa results are modelled) at {where}")
    windows = ((0, "global", a), (1, "shared", a & _LOW), (2, "cluster", a))
    if not per_thread:
        k = int(thread_kind[0])
        return ((windows[k][1], windows[k][2], mask),)
    active = np.ones(a.shape[0], bool) if mask is None else np.asarray(mask, bool)
    parts = []
    for k, name, conv in windows:
        m = (thread_kind == k) & active
        if np.array_equal(m, active):  # every active thread: no split
            return ((name, conv, mask),)
        if m.any():
            parts.append((name, conv, m))
    return tuple(parts)


def merge(out, part: np.ndarray, mask) -> np.ndarray:
    """A load's values: ``part`` where ``mask`` (per thread) holds, else ``out``."""
    if out is None:
        return part
    return np.where(_full_mask(np.asarray(mask), np.shape(part)), part, out)
