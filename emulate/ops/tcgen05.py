"""tcgen05: Blackwell's TMEM allocation, TMEM loads and stores, tensor-core
MMAs and their commits, as jax's ``mosaic_gpu/tcgen05.py`` emits them.

Registered in the inline-PTX table of :mod:`.inline_asm` (its ``@ptx``,
``@ptx_pattern`` and ``@ptx_text`` decorators) plus two op rules:
``llvm.call_intrinsic`` of ``llvm.nvvm.tcgen05.commit.cg1`` and
``nvvm.tcgen05.fence``. TMEM itself is :mod:`..tmem`.

* ``tcgen05.alloc/dealloc/relinquish_alloc_permit.cta_group::{1,2}``: by
  whole warps (``.sync.aligned``), each block in its own TMEM (a pair's
  warps allocate alike); ``alloc`` writes the TMEM address to SMEM (a write
  of the allocating warp, for the checker).
* ``tcgen05.ld/st.sync.aligned.{32x32b,16x64b,16x128b,16x256b}.x{1..128}
  [.pack::16b|.unpack::16b].b32``: by whole warps, each warp at the address
  it gives (which must be the same in its 32 threads), in its own 32-lane
  slab (``tcgen05.ld.red...32x32b``: also each thread's min/max of its
  words) (:meth:`..tmem.TensorMemory.warp_lanes`); the registers are moved
  at once (a loaded register may be used
  before ``tcgen05.wait::ld``: ptxas orders register uses, and jax relies on
  it), but for the checker a warp's TMEM loads and stores are asynchronous
  units that complete at its ``tcgen05.wait::ld`` / ``wait::st``.
* ``tcgen05.mma.cta_group::{1,2}.kind::{f16,f8f6f4,i8}`` (f16/bf16, fp8
  e4m3/e5m2 -- A and B may differ --, s8/u8; f32 or f16 (D type code 0;
  not with bf16) or, for i8, s32 accumulators), by each thread that
  executes it: D (TMEM, from the address's column) = A @ B (+ D with
  ``enable-input-d``). A comes from an SMEM matrix descriptor or from TMEM
  (its rows in D's lanes, two 16-bit elements a column, the even k in the low
  half); B from an SMEM descriptor. The rows' lanes are the PTX ISA's data
  path layouts (:data:`DATAPATHS`): M = 128 (layout D) and M = 256 over a
  pair (A), row r at lane r; M = 64 (F, half the data path), row r at lane
  32 (r // 16) + r % 16 from the address's lane 0 or 16 (the lane alignment,
  A's the same as D's); M = 128 over a pair (B, 64 rows a CTA), row r at
  lane r for D's first N/2 columns and at lane 64 + r, the same columns, for
  the others (A in TMEM with layout B is not modelled). SMEM descriptors
  have WGMMA's format (start, LBO, SBO, swizzle in bits 62-63; bits 46-48
  may hold tcgen05's fixed 0b001, which jax 0.11.2 leaves 0) and are read by
  :func:`.wgmma._read_operand`. The instruction descriptor is decoded as the
  PTX ISA documents it (sparsity 0-2, saturate 3, D type 4-5, A/B type 7-9 /
  10-12, negate A/B 13/14, transpose A/B 15/16, N >> 3 in 17-22, M >> 4 in
  24-28, max shift 30-31). Each instruction's K (32 bytes of a row) products
  are summed in float64, added to D and rounded once to D's type, to
  nearest even (compare an f32 D within the bound of :mod:`.wgmma`; an f16 D
  is one element a cell, in its low 16 bits, the high bits written 0 -- a
  reading of the PTX ISA, not validated on hardware); integer products and
  sums are exact, D wraps to s32. M = 64 or 128 (N a multiple of 8 or 16),
  and M = 128 or 256 over a pair; ``cta_group::2`` MMAs are issued
  by the even CTA of a pair and span both: each CTA's A rows (its SMEM or
  TMEM) and D (its TMEM), B's N columns split between them (the even CTA's
  first). Block-scaled kinds (``kind::{mxf8f6f4,mxf4,mxf4nvf4}.block_scale``,
  scale factors ``[$5], [$6]`` in TMEM; e2m1 operands) as
  :mod:`.tcgen05_scaled` describes. kind::tf32 (jax 0.11.2 never emits
  it), f6/f4 operands of (mxf)f8f6f4 (jax emits f4 only through mxf4nvf4, f6
  never), sparse MMAs with 64 rows a CTA (their metadata layouts) and
  saturation raise :class:`Unsupported`.
  ``tcgen05.mma.sp`` (2:4 sparse A, 4:8 pair-wise for e2m1, its metadata in
  TMEM) as
  :mod:`.tcgen05_sparse` describes.
* ``tcgen05.commit`` (``llvm.nvvm.tcgen05.commit.cg1``; ``.mc.cg2``: on the
  mbarrier at the same offset in each CTA of a 16-bit mask): the MMAs the
  thread issued are complete (they ran when issued); one arrival.
  For the checker a thread's MMAs are one asynchronous unit, read and written
  under it until a commit covering them completes the mbarrier phase a
  waiter acquires; MMAs of one thread are ordered among themselves (the PTX
  ISA pipelines them).
* ``tcgen05.fence::before/after_thread_sync`` orders nothing in lockstep;
  the checker takes every tcgen05 operation as ordered with its thread's
  synchronization (as if the fences were where jax puts them).
"""

from __future__ import annotations

import re
import types

import numpy as np

from .. import irtypes, tmem
from ..compiler import Op, Step, rule
from ..errors import EmulationError, Unsupported
from ..machine import Frame
from ..sync.checker import TCGEN05, TMEM_LOAD, TMEM_STORE, Checker
from . import arith
from . import tcgen05_scaled as scaled
from . import tcgen05_sparse as sparse
from .inline_asm import Instr, ptx, ptx_pattern, ptx_text
from .nvvm import effective, per_thread
from .wgmma import _read_operand

# --- whole warps -----------------------------------------------------------------------

def _executing_warps(fr: Frame, pred_slots: list[int], op: str, where: str) -> np.ndarray:
    """Local indices of the warps that execute a ``.sync.aligned`` instruction
    (every thread of each, or none)."""
    m = effective(fr, pred_slots)
    if fr.T % 32:
        raise Unsupported(f"{op} in a block of {fr.T} threads", where)
    w = m.reshape(-1, 32)
    part = w.any(1) & ~w.all(1)
    if part.any():
        raise EmulationError(f"{op} at {where} executed by {int(w[part][0].sum())} threads of "
                             "a warp: a .sync.aligned instruction needs all 32 threads of the "
                             "warp; fix: execute it outside divergent code")
    return np.flatnonzero(w.all(1))


def _warp_value(fr: Frame, slot: int, k: int, what: str, op: str, where: str) -> int:
    """The value of register ``slot`` in warp ``k``, the same in its 32 threads."""
    v = per_thread(fr.regs[slot], fr.T)[32 * k: 32 * k + 32].astype(np.int64)
    if np.any(v != v[0]):
        raise EmulationError(f"{op} at {where}: the {what} differs between the threads of "
                             f"warp {k} ({int(v.min()):#x} .. {int(v.max()):#x}); it must be "
                             "the same in the whole warp")
    return int(v[0])


def _bits32(x: np.ndarray) -> np.ndarray:
    """The bits of 32-bit register values (an "r" operand may be f32 or i32)."""
    x = np.ascontiguousarray(x)  # per thread: (T,) of 4 bytes, or (T, n) of 4 // n bytes
    if x.ndim not in (1, 2) or x.dtype.itemsize * (x.shape[1] if x.ndim == 2 else 1) != 4:
        raise Unsupported(f"a tcgen05 register operand of {x.dtype} {x.shape[1:]}")
    return x.view(np.uint32).reshape(x.shape[0])


def _block_warp(fr: Frame, k: int) -> int:
    return int(fr.block.flat[32 * k]) // 32


def _row(fr: Frame, k: int) -> int:
    return int(fr.block.warp_rows[32 * k])


# --- allocation ----------------------------------------------------------------------------

def _pair(i: Instr):
    """For a cta_group::2 form: a check that the block has a CTA pair."""
    if "cta_group::2" not in i.opcode:
        return lambda b: None
    op, loc = i.opcode, i.loc

    def check(b) -> None:
        if b.cluster.size % 2:
            raise EmulationError(f"{op} at {loc} in a cluster of {b.cluster.size}: "
                                 "cta_group::2 needs CTA pairs (a cluster of even size)")
    return check


@ptx("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32",
     "tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32")
def tmem_alloc(i: Instr) -> Step:
    """``[dst], nCols``: a whole warp allocates nCols TMEM columns (all 128 lanes) and
    writes their address to SMEM at dst (cta_group::2: a warp of each CTA of the pair
    does, in its own TMEM; the pair's allocations match as they are made alike)."""
    if len(i.args) != 2:
        raise i.unknown
    dst, n = i.arg_slot(i.args[0]), i.arg_slot(i.args[1])
    pred, loc, site, op, pair = i.pred_slots, i.loc, i.site, i.opcode, _pair(i)

    def step(fr: Frame) -> None:
        b = fr.need_block(op, loc)
        pair(b)
        t = tmem.of_block(b)
        for k in _executing_warps(fr, pred, op, loc):
            ncols = _warp_value(fr, n, k, "column count", op, loc)
            addr = _warp_value(fr, dst, k, "destination address", op, loc)
            col = t.alloc(ncols, op, loc)
            fr.mem["shared"].store(np.asarray(addr), np.uint32(col), np.dtype(np.uint32),
                                   None, loc)
            if fr.sync is not None:  # a write of the allocating warp
                first = np.zeros(fr.T, bool)
                first[32 * k] = True
                fr.sync.thread_access(fr, "shared", np.full(fr.T, addr, np.int64), 0, 4, True,
                                      site, mask=first, values=np.uint32(col))
    return step


@ptx("tcgen05.dealloc.cta_group::1.sync.aligned.b32",
     "tcgen05.dealloc.cta_group::2.sync.aligned.b32")
def tmem_dealloc(i: Instr) -> Step:
    """``taddr, nCols``: a whole warp frees the columns one tcgen05.alloc took."""
    if len(i.args) != 2:
        raise i.unknown
    a, n = i.arg_slot(i.args[0]), i.arg_slot(i.args[1])
    pred, loc, op, pair = i.pred_slots, i.loc, i.opcode, _pair(i)

    def step(fr: Frame) -> None:
        pair(fr.need_block(op, loc))
        t = tmem.of_block(fr.block)
        for k in _executing_warps(fr, pred, op, loc):
            t.dealloc(_warp_value(fr, a, k, "TMEM address", op, loc),
                      _warp_value(fr, n, k, "column count", op, loc), op, loc)
    return step


@ptx("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned",
     "tcgen05.relinquish_alloc_permit.cta_group::2.sync.aligned")
def tmem_relinquish(i: Instr) -> Step:
    """The block gives up its right to allocate TMEM (a later tcgen05.alloc is an error)."""
    if i.args:
        raise i.unknown
    pred, loc, op, pair = i.pred_slots, i.loc, i.opcode, _pair(i)

    def step(fr: Frame) -> None:
        pair(fr.need_block(op, loc))
        t = tmem.of_block(fr.block)
        if len(_executing_warps(fr, pred, op, loc)):
            t.relinquish(loc)
    return step


# --- loads and stores ---------------------------------------------------------------------

TMEM_MOVE = re.compile(r"tcgen05\.(ld|st)\.sync\.aligned\.(32x32b|16x64b|16x128b|16x256b)"
                       r"\.x(\d+)(\.pack::16b|\.unpack::16b)?\.b32")


def _cells(fr: Frame, t: tmem.TensorMemory, k: int, addr_slot: int, frag: tmem.Fragment,
           packed: bool, op: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(lanes, columns) of the cells warp ``k`` moves: (32, regs), or (32, regs, 2)
    with (un)packing (the low half's cell first)."""
    lane0, col0 = tmem.split(_warp_value(fr, addr_slot, k, "TMEM address", op, where))
    lanes = t.warp_lanes(_block_warp(fr, k), int(lane0), frag.lanes, op, where) + frag.lane
    if packed:
        cols = int(col0) + 2 * frag.col[..., None] + np.arange(2)
        lanes = np.broadcast_to(lanes[..., None], cols.shape)
    else:
        cols = int(col0) + frag.col
    t.check_columns(cols.reshape(-1), op, where)
    return lanes, cols


def _tmem_check(fr: Frame, k: int, t, lanes, cols, kind: str, op_name: str, is_write: bool,
                site) -> None:
    """The checker's view of warp ``k``'s TMEM load or store (``kind``) of the
    cells (``lanes``, ``cols``) of ``t``: checked against what the warp knows,
    recorded as the next of its unit of that kind."""
    sync = fr.sync
    if sync is None:
        return
    row = _row(fr, k)
    name = f"{op_name} of {sync.clocks.names[row]}"
    st = sync.unit((kind, fr.block.rank, row), kind, name)
    st[1] += 1
    sync.async_access(sync.clocks.view(row), t.space, t.byte_addresses(lanes, cols), 4, is_write,
                      site, st[0], st[1], name, proxy_read=False)


@ptx_pattern(TMEM_MOVE.pattern,
             "tcgen05.ld/st.sync.aligned.{32x32b,16x64b,16x128b,16x256b}.x{1-128}"
             "[.pack::16b|.unpack::16b].b32: whole warps move registers from/to the cells of "
             "their own 32-lane TMEM slab (PTX's matrix fragments); asynchronous for the "
             "checker until tcgen05.wait::ld/st")
def tmem_move(i: Instr) -> Step:
    m = TMEM_MOVE.fullmatch(i.opcode)
    kind, shape, num, pack = m[1], m[2], int(m[3]), m[4] or ""
    if num & (num - 1) or num > 128 or (pack and pack[1:3] != ("pa" if kind == "ld" else "un")):
        raise i.unknown
    frag = tmem.fragment(shape, num)
    nregs = frag.lane.shape[1]
    regs = [a.strip("{} ") for a in (i.args[:-1] if kind == "ld" else i.args[1:])]
    addr_arg = (i.args[-1] if kind == "ld" else i.args[0]).strip()
    if len(i.ins) != (1 if kind == "ld" else nregs + 1) or len(regs) != nregs or \
            addr_arg != f"[${nregs}]" or regs != [f"${r}" for r in range(nregs)] or \
            i.pred is not None:
        raise i.unknown
    addr_slot = i.ins[-1]
    packed, loc, op, site = bool(pack), i.loc, i.opcode, i.site
    if kind == "ld":
        (out,) = i.outs
        single = i.op.out_types[0].kind == "scalar"

        def load(fr: Frame) -> None:
            b = fr.need_block(op, loc)
            t = tmem.of_block(b)
            vals = np.zeros((fr.T, nregs), np.uint32)
            for k in _executing_warps(fr, [], op, loc):
                lanes, cols = _cells(fr, t, k, addr_slot, frag, packed, op, loc)
                cells = t.cells[lanes, cols]
                if packed:
                    cells = (cells[..., 0] & 0xFFFF) | ((cells[..., 1] & 0xFFFF) << 16)
                vals[32 * k: 32 * k + 32] = cells
                _tmem_check(fr, k, t, lanes, cols, TMEM_LOAD, "tcgen05.ld", False, site)
            v = vals.view(np.int32)
            fr.regs[out] = v[:, 0].copy() if single else tuple(v[:, r].copy()
                                                               for r in range(nregs))
        return load
    reg_slots = i.ins[:-1]

    def store(fr: Frame) -> None:
        b = fr.need_block(op, loc)
        t = tmem.of_block(b)
        warps = _executing_warps(fr, [], op, loc)
        if not len(warps):
            return
        vals = np.stack([_bits32(per_thread(fr.regs[s], fr.T)) for s in reg_slots], axis=1)
        for k in warps:
            lanes, cols = _cells(fr, t, k, addr_slot, frag, packed, op, loc)
            v = vals[32 * k: 32 * k + 32]
            if packed:
                v = np.stack([v & 0xFFFF, v >> 16], axis=-1)
            t.cells[lanes, cols] = v
            _tmem_check(fr, k, t, lanes, cols, TMEM_STORE, "tcgen05.st", True, site)
    return store


TMEM_LOAD_RED = re.compile(r"tcgen05\.ld\.red\.sync\.aligned\.32x32b\.x(\d+)\.(min|max)"
                           r"(\.abs)?(\.NaN)?\.(f32|s32|u32)")


def _reduce(vals: np.ndarray, how: str, absolute: bool, nan: bool, ty: str) -> np.ndarray:
    """Each thread's min/max over its registers (``vals``: (T, n) uint32 bits)."""
    if ty == "f32":
        x = vals.view(np.float32)
        x = np.abs(x) if absolute else x
        extremum = arith.extremum(how == "max", nan)
        return arith.reduce_columns(extremum, x).astype(np.float32).view(np.int32)
    x = vals.view(np.int32) if ty == "s32" else vals
    r = x.max(axis=1) if how == "max" else x.min(axis=1)
    return r.astype(x.dtype).view(np.int32)


@ptx_pattern(TMEM_LOAD_RED.pattern,
             "tcgen05.ld.red.sync.aligned.32x32b.x{N}.{min,max}[.abs][.NaN].{f32,s32,u32} "
             "{regs}, red, [taddr]: a 32x32b load that also gives each thread the min/max "
             "of its loaded words (.abs of their magnitudes; .NaN: NaN wins, else NaN is "
             "ignored)")
def tmem_load_red(i: Instr) -> Step:
    m = TMEM_LOAD_RED.fullmatch(i.opcode)
    num, how, absolute, nan, ty = int(m[1]), m[2], bool(m[3]), bool(m[4]), m[5]
    if num & (num - 1) or num > 128 or (ty != "f32" and (absolute or nan)) or i.pred is not None:
        raise i.unknown
    regs = [a.strip("{} ") for a in i.args[:-2]]
    if regs != [f"${r}" for r in range(num)] or i.args[-2].strip() != f"${num}" or \
            i.args[-1].strip() != f"[${num + 1}]" or len(i.ins) != 1:
        raise i.unknown
    frag = tmem.fragment("32x32b", num)
    (out,), addr_slot, loc, op, site = i.outs, i.ins[0], i.loc, i.opcode, i.site

    def load(fr: Frame) -> None:
        t = tmem.of_block(fr.need_block(op, loc))
        vals = np.zeros((fr.T, num), np.uint32)
        for k in _executing_warps(fr, [], op, loc):
            lanes, cols = _cells(fr, t, k, addr_slot, frag, False, op, loc)
            vals[32 * k: 32 * k + 32] = t.cells[lanes, cols]
            _tmem_check(fr, k, t, lanes, cols, TMEM_LOAD, "tcgen05.ld", False, site)
        v = vals.view(np.int32)
        fr.regs[out] = tuple(v[:, r].copy() for r in range(num)) + (
            _reduce(vals, how, absolute, nan, ty),)
    return load


@ptx("tcgen05.wait::ld.sync.aligned", "tcgen05.wait::st.sync.aligned")
def tmem_wait(i: Instr) -> Step:
    """The warp's earlier tcgen05.ld (wait::ld) or tcgen05.st (wait::st) are complete
    (they were when issued; the checker orders them before what follows)."""
    if i.args or i.pred is not None:
        raise i.unknown
    kind = TMEM_LOAD if "::ld" in i.opcode else TMEM_STORE
    loc, op = i.loc, i.opcode

    def step(fr: Frame) -> None:
        if fr.sync is None:
            return
        fr.need_block(op, loc)
        for k in _executing_warps(fr, [], op, loc):
            row = _row(fr, k)
            st = fr.sync._units.get((kind, fr.block.rank, row))
            if st is not None:
                fr.sync.clocks.learn(row, st[0], st[1])
    return step


# --- MMA --------------------------------------------------------------------------------

MMA = re.compile(
    r"\{ \.reg \.b32 a_desc_low, a_desc_high, b_desc_low, b_desc_high; "
    r"\.reg \.(b32|b64) a_desc; \.reg \.b64 b_desc; "
    r"add\.s32 a_desc_low, \$1, (\d+); add\.s32 b_desc_low, \$2, (\d+); "
    r"mov\.b64 b_desc, \{b_desc_low, (\d+)\}; "
    r"(?:mov\.b32 a_desc, a_desc_low;|mov\.b64 a_desc, \{a_desc_low, (\d+)\};) "
    r"tcgen05\.mma(\.sp)?\.cta_group::(\d)\.kind::(\S+) \[\$0\], (\[a_desc\]|a_desc), b_desc, "
    r"(.*?)\$3, (.*?)\$4; \}")

#: per kind: A/B type codes of the instruction descriptor -> element dtype, and the
#: D type codes it takes -> accumulator dtype; the f6/f4 codes of kind::f8f6f4
#: (3-5: e2m3, e3m2, e2m1) are not modelled: jax 0.11.2 only emits them block-scaled
F16_D, F32_D, S32_D = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.int32)
KINDS: dict[str, tuple[dict[int, np.dtype], dict[int, np.dtype]]] = {
    "f16": ({0: np.dtype(np.float16), 1: irtypes.SCALARS["bf16"]}, {0: F16_D, 1: F32_D}),
    "f8f6f4": ({0: irtypes.SCALARS["f8E4M3FN"], 1: irtypes.SCALARS["f8E5M2"]},
               {0: F16_D, 1: F32_D}),
    "i8": ({0: np.dtype(np.uint8), 1: np.dtype(np.int8)}, {2: S32_D}),
}
D_NAMES = {0: "f16", 1: "f32", 2: "s32"}
K_BYTES = 32  # one dense instruction's K: 32 bytes of each operand row


def _idesc(idesc: int, kind: str, ctas: int, sparse: bool, where: str) -> dict:
    """The fields of a kind::f16/f8f6f4/i8 instruction descriptor (PTX ISA,
    "Instruction descriptor"), checked against what is modelled."""
    f = {"sparse": (idesc >> 2) & 1, "saturate": (idesc >> 3) & 1, "d": (idesc >> 4) & 3,
         "a": (idesc >> 7) & 7, "b": (idesc >> 10) & 7, "neg_a": (idesc >> 13) & 1,
         "neg_b": (idesc >> 14) & 1, "trans_a": (idesc >> 15) & 1, "trans_b": (idesc >> 16) & 1,
         "n": ((idesc >> 17) & 0x3F) << 3, "m": ((idesc >> 24) & 0x1F) << 4,
         "shift": (idesc >> 30) & 3}
    types_, d_types = KINDS[kind]
    if f["sparse"] != sparse or (idesc & 3 and not sparse):
        raise EmulationError(f"tcgen05.mma instruction descriptor {idesc:#x} at {where}: "
                             f"sparsity bit {f['sparse']}, selector {idesc & 3}, on a"
                             f"{'' if sparse else ' non'}-sparse (.sp) instruction")
    f["selector"] = idesc & 3
    if f["d"] not in d_types or f["saturate"]:
        raise Unsupported(f"tcgen05.mma.kind::{kind} with D type {f['d']} (instruction "
                          f"descriptor {idesc:#x}; "
                          f"{'/'.join(D_NAMES[c] for c in d_types)} accumulators, without "
                          "saturation, are modelled)", where)
    if f["a"] not in types_ or f["b"] not in types_ or (kind != "f8f6f4" and f["a"] != f["b"]):
        raise Unsupported(f"tcgen05.mma.kind::{kind} with A type {f['a']} and B type {f['b']} "
                          f"(instruction descriptor {idesc:#x}; modelled: "
                          f"{', '.join(str(t) for t in types_.values())})", where)
    if kind == "i8" and (f["neg_a"] or f["neg_b"]):
        raise EmulationError(f"tcgen05.mma.kind::i8 instruction descriptor {idesc:#x} at {where} "
                             "negates an operand, which only floating-point kinds allow")
    if f["shift"]:
        raise EmulationError(f"tcgen05.mma instruction descriptor {idesc:#x} at {where} sets "
                             "the max shift, which only tcgen05.mma.ws takes")
    if (f["m"], ctas) not in DATAPATHS:
        raise EmulationError(f"tcgen05.mma.cta_group::{ctas} instruction descriptor "
                             f"{idesc:#x} at {where} has M = {f['m']}: cta_group::{ctas} takes "
                             f"M = {' or '.join(str(m) for m, c in DATAPATHS if c == ctas)} "
                             "(M = 32 only with .ws)")
    if sparse and f["m"] != 128 * ctas:
        raise Unsupported(f"tcgen05.mma.sp.cta_group::{ctas} with M = {f['m']} (instruction "
                          f"descriptor {idesc:#x}; the metadata of the half-datapath layouts "
                          f"is not modelled: sparse M = {128 * ctas} is)", where)
    step = 8 if f["m"] == 64 else 16
    if f["n"] % step or not step <= f["n"] <= 256:
        raise EmulationError(f"tcgen05.mma instruction descriptor {idesc:#x} at {where} has "
                             f"N = {f['n']}: with M = {f['m']}, N must be a multiple of {step} "
                             f"from {step} to 256")
    f["a_dtype"], f["b_dtype"] = types_[f["a"]], types_[f["b"]]
    f["d_dtype"] = d_types[f["d"]]
    if f["d_dtype"] == F16_D and f["a_dtype"] == irtypes.SCALARS["bf16"]:
        raise EmulationError(f"tcgen05.mma.kind::f16 instruction descriptor {idesc:#x} at "
                             f"{where} asks for an f16 D with bf16 operands; bf16 needs an "
                             "f32 D (PTX ISA, kind::f16)")
    return f


def _read_d(cells: np.ndarray, d: np.dtype) -> np.ndarray:
    """D's values from its TMEM cells (an f16 D: the low 16 bits of each)."""
    if d == F16_D:
        return (cells & 0xFFFF).astype(np.uint16).view(np.float16)
    return cells.view(d)


def _write_d(x: np.ndarray, d: np.dtype) -> np.ndarray:
    """TMEM cells holding ``x`` (float64 or int64) rounded once to D's type (s32
    wraps; an f16 D in the low 16 bits of a cell, the high bits 0)."""
    if d == S32_D:
        return x.astype(np.uint64).astype(np.uint32)
    with np.errstate(over="ignore"):
        if d == F16_D:
            return x.astype(np.float16).view(np.uint16).astype(np.uint32)
        return x.astype(np.float32).view(np.uint32)


def _smem_desc(desc: int, where: str) -> int:
    """A tcgen05 SMEM matrix descriptor, checked to be in WGMMA's format."""
    if (desc >> 47) & 3 or (desc >> 52) & 1 or (desc >> 61) & 1:
        raise Unsupported(f"a tcgen05 SMEM matrix descriptor {desc:#x} with version bits "
                          f"{(desc >> 46) & 7:#b}, LBO mode {(desc >> 52) & 1} or the 32-byte "
                          "atomic 128-byte swizzle", where)
    return desc


#: (M, CTAs) -> the PTX ISA's data path layout ("Data path layout organization")
#: of the MMA's rows of D and of A in TMEM, dense and not .ws
DATAPATHS = {(128, 1): "D", (64, 1): "F", (256, 2): "A", (128, 2): "B"}


def _row_lanes(m: int, ctas: int, lane0: int, what: str, op: str, where: str) -> np.ndarray:
    """The TMEM lane of each of a CTA's rows of D (or of A in TMEM), from the
    lane field of the matrix's address: layouts D and A (M = 128; M = 256 over
    a pair) row r at lane r; F (M = 64) row r at lane lane0 + 32 (r // 16) +
    r % 16, the "lane alignment" lane0 0 or 16 (the first 16 lanes of each
    warp's quarter, or the last); B (M = 128 over a pair, 64 rows a CTA) row r
    at lane r, for the first half of D's columns (:func:`_d_cells`)."""
    layout = DATAPATHS[m, ctas]
    aligned = (0, 16) if layout == "F" else (0,)
    if lane0 not in aligned:
        raise EmulationError(f"{op} at {where}: {what} at TMEM lane {lane0}; with M = {m} (data "
                             f"path layout {layout}) it starts at lane "
                             f"{' or '.join(str(a) for a in aligned)}; fix: address "
                             f"{what} at the lane its layout starts from")
    r = np.arange(m // ctas)
    return lane0 + 32 * (r // 16) + r % 16 if layout == "F" else r


def _d_cells(lanes: np.ndarray, layout: str, col0: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(lanes, columns) of D's cells, broadcasting to (rows, n): element (r, j)
    in row r's lane, column col0 + j -- in layout B the second half of the
    columns folded into lanes 64-127 (col0 + j - n/2, lane 64 + r)."""
    j = np.arange(n)
    if layout == "B":
        half = n // 2
        return lanes[:, None] + 64 * (j // half)[None, :], col0 + (j % half)[None, :]
    return lanes[:, None], col0 + j[None, :]


def _a_from_tmem(t: tmem.TensorMemory, col0: int, lanes: np.ndarray, nbytes: int, op: str,
                 where: str) -> tuple[np.ndarray, np.ndarray]:
    """The (rows, nbytes) bytes of A's rows in TMEM: row i at lane ``lanes[i]`` (its
    data path layout's), its elements packed 32 bits a cell from column ``col0``
    (the lowest k in the lowest bits). Also the cells' byte addresses (for the
    checker)."""
    cols = col0 + np.arange(nbytes // tmem.CELL)[None, :]
    t.check_columns(cols.reshape(-1), op, where)
    cells = np.ascontiguousarray(t.cells[lanes[:, None], cols])  # little-endian: low bits first
    return cells.view(np.uint8).reshape(lanes.size, -1), t.byte_addresses(lanes[:, None], cols)


def _values(raw: np.ndarray, el: np.dtype, wide) -> np.ndarray:
    """An operand's (rows, K) values (float64 or int64) from its (rows, bytes) bytes."""
    if el == scaled.FP4:
        return scaled.unpack_fp4(raw)
    return np.ascontiguousarray(raw).view(el).astype(wide)


@ptx_text(r".*tcgen05\.mma.*", "a tcgen05.mma block as jax's tcgen05.py emits it: "
          "kind::f16 (f16/bf16), f8f6f4 (fp8 e4m3/e5m2), i8 (s32 accumulator), f32 "
          "or f16 accumulators; block-scaled kind::mxf8f6f4 (fp8, scale_vec::1X), mxf4 and "
          "mxf4nvf4 (e2m1, scale_vec::2X/4X, ue8m0 or ue4m3 scales from TMEM); .sp with 2:4 "
          "(e2m1: 4:8 pair-wise) metadata from TMEM; M = 64 or 128 (data path layouts F and D; "
          "over a pair B and A); A from an SMEM "
          "descriptor or TMEM, B from an SMEM descriptor, D in TMEM; cta_group::2 over the "
          "CTA pair (A and D split by rows, B by columns); run when issued, asynchronous for "
          "the checker until its commit's mbarrier phase completes")
def tcgen05_mma(i: Instr) -> Step:
    text = " ".join(i.text.split())
    m = MMA.fullmatch(text)
    if not m:
        raise Unsupported(f"inline PTX {i.text!r} (a tcgen05.mma form not modelled)", i.loc)
    a_reg, a_off, b_off, b_hi, a_hi, sp, group, kind, a_op, extra, extra2 = m.groups()
    block = scaled.kind(kind, i.loc)
    scales = extra2 == "[$5], [$6], " and block is not None
    meta = extra == ("[$7], " if scales else "[$5], ") and bool(sp)
    if group not in ("1", "2") or (kind not in KINDS and block is None) or (extra and not meta) \
            or bool(sp) != meta or (extra2 and not scales) or (block is not None and not scales):
        what = ("sparse " if sp else "") + f"kind::{kind}" + (
            " with metadata" if extra else "") + (
            " with scale factors" if extra2 else "") + (
            " without scale factors" if block is not None and not extra2 else "")
        raise Unsupported(f"tcgen05.mma {what} (kind::f16, f8f6f4 (fp8) and i8, dense or "
                          ".sp with metadata, and block-scaled kind::mxf8f6f4 (fp8), mxf4 and "
                          "mxf4nvf4 are modelled)", i.loc)
    a_tmem = a_op == "[a_desc]"
    if a_tmem != (a_reg == "b32") or len(i.ins) != 5 + 2 * scales + meta or i.results:
        raise i.unknown
    mma = _Mma(int(group), kind, block, meta, a_tmem, int(a_off), int(a_hi or 0), int(b_off),
               int(b_hi), i.ins, i.loc,
               i.op.site(f"tcgen05.mma{sp or ''}.cta_group::{group}.kind::{kind}"))

    def step(fr: Frame) -> None:
        fr.need_block(mma.op, mma.loc)
        for th in np.flatnonzero(effective(fr, [])):
            mma.issue(fr, th)
    return step


class _Mma:
    """One tcgen05.mma instruction: its constant parts, and :meth:`issue`."""

    def __init__(self, ctas: int, kind: str, block: tuple[str, int] | None, sparse: bool,
                 a_tmem: bool, a_off: int, a_hi: int, b_off: int, b_hi: int, ins: list[int],
                 loc: str, site) -> None:
        self.ctas, self.kind, self.block, self.a_tmem = ctas, kind, block, a_tmem
        self.sparse = sparse
        self.meta_s = ins[-1] if sparse else None
        self.a_off, self.a_hi, self.b_off, self.b_hi = a_off, a_hi, b_off, b_hi
        self.d_s, self.a_s, self.b_s, self.id_s, self.acc_s = ins[:5]
        self.sa_s: int | None = ins[5] if block else None
        self.sb_s: int | None = ins[6] if block else None
        self.loc, self.site = loc, site
        self.op = f"tcgen05.mma{'.sp' if sparse else ''}.cta_group::{ctas}.kind::{kind}"

    def blocks(self, b) -> list:
        """The CTAs the MMA spans: the issuing block, or its pair (the even rank first)."""
        if self.ctas == 1:
            return [b]
        if b.cluster.size % 2 or b.rank % 2:
            raise EmulationError(f"{self.op} at {self.loc} issued by {b.name} (CTA rank "
                                 f"{b.rank} of a cluster of {b.cluster.size}): a cta_group::2 "
                                 "MMA is issued by the even CTA of a pair")
        return [b, b.peer(b.rank + 1, self.loc)]

    def issue(self, fr: Frame, th: int) -> None:
        op, loc = self.op, self.loc

        def val(slot: int) -> int:
            return int(per_thread(fr.regs[slot], fr.T)[th]) & 0xFFFFFFFF
        idesc = val(self.id_s)
        if self.block:
            f = scaled.idesc(idesc, *self.block, self.ctas, self.sparse, loc)
            f["d_dtype"], f["selector"] = F32_D, 0
        else:
            f = _idesc(idesc, self.kind, self.ctas, self.sparse, loc)
        el, b_el = f["a_dtype"], f["b_dtype"]
        k_a = K_BYTES * 8 // (4 if el == scaled.FP4 else 8 * el.itemsize)  # A's stored K
        k = k_a * (2 if self.sparse else 1)  # the logical K (B's)
        n, rows = f["n"], f["m"] // self.ctas
        exact = self.kind == "i8"  # integers: int64 products, s32 wrapping
        wide = np.int64 if exact else np.float64
        layout = DATAPATHS[f["m"], self.ctas]
        d_lane, d_col = (int(x) for x in tmem.split(val(self.d_s)))
        d_lanes = _row_lanes(f["m"], self.ctas, d_lane, "D", op, loc)
        if self.a_tmem and f["trans_a"]:
            raise EmulationError(f"{op} at {loc}: A in TMEM cannot be transposed (instruction "
                                 f"descriptor {idesc:#x})")
        ctas = self.blocks(fr.block)
        check = _mma_unit(fr, th, self.site)
        a_lo = (val(self.a_s) + self.a_off) & 0xFFFFFFFF
        if self.a_tmem:
            a_lanes, a_col = self.a_lanes(a_lo, d_lane, layout, f["m"])
        b_desc = _smem_desc(((val(self.b_s) + self.b_off) & 0xFFFFFFFF) | (self.b_hi << 32), loc)
        # B is split by columns between the CTAs (the even CTA's first)
        bm = np.concatenate([self.smem_operand(blk, check, b_desc, n // len(ctas), k, b_el,
                                               f["trans_b"], wide) for blk in ctas])
        accumulate = bool(per_thread(fr.regs[self.acc_s], fr.T)[th])
        for blk in ctas:  # A and D are split by rows: each CTA's own
            t = tmem.of_block(blk)
            if self.a_tmem:
                raw, a_cells = _a_from_tmem(t, a_col, a_lanes, K_BYTES, op, loc)
                a = _values(raw, el, wide)
                if check:
                    check(t.space, a_cells, False, False)
            else:
                a = self.smem_operand(blk, check, _smem_desc(a_lo | (self.a_hi << 32), loc),
                                      rows, k_a, el, f["trans_a"], wide)
            if self.sparse:  # each CTA's own metadata
                lanes, cols, pos = sparse.metadata_cells(val(self.meta_s), f["selector"], rows,
                                                         el.itemsize == 2, op, loc)
                t.check_columns(cols.reshape(-1), op, loc)
                if check:
                    check(t.space, t.byte_addresses(lanes, cols), False, False)
                where_k = sparse.positions(t.cells[lanes, cols], pos, op, loc)
                if el == scaled.FP4:  # e2m1's entries name pairs of elements
                    where_k = sparse.pair_elements(where_k)
                a = sparse.decompress(a, where_k, k)
            if self.block:  # each CTA's own A scales and its own copy of B's
                prod = self.scaled_product(t, check, val, f, a, bm, layout)
            else:
                prod = a @ bm.T
            if f["neg_a"] != f["neg_b"]:
                prod = -prod
            lanes, cols = _d_cells(d_lanes, layout, d_col, n)
            t.check_columns(cols.reshape(-1), op, loc)
            d_cells = t.byte_addresses(lanes, cols)
            if accumulate:
                prod = prod + _read_d(t.cells[lanes, cols], f["d_dtype"])
                if check:
                    check(t.space, d_cells, False, False)
            t.cells[lanes, cols] = _write_d(prod, f["d_dtype"])
            if check:
                check(t.space, d_cells, True, False)

    def a_lanes(self, taddr: int, d_lane: int, layout: str, m: int) -> tuple[np.ndarray, int]:
        """(the lane of each row, the first column) of A in TMEM: in D's data path
        layout, at the same lane alignment (PTX ISA: the half-datapath layouts use
        one alignment for A and D)."""
        lane, col = (int(x) for x in tmem.split(taddr))
        if layout == "B":
            raise Unsupported(f"{self.op} with M = {m} and A in TMEM (data path layout B: "
                              "A in TMEM with 64 rows a CTA of a pair is not modelled, and "
                              "jax 0.11.2 never emits it; A from SMEM is modelled)", self.loc)
        if layout == "F" and lane != d_lane:
            raise EmulationError(f"{self.op} at {self.loc}: A at TMEM lane {lane} and D at lane "
                                 f"{d_lane}; with M = 64 (data path layout F) A and D must use "
                                 "the same lane alignment (PTX ISA); fix: put A in the same "
                                 "16 lanes of each quarter as D")
        return _row_lanes(m, self.ctas, lane, "A", self.op, self.loc), col

    def scaled_product(self, t: tmem.TensorMemory, check, val, f: dict, a: np.ndarray,
                       bm: np.ndarray, layout: str) -> np.ndarray:
        """(a s_a) @ (b s_b).T with the scale factors in this CTA's TMEM (see
        :mod:`.tcgen05_scaled`): each lane quarter of D (data path ``layout``, D
        or B) its rows' A scales and its columns' B scales."""
        vec, n, k, rows = f["vec"], bm.shape[0], a.shape[1], a.shape[0]
        sa_lane, sa_col = (int(x) for x in tmem.split(val(self.sa_s)))
        sb_lane, sb_col = (int(x) for x in tmem.split(val(self.sb_s)))
        if sa_lane or sb_lane:
            raise EmulationError(f"{self.op} at {self.loc}: scale factors at TMEM lane "
                                 f"{sa_lane or sb_lane}; they start at lane 0")
        # the quarters: (first row, first column, columns) -- layout B: the column
        # halves in lanes 0-63 and 64-127
        halves = 2 if layout == "B" else 1
        width = n // halves
        out = np.empty((rows, n))
        for q in range(4):
            r0, c0 = 32 * (q % (rows // 32)), width * (q // (rows // 32))
            r = r0 + np.arange(32)
            c = np.arange(width)
            a_lanes, a_cols = 32 * q + r % 32, sa_col + r // 32
            b_lanes, b_cols = 32 * q + c % 32, sb_col + c // 32
            t.check_columns(np.concatenate([a_cols, b_cols]), self.op, self.loc)
            if check:
                check(t.space, t.byte_addresses(a_lanes, a_cols), False, False)
                check(t.space, t.byte_addresses(b_lanes, b_cols), False, False)
            s_a, s_b = (scaled.decode_scales(scaled.scale_bytes(t.cells[lanes, cols], first,
                                                                vec), f["scale_type"])
                        for lanes, cols, first in ((a_lanes, a_cols, f["a_id"]),
                                                   (b_lanes, b_cols, f["b_id"])))
            aq = a[r] * np.repeat(s_a, k // vec, axis=-1)
            bq = bm[c0: c0 + width] * np.repeat(s_b, k // vec, axis=-1)
            out[r, c0: c0 + width] = aq @ bq.T
        return out

    def smem_operand(self, blk, check, desc: int, mn: int, k: int, el: np.dtype,
                     trans: int, wide) -> np.ndarray:
        """The (mn, k) operand's values at an SMEM descriptor in block ``blk``'s SMEM."""
        where = types.SimpleNamespace(mem={"shared": blk.smem})
        if el == scaled.FP4:  # two a byte, K-major
            return _values(_read_operand(where, desc, mn, k // 2, np.dtype(np.uint8), trans,
                                         self.loc, check and check.smem_of(blk.smem),
                                         "tcgen05.mma"), el, wide)
        return _read_operand(where, desc, mn, k, el, trans, self.loc,
                             check and check.smem_of(blk.smem), "tcgen05.mma").astype(wide)


class _MmaCheck:
    """The checker's view of one MMA: its accesses are checked against what the
    issuing thread's warp knows (and every earlier MMA of the thread, which
    the hardware pipelines in order) and recorded under the thread's MMA unit
    with the number of its next commit."""

    def __init__(self, sync, view, comp: int, stamp: int, agent: str, site) -> None:
        self.sync, self.view, self.comp, self.stamp = sync, view, comp, stamp
        self.agent, self.site = agent, site

    def __call__(self, space, addrs, is_write: bool, proxy_read: bool) -> None:
        self.sync.async_access(self.view, space, addrs, 4, is_write, self.site, self.comp,
                               self.stamp, self.agent, proxy_read=proxy_read)

    def smem_of(self, space):
        """The check of an SMEM operand read (through the async proxy) in ``space``."""
        def smem(addrs, itemsize: int) -> None:
            self.sync.async_access(self.view, space, addrs, itemsize, False, self.site,
                                   self.comp, self.stamp, self.agent, proxy_read=True)
        return smem


def _mma_state(sync: Checker, fr: Frame, th: int) -> tuple[list[int], str]:
    flat = int(fr.block.flat[th])
    agent = f"tcgen05 MMAs of block {fr.block.block_id} thread {flat}"
    return sync.unit((TCGEN05, fr.block.rank, flat), TCGEN05, agent), agent


def _mma_unit(fr: Frame, th: int, site) -> _MmaCheck | None:
    sync = fr.sync
    if sync is None:
        return None
    st, agent = _mma_state(sync, fr, th)
    stamp = st[1] + 1
    view = sync.clocks.view(int(fr.block.warp_rows[th]))
    if view.size <= st[0]:
        view = np.concatenate([view, np.zeros(st[0] + 1 - view.size, view.dtype)])
    view[st[0]] = stamp  # this thread's earlier MMAs are ordered before this one
    return _MmaCheck(sync, view, st[0], stamp, agent, site)


# --- commit and fences ------------------------------------------------------------------------

def _commit(fr: Frame, slots: list[int], where: str, multicast: bool) -> None:
    """``tcgen05.commit[.multicast::cluster]``: each executing thread's MMAs so far
    complete (they have), then one arrival on its mbarrier -- with multicast, on
    the mbarrier at the same offset in every CTA of the 16-bit mask."""
    b = fr.need_block("tcgen05.commit", where)
    addrs = per_thread(fr.regs[slots[0]], fr.T).astype(np.int64)
    masks = per_thread(fr.regs[slots[1]], fr.T).astype(np.int64) if multicast else None
    sync = fr.sync
    for th in np.flatnonzero(effective(fr, [])):
        if masks is None:
            targets = [b]
        else:
            mask = int(masks[th]) & 0xFFFF
            targets = [b.peer(r, where) for r in range(16) if mask >> r & 1]
        if sync is not None:
            st, _ = _mma_state(sync, fr, th)
            st[1] += 1
        for blk in targets:
            bar = blk.barrier(int(addrs[th]), where)
            if sync is not None:
                bar.point.stamp(st[0], st[1])
                sync.release(int(b.warp_rows[th]), bar.point)
            bar.arrive(1, where)


INTRINSICS = {"llvm.nvvm.tcgen05.commit.cg1": (1, False),
              "llvm.nvvm.tcgen05.commit.mc.cg2": (2, True)}


@rule("llvm.call_intrinsic")
def call_intrinsic(o: Op) -> Step:
    from jax._src.lib.mlir import ir
    name = ir.StringAttr(o.attr("intrin")).value
    form = INTRINSICS.get(name)
    if form is None:
        raise o.unsupported(f"LLVM intrinsic {name}")
    n, multicast = form
    if len(o.ins) != n or o.in_types[0].space != "shared":
        raise o.unsupported(f"LLVM intrinsic {name} with operands "
                            f"{[t.text for t in o.in_types]}")
    slots, loc = list(o.ins), o.loc
    return lambda fr: _commit(fr, slots, loc, multicast)


@rule("nvvm.tcgen05.fence")
def tcgen05_fence(o: Op) -> Step:
    """``tcgen05.fence::before/after_thread_sync``: nothing to do in lockstep (see the
    module docstring for the checker's reading)."""
    return lambda fr: None
