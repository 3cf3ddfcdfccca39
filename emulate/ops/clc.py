"""Cluster launch control (sm_100): a running cluster cancels a cluster of the
grid not yet launched and does its work itself (jax's
``plgpu.dynamic_scheduling_loop``), as ``utils.try_cluster_cancel`` and
``utils.query_cluster_cancel`` emit it.

The emulator launches the clusters of a grid in CUDA's order (x fastest):
as many as the GPU holds at once start together (by its SM count and the
occupancy of one SM, :func:`..device.resident_clusters`; it runs them one
after another), the rest wait in ``launch.unlaunched`` and start one by one
as clusters finish. ``clusterlaunchcontrol.try_cancel`` takes the next
waiting one, if any -- a schedule the hardware may choose: every cluster
still waiting could be cancelled; a grid that fits on the GPU has none --
and writes its 16-byte response to SMEM at the same offset in
every block of the issuing cluster (``multicast::cluster::all``),
completing 16 transaction bytes on each block's mbarrier at the barrier's
offset. The response's format is the emulator's own (the PTX ISA keeps it
opaque; only ``query_cancel`` reads it): a word that says whether a cluster
was cancelled, then the x, y, z id of its first block.
``clusterlaunchcontrol.query_cancel`` (jax's block: ``ld.shared.b128`` of
the response, ``is_canceled``, ``get_first_ctaid``) decodes it.

For the checker the response is written by an asynchronous unit that
completes on the mbarrier (like a TMA load); the two
``fence.proxy.async::generic`` fences around it order what the checker
already orders (an asynchronous write needs no fence before a thread reads it
after the wait; a thread's read needs none before an asynchronous write).
"""

from __future__ import annotations

import re

import numpy as np

from ..compiler import Step
from ..errors import EmulationError
from ..machine import Frame
from .inline_asm import Instr, ptx, ptx_text
from .nvvm import effective, per_thread, tma_load_check

TRY_CANCEL = ("clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes"
              ".multicast::cluster::all.b128")
RESPONSE = 16  # bytes
CANCELED = 0x434C4301  # "CLC" + 1: a cluster was cancelled


def _try_cancel(fr: Frame, pred: list[int], dst: int, bar: int, where: str, site) -> None:
    b = fr.need_block("clusterlaunchcontrol.try_cancel", where)
    m = effective(fr, pred)
    for t in np.flatnonzero(m):
        queue = getattr(fr.launch, "unlaunched", None)
        response = np.zeros(4, np.uint32)
        if queue:
            first = queue.popleft()  # the first block of the cancelled cluster
            response[:] = (CANCELED, *first)
        data = response.view(np.uint8)
        d_addr = int(per_thread(fr.regs[dst], fr.T)[t])
        b_addr = int(per_thread(fr.regs[bar], fr.T)[t])
        for peer in b.cluster.blocks:
            target = peer.barrier(b_addr, where)
            check = tma_load_check(fr, t, peer, target, site)
            peer.smem.write_bytes(d_addr, data, where)
            if check is not None:
                check(peer.smem, np.array([d_addr]), RESPONSE, True)
            target.complete_tx(RESPONSE)


@ptx(TRY_CANCEL)
def try_cancel(i: Instr) -> Step:
    """``[response], [mbar]``: cancels the next cluster of the grid not yet launched
    (if any) and writes the 16-byte response to every block of the cluster,
    completing 16 bytes on each one's mbarrier."""
    if len(i.args) != 2:
        raise i.unknown
    dst, bar = i.arg_slot(i.args[0]), i.arg_slot(i.args[1])
    pred, loc, site = i.pred_slots, i.loc, i.site
    return lambda fr: _try_cancel(fr, pred, dst, bar, loc, site)


QUERY = re.compile(
    r"\{ \.reg \.b128 handle; ld\.shared\.b128 handle, \[\$4\]; "
    r"clusterlaunchcontrol\.query_cancel\.is_canceled\.pred\.b128 \$3, handle; "
    r"@\$3 clusterlaunchcontrol\.query_cancel\.get_first_ctaid\.v4\.b32\.b128 "
    r"\{\$0, \$1, \$2, _\}, handle; \}")


@ptx_text(QUERY.pattern, "jax's query_cluster_cancel block: ld.shared.b128 of a "
          "try_cancel response, clusterlaunchcontrol.query_cancel.is_canceled and "
          ".get_first_ctaid (the x, y, z id of the cancelled cluster's first block)")
def query_cancel(i: Instr) -> Step:
    if len(i.ins) != 1 or len(i.outs) != 1:
        raise i.unknown
    (src,), (out,), loc = i.ins, i.outs, i.loc
    site = i.op.site("ld.shared.b128 + clusterlaunchcontrol.query_cancel")

    def step(fr: Frame) -> None:
        fr.need_block("clusterlaunchcontrol.query_cancel", loc)
        addrs = per_thread(fr.regs[src], fr.T).astype(np.int64)
        m = effective(fr, [])
        words = np.zeros((fr.T, 4), np.uint32)
        for a in np.unique(addrs[m]):
            words[addrs == a] = fr.mem["shared"].read_bytes(int(a), RESPONSE, loc).view(np.uint32)
        if fr.sync is not None:
            fr.sync.thread_access(fr, "shared", addrs[:, None] + np.arange(0, RESPONSE, 4), 1,
                                  4, False, site)
        ok = words[:, 0] == CANCELED
        bad = m & ~ok & (words[:, 0] != 0)
        if bad.any():
            raise EmulationError(f"clusterlaunchcontrol.query_cancel at {loc} of 16 bytes no "
                                 "try_cancel wrote")
        ids = np.where(ok[:, None], words[:, 1:], 0).astype(np.int32)
        fr.regs[out] = (ids[:, 0].copy(), ids[:, 1].copy(), ids[:, 2].copy(), ok)
    return step


@ptx("fence.proxy.async::generic.acquire.sync_restrict::shared::cluster.cluster",
     "fence.proxy.async::generic.release.sync_restrict::shared::cta.cluster")
def clc_fences(i: Instr) -> Step:
    """The fences jax puts around a try_cancel response: nothing the checker needs
    (an asynchronous write is visible after the wait; a read needs no fence before
    an asynchronous write)."""
    if i.args or i.pred is not None:
        raise i.unknown
    return lambda fr: None
