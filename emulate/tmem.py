"""Tensor memory (TMEM): Blackwell's per-CTA memory of the tensor cores.

Each block has 128 lanes x 512 columns of 32-bit cells (PTX ISA, "Tensor
Memory"). A TMEM address is 32 bits: the lane in bits 31-16, the column in
bits 15-0. The emulator keeps a block's TMEM as one byte buffer (a
:class:`..memory.Region` of a space of its own, ``"tmem"``), cell
``(lane, col)`` at byte ``4 * (512 * lane + col)``, so the synchronization
checker shadows it like SMEM and reports races on it with space ``"tmem"``.

**Allocation** (``tcgen05.alloc/dealloc/relinquish_alloc_permit``, issued by
one whole warp): ``nCols`` must be a power of 2 in [32, 512]; the columns are
taken first-fit at a multiple of ``nCols`` (the PTX ISA leaves the placement
to the hardware; kernels read the address ``alloc`` writes to SMEM, so any
placement is one the hardware may choose), all 128 lanes. ``dealloc`` frees
exactly what one ``alloc`` took (same start column and count). After
``relinquish_alloc_permit`` the block may not allocate again. TMEM still
allocated when the block exits, an allocation beyond the 512 columns (which
would block forever: no other block shares the emulated SM), and any access
to columns not allocated are :class:`TmemError` s.

**Lane access.** Warp ``w`` of the block reaches only lanes
``32 (w mod 4)`` to ``32 (w mod 4) + 31`` with ``tcgen05.ld``/``st``; any
other lane is a :class:`TmemError` naming the op. The address's lane field
names a lane of that slab either absolutely (lane ``32 (w mod 4) + x``, as
CUTLASS computes it) or relative to the slab (lane ``x < 32``: jax gives
every warp the same lane-0 address, and its kernels run on the hardware);
a field naming another warp's slab is the error.

**Fragments** of ``tcgen05.ld``/``st`` (PTX ISA "Matrix fragments", one
repetition of ``.num``; lane ``l`` of the warp, register ``r``):

* ``32x32b``: 32 lanes x 1 column: register r of lane l is cell (l, r);
* ``16x64b``: 16 lanes x 2 columns: (l//4 + 8 (l%2), (l//2)%2 + 2r);
* ``16x128b``: 16 lanes x 4 columns: (l//4 + 8 (r%2), l%4 + 4 (r//2));
* ``16x256b``: 16 lanes x 8 columns: (l//4 + 8 ((r//2)%2), r%2 + 2 (l%4) + 8 (r//4)).

With ``.pack::16b`` (loads) a register holds the low halves of two adjacent
cells (the lower column in its low 16 bits); with ``.unpack::16b`` (stores)
the halves of a register go to the low halves of two adjacent cells, whose
high halves become 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import EmulationError
from .memory import Space

LANES, COLUMNS = 128, 512
CELL = 4  # bytes
WARP_LANES = 32

#: shape -> (lanes, columns per repetition, registers per repetition)
SHAPES = {"32x32b": (32, 1, 1), "16x64b": (16, 2, 1), "16x128b": (16, 4, 2),
          "16x256b": (16, 8, 4)}


class TmemError(EmulationError):
    """A TMEM misuse the GPU does not forgive: an access outside the warp's
    lanes or the allocated columns, an allocation that cannot be satisfied, an
    unmatched deallocation, TMEM left allocated at exit."""


def split(taddr) -> tuple[np.ndarray, np.ndarray]:
    """(lane, column) of TMEM addresses."""
    a = np.asarray(taddr, np.int64) & 0xFFFFFFFF
    return a >> 16, a & 0xFFFF


@dataclass(frozen=True)
class Fragment:
    """The cells one ``tcgen05.ld``/``st`` of a shape and repetition count
    touches: ``lane[l, r]``, ``col[l, r]`` relative to the address, for lane
    ``l`` of the warp and its register ``r``."""

    lanes: int  # lanes the warp touches from the address's lane
    lane: np.ndarray  # (32, regs)
    col: np.ndarray  # (32, regs)


def fragment(shape: str, num: int) -> Fragment:
    lanes, _, regs = SHAPES[shape]
    lane = np.arange(WARP_LANES)[:, None]
    r = np.arange(regs * num)[None, :]
    if shape == "32x32b":
        row, col = lane + 0 * r, r + 0 * lane
    elif shape == "16x64b":
        row, col = lane // 4 + 8 * (lane % 2) + 0 * r, (lane // 2) % 2 + 2 * r
    elif shape == "16x128b":
        row, col = lane // 4 + 8 * (r % 2), lane % 4 + 4 * (r // 2)
    else:  # 16x256b
        row, col = lane // 4 + 8 * ((r // 2) % 2), r % 2 + 2 * (lane % 4) + 8 * (r // 4)
    return Fragment(lanes, row.astype(np.int64), col.astype(np.int64))


class TensorMemory:
    """One block's TMEM: its cells and its column allocations."""

    def __init__(self, block_name: str) -> None:
        self.name = block_name
        self.space = Space("tmem", 0)
        self.region = self.space.alloc(LANES * COLUMNS * CELL, f"{block_name} TMEM")
        self.region.tracked = True  # the checker shadows it
        self.cells = self.region.data[:LANES * COLUMNS * CELL].view(np.uint32).reshape(
            LANES, COLUMNS)
        self.allocations: dict[int, tuple[int, str]] = {}  # first column -> (ncols, where)
        self.relinquished: str | None = None  # where the permit was given up

    # --- allocation ---------------------------------------------------------------------

    def alloc(self, ncols: int, op: str, where: str) -> int:
        """Allocates ``ncols`` columns; the TMEM address of their first cell."""
        if ncols < 32 or ncols > COLUMNS or ncols & (ncols - 1):
            raise TmemError(f"{op} of {ncols} columns at {where}: the column count must be a "
                            "power of 2 from 32 to 512; fix: round the TMEM allocation up "
                            "(plgpu.TMEM shapes are rounded for you)")
        if self.relinquished is not None:
            raise TmemError(f"{op} at {where} after tcgen05.relinquish_alloc_permit at "
                            f"{self.relinquished}: a block may not allocate TMEM once it gave "
                            "up its permit; fix: allocate everything before relinquishing")
        used = np.zeros(COLUMNS, bool)
        for first, (n, _) in self.allocations.items():
            used[first:first + n] = True
        for first in range(0, COLUMNS, ncols):
            if not used[first:first + ncols].any():
                self.allocations[first] = (ncols, where)
                return first
        held = ", ".join(f"[{f}, {f + n}) at {w}" for f, (n, w) in sorted(self.allocations.items()))
        raise TmemError(f"{op} of {ncols} columns at {where}: {self.name} has no {ncols} free "
                        f"columns (held: {held}); on the GPU it would wait forever; fix: "
                        "deallocate first, or allocate fewer columns (512 per block)")

    def dealloc(self, taddr: int, ncols: int, op: str, where: str) -> None:
        lane, col = (int(x) for x in split(taddr))
        got = self.allocations.get(col)
        if lane != 0 or got is None or got[0] != ncols:
            held = ", ".join(f"{n} columns at column {f}" for f, (n, _) in
                             sorted(self.allocations.items())) or "nothing"
            raise TmemError(f"{op} of {ncols} columns at TMEM address {int(taddr):#x} (lane "
                            f"{lane}, column {col}) at {where}, which no tcgen05.alloc "
                            f"returned (allocated: {held}); fix: deallocate the address and "
                            "column count that tcgen05.alloc gave")
        del self.allocations[col]

    def relinquish(self, where: str) -> None:
        if self.relinquished is None:
            self.relinquished = where

    def check_released(self) -> None:
        """At the block's exit: everything allocated must have been freed."""
        if self.allocations:
            held = ", ".join(f"{n} columns at column {f} (allocated at {w})"
                             for f, (n, w) in sorted(self.allocations.items()))
            raise TmemError(f"{self.name} exited with TMEM still allocated: {held}; fix: "
                            "tcgen05.dealloc every allocation before the kernel ends")

    # --- access ---------------------------------------------------------------------------

    def check_columns(self, cols: np.ndarray, op: str, where: str) -> None:
        """Every column in ``cols`` must be allocated."""
        lo, hi = int(cols.min()), int(cols.max())
        if hi >= COLUMNS:
            raise TmemError(f"{op} at {where} reaches TMEM column {hi} (there are {COLUMNS})")
        for first, (n, _) in self.allocations.items():
            if first <= lo and hi < first + n:
                return
        ok = np.zeros(COLUMNS, bool)
        for first, (n, _) in self.allocations.items():
            ok[first:first + n] = True
        bad = np.unique(cols[~ok[cols]])
        if bad.size:
            raise TmemError(f"{op} at {where} reaches TMEM columns {bad[0]}..{bad[-1]} that "
                            "are not allocated; fix: tcgen05.alloc them first (or keep the "
                            "access inside the plgpu.TMEM ref)")

    @staticmethod
    def warp_lanes(warp: int, lane: int, lanes: int, op: str, where: str) -> int:
        """The first TMEM lane warp ``warp`` (of the block) reaches with an
        address whose lane field is ``lane``, touching ``lanes`` lanes: warp w
        reaches lanes 32 (w mod 4) .. +31 only. The field names a lane of the
        warp's own slab, either absolutely (CUTLASS's addresses) or relative
        to it (jax's: every warp gives lane 0, and the hardware runs them)."""
        lo = WARP_LANES * (warp % 4)
        slab, within = divmod(lane, WARP_LANES)
        if slab not in (0, warp % 4) or within + lanes > WARP_LANES:
            raise TmemError(f"{op} at {where}: warp {warp} addresses TMEM lanes {lane} to "
                            f"{lane + lanes - 1}, but warp w of a warpgroup may access only "
                            f"lanes 32*(w%4) to 32*(w%4)+31 ({lo} to {lo + 31} here); fix: give "
                            "each warp an address in its own 32-lane slab")
        return lo + within

    def byte_addresses(self, lanes: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Byte addresses of cells in the TMEM region (what the checker shadows)."""
        return self.region.base + CELL * (COLUMNS * lanes + cols)


def of_block(block) -> TensorMemory:
    """The TMEM of ``block`` (made on first use; kept by its cluster, which all
    of the block's warpgroup views share)."""
    store = block.cluster.__dict__.setdefault("tmem", {})
    t = store.get(block.rank)
    if t is None:
        t = store[block.rank] = TensorMemory(f"block {block.block_id}")
    return t


def check_released(cluster) -> None:
    """Every block of ``cluster`` freed its TMEM (called when the cluster ends)."""
    for t in cluster.__dict__.get("tmem", {}).values():
        t.check_released()
