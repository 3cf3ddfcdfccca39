"""The clocks and ids Mosaic GPU's profiler reads (``prof_spec=``,
``ctx.named_region``): ``%globaltimer`` (``mov.u64``, and its ``_lo``/``_hi``
halves by ``mov.u32``), ``%clock`` (``mgpu.utils.clock``, and in the
profiler's ``@$0 st.shared.v2.u32 [$1], {$2, %clock};``) and ``%smid``.

The emulator has no time: every clock is one deterministic counter per
launch that every read advances by one, so times are strictly increasing in
program order, the same on every run, and carry no information about speed.
All threads reading a clock in one step read the same value. ``%smid`` is the
block's linear index modulo the number of SMs the kernel was lowered for
(132, an H100's), which is where a block may run."""

from __future__ import annotations

import weakref

import numpy as np

from ..compiler import Step
from ..machine import Frame
from .inline_asm import Instr, ptx_text
from .nvvm import effective, per_thread

SMS = 132
_TICKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tick(fr: Frame) -> int:
    """The launch's clock: a new, larger value at each read."""
    t = _TICKS.get(fr.launch, 0) + 1
    _TICKS[fr.launch] = t
    return t


def _result(i: Instr) -> int:
    if len(i.results) != 1:
        raise i.unknown
    return i.results[0]


@ptx_text(r"mov\.u32 \$0, ?%globaltimer_(lo|hi);",
          "mov.u32 $0, %globaltimer_lo/_hi: a half of the launch's deterministic clock (each "
          "read advances it by one)")
def globaltimer_half(i: Instr) -> Step:
    out, high = _result(i), "_hi" in i.text

    def step(fr: Frame) -> None:
        t = tick(fr)
        fr.regs[out] = np.asarray((t >> 32) if high else (t & 0xFFFFFFFF), np.uint32).view(np.int32)
    return step


@ptx_text(r"mov\.u32 \$0, ?%clock;",
          "mov.u32 $0, %clock: the low half of the launch's deterministic clock (each read "
          "advances it by one; mgpu.utils.clock)")
def clock(i: Instr) -> Step:
    out = _result(i)

    def step(fr: Frame) -> None:
        fr.regs[out] = np.asarray(tick(fr) & 0xFFFFFFFF, np.uint32).view(np.int32)
    return step


@ptx_text(r"mov\.u64 \$0, ?%globaltimer;",
          "mov.u64 $0, %globaltimer: the launch's deterministic clock (each read advances it "
          "by one)")
def globaltimer(i: Instr) -> Step:
    out = _result(i)
    return lambda fr: fr.regs.__setitem__(out, np.asarray(tick(fr), np.int64))


@ptx_text(r"mov\.u32 \$0, ?%smid;",
          "mov.u32 $0, %smid: the block's linear index modulo 132 SMs")
def smid(i: Instr) -> Step:
    out = _result(i)

    def step(fr: Frame) -> None:
        b = fr.need_block("%smid", i.loc)
        (x, y, z), (gx, gy, _) = b.block_id, b.grid
        fr.regs[out] = np.asarray((x + gx * (y + gy * z)) % SMS, np.int32)
    return step


@ptx_text(r"@\$0 st\.shared\.v2\.u32 \[\$1\], ?\{\$2, ?%clock\};",
          "@$0 st.shared.v2.u32 [$1], {$2, %clock}: the profiler's event record, $2 and the "
          "launch's deterministic clock stored to SMEM by the predicated threads")
def profiler_event(i: Instr) -> Step:
    pred, addr, tag = i.ins[:3]
    loc, site = i.loc, i.site

    def step(fr: Frame) -> None:
        m = effective(fr, [pred])
        if not m.any():
            return
        t = np.uint32(tick(fr) & 0xFFFFFFFF).view(np.int32)
        a = per_thread(np.asarray(fr.regs[addr], np.int64), fr.T)
        vals = np.stack([per_thread(np.asarray(fr.regs[tag], np.int32), fr.T),
                         np.full(fr.T, t, np.int32)], axis=1)
        addrs = a[:, None] + np.array([0, 4], np.int64)
        fr.mem["shared"].store(addrs, vals, np.dtype(np.int32), m, loc)
        if fr.sync is not None:
            fr.sync.thread_access(fr, "shared", addrs, 1, 4, True, site, mask=m, values=vals)
    return step
