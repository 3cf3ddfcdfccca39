"""Sparse ``tcgen05.mma.sp``: A's metadata in TMEM, and A decompressed by it.
:mod:`.tcgen05` issues the MMA with these.

**Sparsity.** A is 2:4 sparse (kind::f16, f8f6f4, i8, mxf8f6f4): each group of
4 logical K elements of a row holds 2 stored ones, so an instruction reads 32
bytes of each A row (its SMEM descriptor or TMEM as dense) and 64 bytes of
each B row (twice the dense K). A group's two metadata entries (2 bits each,
the first in the lower bits) are the logical positions of its two stored
elements, the first below the second (PTX ISA: the valid codes 0b0100,
0b1000, 0b1100, 0b1001, 0b1101, 0b1110); any other pair is an error, as the
PTX ISA leaves its result undefined. The e2m1 kinds (mxf4, mxf4nvf4) are 4:8
*pair-wise* sparse: each group of 8 logical elements is 4 pairs of adjacent
elements, of which 2 are stored, and a group's two entries are the positions
of its two stored pairs, with the same codes (:func:`pair_elements`; the
stored pairs in order, as jax's ``test_mma_block_scaled_sparse_f4`` builds
its reference, which passes on the GPU). Their metadata lies as the 8-bit
kinds' below: 128 logical K an instruction, 32 entries a row.

**Metadata in TMEM** (``[$5]``, or ``[$7]`` after the scale factors): 16
entries a 32-bit cell, entry ``p`` in bits ``2p, 2p + 1``, as jax's
``sparse_meta_layout`` lays them (``async_copy_sparse_metadata_smem_to_tmem``:
``tcgen05.cp.128x128b`` of 128 rows x 64 entries per 128 logical K; jax's
tests format them for the hardware and pass there):

* 8-bit kinds (K = 64 logical an instruction, 32 entries a row): row ``r``'s
  entry ``i`` at lane ``r``, column ``addr + i // 16``, position ``i % 16``;
  the sparsity selector (instruction descriptor bits 0-1) must be 0.
* kind::f16 (K = 32 logical, 16 entries a row): column ``addr + selector``
  (jax names a column pair and selects its half), lane ``16 (r // 16) + 8 (i
  // 8) + r % 8``, position ``8 ((r // 8) % 2) + i % 8``; a selector of 2 or 3
  is an error.

Numbers are the dense kinds' (:mod:`.tcgen05`): A decompressed exactly
(zeros at the positions not stored), then the same product.
"""

from __future__ import annotations

import numpy as np

from .. import tmem
from ..errors import EmulationError, Unsupported

#: the pairs (first, second) a group's two entries may hold
VALID = {(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)}


def metadata_cells(addr: int, selector: int, rows: int, wide16: bool, op: str,
                   where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lanes, columns, bit positions) of each row's entries: (rows, entries)."""
    lane0, col0 = (int(x) for x in tmem.split(addr))
    if lane0:
        raise EmulationError(f"{op} at {where}: sparse metadata at TMEM lane {lane0}; it "
                             "starts at lane 0")
    r = np.arange(rows)[:, None]
    if wide16:
        if selector > 1:
            raise EmulationError(f"{op} at {where}: sparsity selector {selector}; kind::f16 "
                                 "with M = 128 takes 0 or 1")
        i = np.arange(16)[None, :]
        lanes = 16 * (r // 16) + 8 * (i // 8) + r % 8
        cols = np.broadcast_to(col0 + selector, lanes.shape)
        pos = 8 * ((r // 8) % 2) + i % 8
        return lanes, cols, pos
    if selector:
        raise Unsupported(f"{op} with sparsity selector {selector} (an 8-bit kind's metadata "
                          "is modelled with selector 0)", where)
    i = np.arange(32)[None, :]
    return np.broadcast_to(r, (rows, 32)), col0 + i // 16 + 0 * r, np.broadcast_to(i % 16,
                                                                                 (rows, 32))


def positions(cells: np.ndarray, pos: np.ndarray, op: str, where: str) -> np.ndarray:
    """The logical K positions (rows, stored) of A's stored elements, from the
    metadata entries (cells' bits at ``pos``), checked to be valid pairs."""
    entries = (cells >> (2 * pos.astype(np.uint32))) & 3  # (rows, 2 g)
    pairs = entries.reshape(entries.shape[0], -1, 2)
    bad = ~(pairs[..., 0] < pairs[..., 1])
    if bad.any():
        r, g = (int(x[0]) for x in np.nonzero(bad))
        raise EmulationError(
            f"{op} at {where}: sparse metadata of A row {r}, group {g} names positions "
            f"{int(pairs[r, g, 0])} and {int(pairs[r, g, 1])} (groups of 4 counted from "
            "this instruction's first K); a 2:4 group's two entries must "
            "be increasing (the PTX ISA leaves other codes undefined); fix: write the "
            "metadata as (lower index, higher index) pairs")
    groups = np.arange(pairs.shape[1])[None, :, None]
    return (4 * groups + pairs).reshape(entries.shape)


def pair_elements(where_pairs: np.ndarray) -> np.ndarray:
    """The logical K positions of stored elements from their pairs'
    positions (e2m1's pair-wise sparsity): stored pair ``j`` of a row, at
    pair position ``p``, is stored elements ``2 j`` and ``2 j + 1`` at
    ``2 p`` and ``2 p + 1``."""
    return (2 * where_pairs[:, :, None] + np.arange(2)).reshape(where_pairs.shape[0], -1)


def decompress(a: np.ndarray, where_k: np.ndarray, k: int) -> np.ndarray:
    """The (rows, k) logical A: stored element ``j`` of row ``r`` at ``where_k[r, j]``."""
    out = np.zeros((a.shape[0], k), a.dtype)
    np.put_along_axis(out, where_k, a, axis=1)
    return out
