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

jax 0.12 maps the mbarrier beforehand (``BarrierRef.remap_to_cluster``: its
own inline ``mapa``) and emits the copy alone, the mbarrier operand ``$3``
a shared::cluster address: ``@$0 cp.async.bulk.tensor.Nd.shared::cta...
.cta_group::2 [$1], [$2, {coords}], [$3];`` and the multicast form with
``, $M``. The bytes complete on the mbarrier that address names, which must
be in a CTA of the pair of ranks 0 and 1.
"""

from __future__ import annotations

import re

import numpy as np

from .. import tma
from ..compiler import Step
from ..errors import Unsupported
from ..machine import Frame
from ..memory import split_cluster_address
from .inline_asm import Instr, ptx_text
from .nvvm import effective, per_thread, tma_load_check

# named groups: ``reg`` (the mapa block's register), ``rank``, ``coords``, ``mask``
PAIR_LOAD = re.compile(
    r"\{ \.reg \.b32 (?P<reg>\w+); @\$0 mapa\.shared::cluster\.u32 (?P=reg), \$3, 0; "
    r"@\$0 cp\.async\.bulk\.tensor\.(?P<rank>[1-5])d\.shared::cta\.global\.tile\."
    r"mbarrier::complete_tx::bytes\.cta_group::2 \[\$1\], \[\$2, \{(?P<coords>[$\d,]*)\}\], "
    r"\[(?P=reg)\]; \}")
PAIR_MULTICAST = re.compile(
    r"\{ \.reg \.b32 (?P<reg>\w+); @\$0 mapa\.shared::cluster\.u32 (?P=reg), \$3, 0; "
    r"@\$0 cp\.async\.bulk\.tensor\.(?P<rank>[1-5])d\.shared::cluster\.global\.tile\."
    r"mbarrier::complete_tx::bytes\.multicast::cluster\.cta_group::2 "
    r"\[\$1\], \[\$2, \{(?P<coords>[$\d,]*)\}\], \[(?P=reg)\], \$(?P<mask>\d+); \}")
#: jax 0.12's forms: the mbarrier ($3) already a shared::cluster address
PAIR_LOAD_MAPPED = re.compile(
    r"@\$0 cp\.async\.bulk\.tensor\.(?P<rank>[1-5])d\.shared::cta\.global\.tile\."
    r"mbarrier::complete_tx::bytes\.cta_group::2 \[\$1\], \[\$2, \{(?P<coords>[$\d,]*)\}\], "
    r"\[\$3\];")
PAIR_MULTICAST_MAPPED = re.compile(
    r"@\$0 cp\.async\.bulk\.tensor\.(?P<rank>[1-5])d\.shared::cluster\.global\.tile\."
    r"mbarrier::complete_tx::bytes\.multicast::cluster\.cta_group::2 "
    r"\[\$1\], \[\$2, \{(?P<coords>[$\d,]*)\}\], \[\$3\], \$(?P<mask>\d+);")


def _pair_load(fr: Frame, pred: int, smem: int, desc: int, bar: int, coords: list[int],
               where: str, site, mask: int | None = None, mapped: bool = False) -> None:
    """The loads of the threads that execute it: into the issuing block's
    SMEM, or (``mask``: the slot of the multicast CTA mask) into each CTA of
    the mask, every byte completing on the leader's mbarrier (``bar``: its
    offset, or where ``mapped``, its shared::cluster address)."""
    b = fr.need_block("cp.async.bulk.tensor .cta_group::2", where)
    r = fr.regs
    for t in np.flatnonzero(effective(fr, [pred])):
        d = tma.descriptor(fr, per_thread(r[desc], fr.T)[t], where)
        at = [int(per_thread(r[c], fr.T)[t]) for c in coords]
        leader, offset = _tracking_block(b, int(per_thread(r[bar], fr.T)[t]), mapped, where)
        target = leader.barrier(offset, where)
        destinations = [b] if mask is None else \
            _pair_destinations(b, int(per_thread(r[mask], fr.T)[t]) & 0xFFFF, where)
        for dest in destinations:
            n = tma.load(fr, d, int(per_thread(r[smem], fr.T)[t]), at, where,
                         smem_space=dest.smem, check=tma_load_check(fr, t, leader, target, site))
            target.complete_tx(n)


def _tracking_block(b, bar: int, mapped: bool, where: str):
    """(the block whose mbarrier tracks the transfer, the mbarrier's offset
    in its SMEM): CTA 0's at offset ``bar``, or the block a mapped address
    names -- one of the pair of ranks 0 and 1."""
    if not mapped:
        return b.peer(0, where), bar
    rank, offset = split_cluster_address(bar, b.cluster.size, where)
    if int(rank) > 1:
        raise Unsupported(f"a TMA load of a CTA pair tracked by the mbarrier of CTA rank "
                          f"{int(rank)} (modelled: the pair of cluster ranks 0 and 1, as jax "
                          "maps it to rank 0)", where)
    return b.peer(int(rank), where), int(offset)


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


def _operands(i: Instr, pattern: re.Pattern) -> list[int]:
    """The slots of jax's operands, in its order (predicate, SMEM, descriptor,
    barrier, coordinates, and the CTA mask of the multicast form)."""
    m = pattern.fullmatch(" ".join(i.text.split()))
    assert m is not None  # the table matched it
    rank = int(m["rank"])
    multicast = m.groupdict().get("mask") is not None
    coords = [c.strip() for c in m["coords"].split(",")]
    if coords != [f"${4 + k}" for k in range(rank)] or i.results \
            or len(i.ins) != 4 + rank + multicast or (multicast and int(m["mask"]) != 4 + rank):
        raise i.unknown
    return list(i.ins)


def _handler(pattern: re.Pattern):
    """The table handler of one of jax's pair-load forms (multicast where it
    has a CTA mask; its mbarrier mapped beforehand where no mapa block maps it)."""
    multicast = "mask" in pattern.groupindex
    mapped = "reg" not in pattern.groupindex
    opcode = ("cp.async.bulk.tensor.multicast.cta_group::2" if multicast
              else "cp.async.bulk.tensor.cta_group::2")

    def handler(i: Instr) -> Step:
        pred, smem, desc, bar, *rest = _operands(i, pattern)
        coords, mask = (rest[:-1], rest[-1]) if multicast else (rest, None)
        loc, site = i.loc, i.op.site(opcode)
        return lambda fr: _pair_load(fr, pred, smem, desc, bar, coords, loc, site, mask, mapped)
    return handler


pair_load = ptx_text(
    PAIR_LOAD.pattern, "jax's TMA load of a CTA pair (leader_tracked): mapa of the mbarrier "
    "to CTA 0 + cp.async.bulk.tensor.Nd.shared::cta.global.tile.mbarrier::complete_tx::bytes."
    "cta_group::2: the box into the issuing block's SMEM, its bytes completed on the leader's "
    "mbarrier")(_handler(PAIR_LOAD))
pair_multicast_load = ptx_text(
    PAIR_MULTICAST.pattern, "jax's multicast TMA load of a CTA pair (leader_tracked="
    "REPLICATED): mapa of the mbarrier to CTA 0 + cp.async.bulk.tensor.Nd.shared::cluster."
    "global.tile.mbarrier::complete_tx::bytes.multicast::cluster.cta_group::2: the box into "
    "each CTA of the mask (ranks 0 and 1), all bytes completed on the leader's mbarrier")(
    _handler(PAIR_MULTICAST))
pair_load_mapped = ptx_text(
    PAIR_LOAD_MAPPED.pattern, "jax 0.12's TMA load of a CTA pair (leader_tracked): "
    "cp.async.bulk.tensor.Nd.shared::cta.global.tile.mbarrier::complete_tx::bytes.cta_group::2 "
    "with the mbarrier mapped beforehand: the box into the issuing block's SMEM, its bytes "
    "completed on the mbarrier the shared::cluster address names (a CTA of the pair of ranks "
    "0 and 1)")(_handler(PAIR_LOAD_MAPPED))
pair_multicast_load_mapped = ptx_text(
    PAIR_MULTICAST_MAPPED.pattern, "jax 0.12's multicast TMA load of a CTA pair "
    "(leader_tracked=REPLICATED): cp.async.bulk.tensor.Nd.shared::cluster.global.tile."
    "mbarrier::complete_tx::bytes.multicast::cluster.cta_group::2 with the mbarrier mapped "
    "beforehand: the box into each CTA of the mask (ranks 0 and 1), all bytes completed on "
    "the mbarrier the shared::cluster address names")(
    _handler(PAIR_MULTICAST_MAPPED))
