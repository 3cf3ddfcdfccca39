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
that barrier).

``leader_tracked=REPLICATED`` emits the multicast form,
``...tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes
.multicast::cluster.cta_group::2 [$1], [$2, {coords}], [mapped_addr], $M;``
(``$M``: an ``i16`` CTA mask): the box lands at offset ``$1`` of every CTA in
the mask, and the bytes landing in each complete on the leader's mbarrier.
PTX sends the signal for a CTA of a pair to the mbarrier at that offset in
the pair's first CTA; jax emits it only for a pair (a collective of 2) whose
first CTA is rank 0, where both readings are one barrier -- any other mask
(a CTA outside the issuer's pair, or a pair other than ranks 0 and 1) is
:class:`Unsupported`.
"""

from __future__ import annotations

import re

import numpy as np

from .. import tma
from ..compiler import Step
from ..errors import Unsupported
from ..machine import Frame
from .inline_asm import Instr, ptx_text
from .nvvm import effective, per_thread, tma_load_check

PAIR_LOAD = re.compile(
    r"\{ \.reg \.b32 (\w+); @\$0 mapa\.shared::cluster\.u32 \1, \$3, 0; "
    r"@\$0 cp\.async\.bulk\.tensor\.([1-5])d\.shared::cta\.global\.tile\."
    r"mbarrier::complete_tx::bytes\.cta_group::2 \[\$1\], \[\$2, \{([$\d,]*)\}\], \[\1\]; \}")
PAIR_MULTICAST = re.compile(
    r"\{ \.reg \.b32 (\w+); @\$0 mapa\.shared::cluster\.u32 \1, \$3, 0; "
    r"@\$0 cp\.async\.bulk\.tensor\.([1-5])d\.shared::cluster\.global\.tile\."
    r"mbarrier::complete_tx::bytes\.multicast::cluster\.cta_group::2 "
    r"\[\$1\], \[\$2, \{([$\d,]*)\}\], \[\1\], \$(\d+); \}")


def _pair_load(fr: Frame, pred: int, smem: int, desc: int, bar: int, coords: list[int],
               where: str, site, mask: int | None = None) -> None:
    """The loads of the threads that execute it: into the issuing block's
    SMEM, or (``mask``: the slot of the multicast CTA mask) into each CTA of
    the mask, every byte completing on the leader's mbarrier."""
    b = fr.need_block("cp.async.bulk.tensor .cta_group::2", where)
    leader = b.peer(0, where)
    r = fr.regs
    for t in np.flatnonzero(effective(fr, [pred])):
        d = tma.descriptor(fr, per_thread(r[desc], fr.T)[t], where)
        at = [int(per_thread(r[c], fr.T)[t]) for c in coords]
        target = leader.barrier(int(per_thread(r[bar], fr.T)[t]), where)
        destinations = [b] if mask is None else \
            _pair_destinations(b, int(per_thread(r[mask], fr.T)[t]) & 0xFFFF, where)
        for dest in destinations:
            n = tma.load(fr, d, int(per_thread(r[smem], fr.T)[t]), at, where,
                         smem_space=dest.smem, check=tma_load_check(fr, t, leader, target, site))
            target.complete_tx(n)


def _pair_destinations(b, mask: int, where: str) -> list:
    """The blocks of a multicast pair load's CTA mask: only CTAs of the
    pair of ranks 0 and 1, where PTX's per-pair signal and jax's mapped
    barrier are the leader's one mbarrier."""
    ranks = [k for k in range(16) if mask >> k & 1]
    if not ranks or any(k > 1 for k in ranks):
        raise Unsupported(f"a multicast TMA load of a CTA pair with CTA mask {mask:#06x} "
                          "(modelled: CTAs of the pair of cluster ranks 0 and 1, as jax's "
                          "leader_tracked=REPLICATED copies use it)", where)
    return [b.peer(k, where) for k in ranks]


def _operands(i: Instr, pattern: re.Pattern, multicast: bool) -> list[int]:
    """The slots of jax's operands, in its order (predicate, SMEM, descriptor,
    barrier, coordinates, and the CTA mask of the multicast form)."""
    m = pattern.fullmatch(" ".join(i.text.split()))
    assert m is not None  # the table matched it
    rank = int(m[2])
    coords = [c.strip() for c in m[3].split(",")]
    if coords != [f"${4 + k}" for k in range(rank)] or i.results \
            or len(i.ins) != 4 + rank + multicast or (multicast and int(m[4]) != 4 + rank):
        raise i.unknown
    return list(i.ins)


@ptx_text(PAIR_LOAD.pattern, "jax's TMA load of a CTA pair (leader_tracked): mapa of the "
          "mbarrier to CTA 0 + cp.async.bulk.tensor.Nd.shared::cta.global.tile.mbarrier::"
          "complete_tx::bytes.cta_group::2: the box into the issuing block's SMEM, its bytes "
          "completed on the leader's mbarrier")
def pair_load(i: Instr) -> Step:
    pred, smem, desc, bar, *cs = _operands(i, PAIR_LOAD, multicast=False)
    loc, site = i.loc, i.op.site("cp.async.bulk.tensor.cta_group::2")
    return lambda fr: _pair_load(fr, pred, smem, desc, bar, cs, loc, site)


@ptx_text(PAIR_MULTICAST.pattern, "jax's multicast TMA load of a CTA pair (leader_tracked="
          "REPLICATED): mapa of the mbarrier to CTA 0 + cp.async.bulk.tensor.Nd.shared::"
          "cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster.cta_group::2: "
          "the box into each CTA of the mask (ranks 0 and 1), all bytes completed on the "
          "leader's mbarrier")
def pair_multicast_load(i: Instr) -> Step:
    pred, smem, desc, bar, *cs, mask = _operands(i, PAIR_MULTICAST, multicast=True)
    loc, site = i.loc, i.op.site("cp.async.bulk.tensor.multicast.cta_group::2")
    return lambda fr: _pair_load(fr, pred, smem, desc, bar, cs, loc, site, mask)
