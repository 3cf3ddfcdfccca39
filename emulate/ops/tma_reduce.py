"""TMA reductions (``cp.reduce.async.bulk.tensor``, what ``ctx.async_copy(...,
reduction_op=...)`` and ``plgpu.copy_smem_to_gmem(..., reduction_op=...)`` emit
as inline PTX): the box in SMEM combined element by element into the tensor
in GMEM, complete when issued, in the thread's bulk async-group like a TMA
store.

The element type and signedness are the tensor map's (Mosaic's type codes:
5 f16, 6 f32, 7 bf16, 3/4 32/64-bit integers compared unsigned, 9/10 signed
for ``smin``/``smax``). ``add`` wraps (integers) or rounds once to the element
type (floats), ``min``/``max`` are ``fmin``/``fmax`` on floats, ``inc``/``dec``
follow the PTX ISA (see :mod:`.atomics`), ``and``/``or``/``xor`` are bitwise.
Each element is combined atomically: the checker sees a write of GMEM that
races with plain accesses, not with other reductions."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np

from ..compiler import Step
from ..errors import Unsupported
from ..machine import Frame
from .atomics import _combine
from .inline_asm import Instr, _tma_issuers, ptx_pattern
from .nvvm import per_thread, tma_store_check

REDUCE = (r"cp\.reduce\.async\.bulk\.tensor\.([1-5])d\.global\.shared::cta\."
          r"(add|min|max|inc|dec|and|or|xor)\.tile\.bulk_group")

# Mosaic's TMA element type codes (launch_context._tma_dma_type) as numbers
CODE_DTYPES = {5: np.float16, 6: np.float32, 7: ml_dtypes.bfloat16, 1: np.uint8, 2: np.uint16,
               3: np.uint32, 4: np.uint64, 9: np.int32, 10: np.int64}


@ptx_pattern(REDUCE, "cp.reduce.async.bulk.tensor.{1-5}d.global.shared::cta.op.tile.bulk_group "
             "[desc, {coords}], [smem]: a TMA reduction of the SMEM box into the tensor, element "
             "by element (op: add/min/max/inc/dec/and/or/xor; the type is the tensor map's)")
def tma_reduce(i: Instr) -> Step:
    from .. import tma

    m = re.fullmatch(REDUCE, i.opcode)
    rank, op = int(m[1]), m[2]
    if len(i.args) != rank + 2:
        raise i.unknown
    desc, *coords, smem = (i.arg_slot(a) for a in i.args)
    pred_slots, loc, site = i.pred_slots, i.loc, i.site

    def step(fr: Frame) -> None:
        fr.need_block("TMA reduction", loc)
        for t, d, s in _tma_issuers(fr, pred_slots, desc, smem, loc):
            if d.code not in CODE_DTYPES or d.per_byte > 1:
                raise Unsupported(f"TMA reduction .{op} of element type code {d.code}", loc)
            dt = np.dtype(CODE_DTYPES[d.code])
            if dt.kind in "fV" and op not in ("add", "min", "max"):
                raise Unsupported(f"TMA reduction .{op} of {dt}", loc)
            at = [int(per_thread(fr.regs[c], fr.T)[t]) for c in coords]
            tma.reduce(fr, d, s, at, _combine(op, dt), dt, loc,
                       check=tma_store_check(fr, t, site, "TMA reduction"))
    return step
