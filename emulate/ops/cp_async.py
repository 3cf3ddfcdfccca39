"""Ampere ``cp.async``: per-thread asynchronous GMEM->SMEM copies and their groups.

``nvvm.cp.async.shared.global`` copies ``cp-size`` (4, 8 or 16) bytes from a
thread's global address to its shared address; with a ``src-size`` operand
only that many bytes are read and the rest of the destination is zero-filled
(PTX ISA, "cp.async"). The emulator performs the copy when it is issued (one
schedule); the checker (:mod:`..sync`) records the copy's reads and writes
under a ``cp.async`` component of the issuing warp, stamped in issue order,
so nothing is ordered after them until:

* ``cp.async.wait_group N`` (``nvvm.cp.async.wait.group``) by the issuing
  thread: its groups (``cp.async.commit_group``) but the newest N are
  complete; ``cp.async.wait_all`` waits for every copy, committed or not;
* ``cp.async.mbarrier.arrive[.noinc]``: the mbarrier's phase in progress
  completes only after the thread's copies issued so far, so a wait on that
  phase acquires them. Without ``.noinc`` the arrival is net zero on the
  pending count (the copies complete when issued here), with ``.noinc`` it
  counts as one arrival per thread.

Other threads see the copied bytes only through that wait and a barrier (or
an mbarrier) after it: the usual happens-before of the checker.
"""

from __future__ import annotations

import re

import numpy as np

from ..compiler import Op, Step, rule
from ..errors import EmulationError
from ..machine import Frame
from .inline_asm import Instr, guarded, ptx, ptx_pattern
from .nvvm import _flag, _int_attr, effective, group_rules, mbarrier_arrive, operands, per_thread

CP_SIZES = (4, 8, 16)


def cp_async(fr: Frame, dst: int, src: int, size: int, src_size: int | None, pred_slots,
             where: str, site) -> None:
    """The copies of the threads that execute the op (see the module docstring)."""
    fr.need_block("cp.async", where)
    m = effective(fr, list(pred_slots))
    if not m.any():
        return
    d = per_thread(fr.regs[dst], fr.T).astype(np.int64)
    s = per_thread(fr.regs[src], fr.T).astype(np.int64)
    for name, a in (("destination", d), ("source", s)):
        bad = m & (a % size != 0)
        if bad.any():
            t = int(np.flatnonzero(bad)[0])
            raise EmulationError(
                f"cp.async of {size} bytes: thread {t}'s {name} address {int(a[t]):#x} is not "
                f"{size}-byte aligned at {where}; align the buffers (PTX requires the cp-size "
                "alignment of both addresses)")
    n = np.full(fr.T, size, np.int64)
    if src_size is not None:
        n = per_thread(fr.regs[src_size], fr.T).astype(np.int64)
        bad = m & ((n < 0) | (n > size))
        if bad.any():
            t = int(np.flatnonzero(bad)[0])
            raise EmulationError(
                f"cp.async src-size {int(n[t])} of thread {t} outside 0..{size} (its cp-size) "
                f"at {where}; pass a src-size no larger than the copy")
    k = np.arange(size)
    read = m[:, None] & (k < n[:, None])  # (T, size): the source bytes read
    written = np.broadcast_to(m[:, None], read.shape)
    src_bytes = s[:, None] + k
    dst_bytes = d[:, None] + k
    data = np.zeros(read.shape, np.uint8)
    if read.any():
        data = np.where(read, fr.mem["global"].load(src_bytes, np.dtype(np.uint8), read, where), 0)
    fr.mem["shared"].store(dst_bytes, data.astype(np.uint8), np.dtype(np.uint8), written, where)
    if fr.sync is not None:
        _check(fr, m, src_bytes, read, dst_bytes, site)
    if fr.prof is not None:  # an LDGSTS: neither a shared store nor a global load in ncu
        fr.prof.cp_async(where, s, np.where(m, n, 0), m)


def _check(fr: Frame, m: np.ndarray, src_bytes, read, dst_bytes, site) -> None:
    """Each warp's copies: checked against what the warp knows when it
    issues them, recorded under its cp.async component."""
    sync, b = fr.sync, fr.block
    if sync is None or b is None:  # (a block's frame whenever the checker is on)
        return
    rows = b.warp_rows
    for row in np.unique(rows[m]):
        row = int(row)
        mine = m & (rows == row)
        view = sync.clocks.matrix[row].copy()
        comp, stamp = sync.cp_async_issue(b, row)
        agent = f"cp.async issued by {sync.clocks.names[row]}"
        r = read & mine[:, None]
        if r.any():
            sync.async_access(view, fr.mem["global"], src_bytes[r], 1, False, site, comp, stamp,
                              agent, proxy_read=False)
        sync.async_access(view, fr.mem["shared"], dst_bytes[mine].reshape(-1), 1, True, site,
                          comp, stamp, agent, proxy_read=False)


def cp_async_commit(fr: Frame, pred_slots=()) -> None:
    """``cp.async.commit_group``: each executing thread's copies not yet in a
    group become its newest group."""
    if fr.sync is not None:
        fr.sync.cp_async_commit(fr, np.flatnonzero(effective(fr, list(pred_slots))))


def cp_async_wait(fr: Frame, pending: int | None, pred_slots=()) -> None:
    """``cp.async.wait_group pending`` (None: ``cp.async.wait_all``)."""
    if fr.sync is not None:
        fr.sync.cp_async_wait(fr, np.flatnonzero(effective(fr, list(pred_slots))), pending)


def cp_async_mbarrier_arrive(fr: Frame, addr: int, noinc: bool, where: str) -> None:
    """``cp.async.mbarrier.arrive[.noinc]`` (see the module docstring)."""
    b = fr.need_block("cp.async.mbarrier.arrive", where)
    m = effective(fr, [])
    if not m.any():
        return
    addrs = per_thread(fr.regs[addr], fr.T).astype(np.int64)
    if fr.sync is not None:
        for row in np.unique(b.warp_rows[m]):
            issued = fr.sync.cp_async_issued(b, int(row))
            if issued is None:
                continue
            for a in np.unique(addrs[m & (b.warp_rows == row)]):
                bar = b.barrier(int(a), where)
                bar.point.stamp(*issued)
    if noinc:  # the asynchronous arrival counts, one per thread, releasing none of its accesses
        mbarrier_arrive(fr, addr, m, where, release=False)
    else:
        for a in np.unique(addrs[m]):
            b.barrier(int(a), where)  # a barrier must be there


@rule("nvvm.cp.async.shared.global")
def cp_async_shared_global(o: Op) -> Step:
    size = _int_attr(o, "size")
    if size not in CP_SIZES:
        raise o.unsupported(f"nvvm.cp.async.shared.global of {size} bytes (PTX allows 4, 8, 16)")
    modifier = str(o.attr_or("modifier", "ca"))
    if "cg" in modifier and size != 16:
        raise o.unsupported(f"nvvm.cp.async.shared.global .cg of {size} bytes (PTX allows .cg "
                            "only for 16)")
    if o.in_types[0].space != "shared" or o.in_types[1].space != "global":
        raise o.unsupported(f"nvvm.cp.async.shared.global from {o.in_types[1].text} to "
                            f"{o.in_types[0].text}")
    dst, src = operands(o, "dst")[0], operands(o, "src")[0]
    src_size = operands(o, "cpSize")
    loc, site = o.loc, o.site("cp.async")
    ss = src_size[0] if src_size else None
    return lambda fr: cp_async(fr, dst, src, size, ss, (), loc, site)


group_rules("nvvm.cp.async.commit.group", "nvvm.cp.async.wait.group", "n", cp_async_commit,
            cp_async_wait)


@rule("nvvm.cp.async.mbarrier.arrive")
def cp_async_arrive(o: Op) -> Step:
    if o.in_types[0].space != "shared":
        raise o.unsupported(f"{o.name} on a {o.in_types[0].text}")
    addr = operands(o, "addr")[0]
    noinc = _flag(o, "noinc")
    loc = o.loc
    return lambda fr: cp_async_mbarrier_arrive(fr, addr, noinc, loc)


# --- the same instructions as inline PTX ----------------------------------------

CP_ASYNC_PTX = r"cp\.async\.(ca|cg)\.shared(?:::cta)?\.global(?:\.L2::(?:64|128|256)B)?"


@ptx_pattern(CP_ASYNC_PTX, "cp.async.{ca,cg}.shared[::cta].global[.L2::NB] [dst], [src], "
             "cp-size[, src-size]: a thread's asynchronous 4/8/16-byte GMEM->SMEM copy, "
             "zero-filling past src-size")
def cp_async_ptx(i: Instr) -> Step:
    if len(i.args) not in (3, 4) or not re.fullmatch(r"\d+", i.args[2].strip()):
        raise i.unknown
    size = int(i.args[2])
    if size not in CP_SIZES or (i.opcode.startswith("cp.async.cg") and size != 16):
        raise i.unknown
    dst, src = i.arg_slot(i.args[0]), i.arg_slot(i.args[1])
    ss = i.arg_slot(i.args[3]) if len(i.args) == 4 else None
    pred_slots, loc, site = i.pred_slots, i.loc, i.site
    return lambda fr: cp_async(fr, dst, src, size, ss, pred_slots, loc, site)


@ptx("cp.async.commit_group")
def cp_async_commit_ptx(i: Instr) -> Step:
    """Closes the thread's cp.async group."""
    return guarded(i, cp_async_commit)


@ptx("cp.async.wait_group", "cp.async.wait_all")
def cp_async_wait_ptx(i: Instr) -> Step:
    """Waits until at most N of the thread's cp.async groups are pending
    (``wait_all``: none, and its uncommitted copies too)."""
    if i.opcode == "cp.async.wait_all":
        if i.args:
            raise i.unknown
        pending = None
    elif len(i.args) != 1 or not re.fullmatch(r"\d+", i.args[0].strip()):
        raise i.unknown
    else:
        pending = int(i.args[0])
    pred_slots = i.pred_slots
    return lambda fr: cp_async_wait(fr, pending, pred_slots)
