"""TMA loads of a CTA pair (``.cta_group::2``), as jax's
``launch_context.async_copy(..., leader_tracked=...)`` emits them for
collective tcgen05 kernels:

    { .reg .b32 mapped_addr;
      @$0 mapa.shared::cluster.u32 mapped_addr, $3, 0;
      @$0 cp.async.bulk.tensor.Nd.shared::cta.global.tile.mbarrier::complete_tx::bytes
          .cta_group::2 [$1], [$2, {coords}], [mapped_addr]; }

Each issuing thread loads the box into its own block's SMEM (``$1``) and
completes its bytes on the mbarrier at offset ``$3`` in CTA 0 of the cluster
(``mapa ..., 0``): the leader tracks the pair's transfers. For the checker
the write is the leader barrier's transfer (like any TMA load completing on
that barrier). The ``shared::cluster`` multicast form is not modelled.
"""

from __future__ import annotations

import re

import numpy as np

from .. import tma
from ..compiler import Step
from ..machine import Frame
from .inline_asm import Instr, ptx_text
from .nvvm import effective, per_thread, tma_load_check

PAIR_LOAD = re.compile(
    r"\{ \.reg \.b32 (\w+); @\$0 mapa\.shared::cluster\.u32 \1, \$3, 0; "
    r"@\$0 cp\.async\.bulk\.tensor\.([1-5])d\.shared::cta\.global\.tile\."
    r"mbarrier::complete_tx::bytes\.cta_group::2 \[\$1\], \[\$2, \{([$\d,]*)\}\], \[\1\]; \}")


def _pair_load(fr: Frame, pred: int, smem: int, desc: int, bar: int, coords: list[int],
               where: str, site) -> None:
    b = fr.need_block("cp.async.bulk.tensor .cta_group::2", where)
    leader = b.peer(0, where)
    r = fr.regs
    for t in np.flatnonzero(effective(fr, [pred])):
        d = tma.descriptor(fr, per_thread(r[desc], fr.T)[t], where)
        at = [int(per_thread(r[c], fr.T)[t]) for c in coords]
        target = leader.barrier(int(per_thread(r[bar], fr.T)[t]), where)
        n = tma.load(fr, d, int(per_thread(r[smem], fr.T)[t]), at, where, smem_space=b.smem,
                     check=tma_load_check(fr, t, leader, target, site))
        target.complete_tx(n)


@ptx_text(PAIR_LOAD.pattern, "jax's TMA load of a CTA pair (leader_tracked): mapa of the "
          "mbarrier to CTA 0 + cp.async.bulk.tensor.Nd.shared::cta.global.tile.mbarrier::"
          "complete_tx::bytes.cta_group::2: the box into the issuing block's SMEM, its bytes "
          "completed on the leader's mbarrier")
def pair_load(i: Instr) -> Step:
    m = PAIR_LOAD.fullmatch(" ".join(i.text.split()))
    rank = int(m[2])
    coords = [c.strip() for c in m[3].split(",")]
    if coords != [f"${4 + k}" for k in range(rank)] or len(i.ins) != 4 + rank or i.results:
        raise i.unknown
    pred, smem, desc, bar, *cs = i.ins
    loc, site = i.loc, i.op.site("cp.async.bulk.tensor.cta_group::2")
    return lambda fr: _pair_load(fr, pred, smem, desc, bar, cs, loc, site)
