"""``tcgen05.cp``: SMEM -> TMEM copies, as jax's ``tcgen05.async_copy_smem_to_tmem``
and ``async_copy_scales_smem_to_tmem`` emit them:
``tcgen05.cp.cta_group::{1,2}.{128x256b,128x128b,64x128b.warpx2::01_23,
32x128b.warpx4} [taddr], s_desc;`` (and ``64x128b.warpx2::02_13``, which jax
does not emit).

The source is a matrix of 128 rows of 32 (``128x256b``) or 16 (``128x128b``)
bytes, of 64 rows of 16 bytes (``64x128b.warpx2::{02_13,01_23}``), or of 32
rows of 16 bytes (``32x128b.warpx4``, jax's copies of scale factors),
described by an SMEM matrix descriptor in the K-major canonical
layout of the MMA operands (PTX ISA, "Shared memory descriptor"): with a
swizzle of S bytes, byte ``j`` of row ``i`` is at ``(i % 8) S + (i // 8) SBO
+ j``, passed through the swizzle (:func:`.wgmma._read_operand`); without
one, rows are 8 x 16-byte core matrices: ``(i % 8) 16 + (i // 8) SBO +
(j // 16) LBO + j % 16``. Its 32-bit words land in consecutive columns from
the address's (whose lane must be 0), row ``i`` in the TMEM lanes of
:data:`LANES` (tcgen05.cp's ``.multicast`` qualifiers, read from their
PTX ISA names -- the warps named together receive the same rows -- and from
CUTLASS's UTCCP atoms below; not validated on hardware): 128 rows, lane ``i``; ``.warpx4``, the
32 rows to each warp's lane quarter (lanes ``i``, ``32 + i``, ``64 + i``,
``96 + i``); ``.warpx2::02_13``, rows 0-31 to warps 0 and 2 and rows 32-63
to warps 1 and 3 (row ``i`` at lanes ``i`` and ``64 + i``); ``.warpx2::01_23``,
rows 0-31 to warps 0 and 1 and rows 32-63 to warps 2 and 3 (row ``i`` at
lanes ``64 (i // 32) + i % 32`` and 32 lanes on) -- CUTLASS's
``SM100_UTCCP_2x64dp128bitlw0213`` ("broadcast like 4x32dp") and
``..lw0123`` ("data_row[0:31] -> DP[0:63], data_row[32:63] ->
DP[64:127]") say the same. (jax's
``b_scales_m64_collective_layout`` docstring, which puts the first half in
quarters 0 and 2, describes no access jax makes: its block-scaled MMA reads
the copy as :mod:`.tcgen05_scaled` models it, and jax's
``test_mma_block_scaled_collective_m128`` matches numpy with this placement
and fails with that one.) ``cta_group::2`` (issued by the even CTA of a pair) copies in
each CTA of the pair, from its SMEM to its TMEM, at the same descriptor and
address.

A copy is issued by each executing thread and runs when issued; for the
checker it belongs to the thread's tcgen05 unit (:mod:`.tcgen05`): its
SMEM reads (through the async proxy) and TMEM writes are ordered before what
follows a wait on the mbarrier phase a later ``tcgen05.commit`` of the
thread completes, and before the thread's later MMAs (which the hardware
pipelines after it). ``4x256b`` (jax never emits it, and where its 4 rows
land is not pinned down here) and the decompressing forms
(``.b8x16.b6x16_p32``, ``.b8x16.b4x16_p64``) raise :class:`Unsupported`.
"""

from __future__ import annotations

import re
import types

import numpy as np

from .. import tmem
from ..compiler import Step
from ..errors import EmulationError, Unsupported
from ..machine import Frame
from .inline_asm import Instr, ptx_pattern
from .nvvm import effective, per_thread
from .tcgen05 import _mma_unit, _smem_desc
from .wgmma import _read_operand

CP = re.compile(r"tcgen05\.cp\.cta_group::([12])\.(\w+?)(\..+)?")
_I32, _I64 = np.arange(32), np.arange(64)
#: (shape, multicast) -> (bytes a row, the TMEM lanes of each source row: (rows, copies))
LANES = {
    ("128x256b", None): (32, np.arange(128)[:, None]),
    ("128x128b", None): (16, np.arange(128)[:, None]),
    ("64x128b", ".warpx2::02_13"): (16, _I64[:, None] + np.array([0, 64])),
    ("64x128b", ".warpx2::01_23"): (16, (64 * (_I64 // 32) + _I64 % 32)[:, None]
                                    + np.array([0, 32])),
    ("32x128b", ".warpx4"): (16, _I32[:, None] + 32 * np.arange(4)),
}


def _rows(fr_like, desc: int, nrows: int, nbytes: int, where: str, check) -> np.ndarray:
    """The (nrows, nbytes // 4) words a copy's descriptor points at."""
    words = nbytes // 4
    if desc >> 62:
        return _read_operand(fr_like, desc, nrows, words, np.dtype(np.uint32), 0, where, check,
                             "tcgen05.cp")
    start = (desc & 0x3FFF) << 4
    lbo = ((desc >> 16) & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    if (desc >> 49) & 7:
        raise Unsupported(f"a tcgen05.cp descriptor with base offset {(desc >> 49) & 7}", where)
    i = np.arange(nrows, dtype=np.int64)[:, None]
    jb = 4 * np.arange(words, dtype=np.int64)[None, :]
    addr = start + (i % 8) * 16 + (i // 8) * sbo + (jb // 16) * lbo + jb % 16
    vals = fr_like.mem["shared"].load(addr, np.dtype(np.uint32), None, where)
    if check is not None:
        check(addr, 4)
    return vals


@ptx_pattern(r"tcgen05\.cp\..*", "tcgen05.cp.cta_group::{1,2}.{128x256b,128x128b,"
             "64x128b.warpx2::{02_13,01_23},32x128b.warpx4} [taddr], s_desc: 128 rows of 32 "
             "or 16 bytes, 64 rows of 16 bytes to two warp pairs, or 32 rows of 16 bytes to "
             "each warp's lane quarter, from SMEM (the MMA operands' K-major canonical "
             "layout, swizzled or not) into TMEM from lane 0 (cta_group::2: in each CTA of "
             "the pair); asynchronous for the checker like the thread's MMAs")
def tcgen05_cp(i: Instr) -> Step:
    m = CP.fullmatch(i.opcode)
    group, shape, multicast = m[1], m[2], m[3]
    if (shape, multicast) not in LANES:
        raise Unsupported(f"tcgen05.cp of shape {shape}{multicast or ''} in cta_group::{group} "
                          "(128x256b, 128x128b, 64x128b.warpx2::02_13, 64x128b.warpx2::01_23 "
                          "and 32x128b.warpx4 are modelled)", i.loc)
    if [a.strip() for a in i.args] != ["[$0]", "$1"] or len(i.ins) != 2 or i.results:
        raise i.unknown
    (t_s, d_s), pred, loc, op = i.ins, i.pred_slots, i.loc, i.opcode
    site, (nbytes, rows_lanes) = i.site, LANES[shape, multicast]
    nrows, copies = rows_lanes.shape
    lanes = rows_lanes.T.reshape(-1)[:, None]  # copy by copy, each the rows in order

    def step(fr: Frame) -> None:
        b = fr.need_block(op, loc)
        if group == "1":
            ctas = [b]
        elif b.cluster.size % 2 or b.rank % 2:
            raise EmulationError(f"{op} at {loc} issued by {b.name} (CTA rank {b.rank} of a "
                                 f"cluster of {b.cluster.size}): a cta_group::2 copy is issued "
                                 "by the even CTA of a pair")
        else:
            ctas = [b, b.peer(b.rank + 1, loc)]
        for th in np.flatnonzero(effective(fr, pred)):
            lane0, col0 = (int(x) for x in tmem.split(per_thread(fr.regs[t_s], fr.T)[th]))
            if lane0:
                raise EmulationError(f"{op} at {loc}: a copy to TMEM lane {lane0}; it fills "
                                     "lanes from 0")
            desc = _smem_desc(int(per_thread(fr.regs[d_s], fr.T)[th]) & (2 ** 64 - 1), loc)
            check = _mma_unit(fr, th, site)
            cols = col0 + np.arange(nbytes // 4)[None, :]
            for blk in ctas:
                t = tmem.of_block(blk)
                smem = types.SimpleNamespace(mem={"shared": blk.smem})
                words = _rows(smem, desc, nrows, nbytes, loc, check and check.smem_of(blk.smem))
                t.check_columns(cols.reshape(-1), op, loc)
                t.cells[lanes, cols] = np.tile(words, (copies, 1))
                if check:
                    check(t.space, t.byte_addresses(lanes, cols), True, False)
    return step
