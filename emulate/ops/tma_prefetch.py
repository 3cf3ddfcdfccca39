"""TMA prefetches (``cp.async.bulk.prefetch.tensor``, ``ctx.async_prefetch``):
a hint to bring a box into L2, so nothing to compute or to order. What the
emulator checks is what would make the GPU fault: the operand must be a
tensor map ``mosaic_gpu_init_tma_desc`` made, of the instruction's rank. The
box may lie partly or wholly outside the tensor (prefetching nothing there),
as on the GPU."""

from __future__ import annotations

import re

from ..compiler import Step
from ..errors import EmulationError
from ..machine import Frame
from .inline_asm import Instr, _tma_issuers, ptx_pattern

PREFETCH = r"cp\.async\.bulk\.prefetch\.tensor\.([1-5])d\.L2\.global(?:\.tile)?"


@ptx_pattern(PREFETCH, "cp.async.bulk.prefetch.tensor.{1-5}d.L2.global[.tile] [desc, {coords}]: "
             "nothing to compute; the descriptor must be a tensor map of that rank")
def tma_prefetch(i: Instr) -> Step:
    rank = int(re.fullmatch(PREFETCH, i.opcode)[1])
    if len(i.args) != rank + 1:
        raise i.unknown
    desc = i.arg_slot(i.args[0])
    pred_slots, loc = i.pred_slots, i.loc

    def step(fr: Frame) -> None:
        fr.need_block("TMA prefetch", loc)
        for _, d, _ in _tma_issuers(fr, pred_slots, desc, desc, loc):
            if len(d.sizes) != rank:
                raise EmulationError(f"a {rank}-d TMA prefetch through a rank-{len(d.sizes)} "
                                     f"tensor map at {loc}")
    return step
