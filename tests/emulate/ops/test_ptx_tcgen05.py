"""tcgen05 inline PTX (:mod:`smalti.emulate.ops.tcgen05`), op by op as jax's
``mosaic_gpu/tcgen05.py`` writes it: TMEM allocation by a whole warp
(``cta_group::1`` in a block, ``::2`` in each CTA of a pair), its address
read back from SMEM, ``tcgen05.st`` of every shape (with ``.unpack::16b``)
read back cell by cell with ``tcgen05.ld.32x32b`` and against the PTX ISA's
matrix fragments, ``.pack::16b`` loads, ``tcgen05.ld.red`` min/max (``.abs``,
``.NaN``) against numpy on edge values, the waits and fences, the
deallocation, and the rules as errors -- under the synchronization checker.
MMAs with 64 rows a CTA (kind::i8, exact): a known product placed by
M = 64 MMAs (data path layout F, lane alignment 0 and 16, A from SMEM and
from TMEM, accumulating) and by an M = 128 MMA over a CTA pair (layout B),
read back lane by lane against the layouts' lanes, every other cell
untouched; the lane and M rules as errors. Every modelled ``tcgen05.cp``
form (128x256b, 128x128b, 64x128b.warpx2::02_13 and ::01_23, 32x128b.warpx4;
cta_group::1 and ::2) from a hand-written SMEM image, bit-exact in the lanes
its multicast names and nowhere else; reading a copy before its commit is
waited for, a race with both lines; the forms not modelled, Unsupported.
jax's own MMA and SMEM -> TMEM copy blocks run in its kernels
(:mod:`tests.emulate.test_tcgen05`)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from smalti.emulate.errors import EmulationError

from .harness import assert_same_bits, covers, float_edges, int_edges, recording_kernels, run
from .test_ptx import LAUNCH, cluster_launch, form, side

ALLOC = "tcgen05.alloc.cta_group::{g}.sync.aligned.shared::cta.b32 [$0], $1;"
DEALLOC = "tcgen05.dealloc.cta_group::{g}.sync.aligned.b32 $0, $1;"
RELINQUISH = "tcgen05.relinquish_alloc_permit.cta_group::{g}.sync.aligned;"
WAIT_ST, WAIT_LD = "tcgen05.wait::st.sync.aligned;", "tcgen05.wait::ld.sync.aligned;"
MOVE_FORM = form("tcgen05.st.sync.aligned.32x32b.x1.b32 [$1], {$0};")
RED_FORM = form("tcgen05.ld.red.sync.aligned.32x32b.x2.max.NaN.f32 {$0,$1}, $2, [$3];")
REGS = {"32x32b": 1, "16x64b": 1, "16x128b": 2, "16x256b": 4}  # registers a repetition
NCOLS = 32
SENTINEL = -0x5A5A5A5B


def _ld(shape: str, num: int, regs: int, suffix: str = ".b32", red: str = "") -> tuple[str, str]:
    """(the ``%ld`` inline_asm loading ``regs`` registers (and a reduction) at
    %taddr, its struct type), as jax writes it."""
    n = regs + (1 if red else 0)
    vec = "{" + ",".join(f"${k}" for k in range(regs)) + "}"
    text = (f"tcgen05.ld{'.red' if red else ''}.sync.aligned.{shape}.x{num}{red}{suffix} {vec}"
            f"{f', ${regs}' if red else ''}, [${n}];")
    ty = f"!llvm.struct<({', '.join(['i32'] * n)})>"
    return (f'%ld = llvm.inline_asm has_side_effects "{text}", "{"=r," * n}r" %taddr : '
            f"(i32) -> {ty}"), ty


def _st(shape: str, num: int, names: list[str], unpack: bool = False) -> str:
    vec = "{" + ",".join(f"${k}" for k in range(len(names))) + "}"
    text = (f"tcgen05.st.sync.aligned.{shape}.x{num}{'.unpack::16b' if unpack else ''}.b32 "
            f"[${len(names)}], {vec};")
    return side(text, "r," * len(names) + "r", *((n, "i32") for n in names), ("%taddr", "i32"))


def _tmem_kernel(inner: str, group: int = 1) -> str:
    """128 threads: warp 0 allocates NCOLS columns (address to SMEM word 0) and
    relinquishes the permit; every thread reads the address into %taddr;
    ``inner``; warp 0 frees the columns. %row: t * 64 (the thread's first
    word in the "regs" and "out" buffers)."""
    return LAUNCH.format(threads=128, smem=256, body=f"""
      %ncols = llvm.mlir.constant({NCOLS} : i32) : i32
      %c32 = llvm.mlir.constant(32 : i32) : i32
      %c64 = llvm.mlir.constant(64 : i32) : i32
      %warp = llvm.udiv %t, %c32 : i32
      %w0 = arith.cmpi eq, %warp, %z : i32
      %row = llvm.mul %t, %c64 : i32
      {side("@$2 " + ALLOC.format(g=group), "l,r,b", ("%smem", "!llvm.ptr<3>"), ("%ncols", "i32"),
            ("%w0", "i1"))}
      {side("@$0 " + RELINQUISH.format(g=group), "b", ("%w0", "i1"))}
      {side("bar.sync 0;")}
      %taddr = llvm.load %smem : !llvm.ptr<3> -> i32
      {inner}
      {side("bar.sync 0;")}
      {side("@$2 " + DEALLOC.format(g=group), "r,r,b", ("%taddr", "i32"), ("%ncols", "i32"),
            ("%w0", "i1"))}""")


def _regs_in(n: int, prefix: str = "v") -> str:
    """%{prefix}k = the thread's word k of the "regs" buffer, for k < n."""
    lines = []
    for k in range(n):
        lines += [f"%{prefix}i{k} = llvm.mlir.constant({k} : i32) : i32",
                  f"%{prefix}a{k} = llvm.add %row, %{prefix}i{k} : i32",
                  f"%{prefix}p{k} = llvm.getelementptr %regs[%{prefix}a{k}] : "
                  f"(!llvm.ptr, i32) -> !llvm.ptr, i32",
                  f"%{prefix}{k} = llvm.load %{prefix}p{k} : !llvm.ptr -> i32"]
    return "\n".join(lines)


def _regs_out(n: int, ty: str, src: str = "%ld", first: int = 0, p: str = "o") -> str:
    """Word ``first + k`` of the thread's row of "out" = field k of ``src``
    (a struct, or the one i32 when ``n`` is 1), for k < n."""
    lines = []
    for k in range(n):
        lines += [f"%{p}{k} = llvm.extractvalue {src}[{k}] : {ty}" if n > 1 or "struct" in ty
                  else f"%{p}{k} = llvm.add {src}, %z : i32",
                  f"%{p}i{k} = llvm.mlir.constant({first + k} : i32) : i32",
                  f"%{p}a{k} = llvm.add %row, %{p}i{k} : i32",
                  f"%{p}p{k} = llvm.getelementptr %out[%{p}a{k}] : (!llvm.ptr, i32) -> "
                  "!llvm.ptr, i32",
                  f"llvm.store %{p}{k}, %{p}p{k} : i32, !llvm.ptr"]
    return "\n".join(lines)


def _run(inner: str, regs: np.ndarray) -> np.ndarray:
    """Runs ``_tmem_kernel(inner)`` with each thread's words (128, 64) in "regs";
    returns "out" (128, 64)."""
    got = run(_tmem_kernel(inner), {"regs": ("!llvm.ptr", regs.astype(np.int32)),
                                    "out": ("!llvm.ptr", np.zeros((128, 64), np.int32))},
              host=True, sanitize=True)
    return got["out"]


def _isa_fragment(shape: str, num: int) -> tuple[np.ndarray, np.ndarray]:
    """(lane, column) of register r of thread l, relative to the warp's address,
    from the PTX ISA's figures (the mma.sync accumulator pattern for the 16-lane
    shapes): 32x32b: lane l, column r; 16x128b: r even at lane l/4, odd 8
    lanes lower, column l%4 (+4 a repetition); 16x256b: pairs of columns
    2(l%4) in lanes l/4 and l/4+8 (+8 columns a repetition)."""
    lane = np.arange(32)[:, None]
    r = np.arange(REGS[shape] * num)[None, :]
    if shape == "32x32b":
        return lane + 0 * r, r + 0 * lane
    if shape == "16x128b":
        return lane // 4 + 8 * (r % 2), lane % 4 + 4 * (r // 2)
    assert shape == "16x256b"
    return lane // 4 + 8 * ((r // 2) % 2), 2 * (lane % 4) + r % 2 + 8 * (r // 4)


def _stored(shape: str, num: int, regs: np.ndarray, unpack: bool) -> np.ndarray:
    """What a 32x32b load of 16 columns gives after a sentinel fill and the
    store of ``regs`` with the ISA's fragment (each register's halves in two
    adjacent columns' low 16 bits with unpack)."""
    want = np.full((128, 16), SENTINEL, np.int64)
    lane, col = _isa_fragment(shape, num)
    n = lane.shape[1]
    for w in range(4):
        for t in range(32):
            for r in range(n):
                v = int(regs[32 * w + t, r]) & 0xFFFFFFFF
                if unpack:
                    want[32 * w + lane[t, r], 2 * col[t, r]] = v & 0xFFFF
                    want[32 * w + lane[t, r], 2 * col[t, r] + 1] = v >> 16
                else:
                    want[32 * w + lane[t, r], col[t, r]] = v
    return want.astype(np.uint32).view(np.int32)


def _fill(ncols: int = 16) -> str:
    """Every thread's lane of the first ``ncols`` columns := SENTINEL (32x32b)."""
    consts = f"%fill = llvm.mlir.constant({SENTINEL} : i32) : i32"
    return consts + "\n" + _st("32x32b", ncols, ["%fill"] * ncols) + "\n" + side(WAIT_ST)


def _readback(ncols: int = 16) -> str:
    ld, ty = _ld("32x32b", ncols, ncols)
    return f"{ld}\n{side(WAIT_LD)}\n{_regs_out(ncols, ty)}"


MOVES = [("32x32b", 8, False), ("16x128b", 4, False), ("16x256b", 2, False),
         ("16x128b", 2, True), ("16x256b", 1, True), ("32x32b", 4, True)]


@pytest.mark.parametrize("shape,num,unpack", MOVES)
@covers(MOVE_FORM, *(form(t.format(g=1)) for t in (ALLOC, DEALLOC, RELINQUISH)),
        form(WAIT_ST), form(WAIT_LD), "nvvm.tcgen05.fence")
def test_a_store_puts_each_register_in_its_isa_cell(shape, num, unpack):
    """Each warp (of 4, at jax's lane-0 address) stores registers holding
    INT_MIN, -1, 0... with ``shape``, then every thread reads its lane's 16
    columns with 32x32b: the cells of the PTX ISA's fragment hold the
    registers, the others still the sentinel."""
    n = REGS[shape] * num
    rng = np.random.default_rng(7)
    regs = np.zeros((128, 64), np.int64)
    regs[:, :n] = rng.permutation(np.resize(int_edges("i32"), (128, n)).reshape(-1)).reshape(128, n)
    names = [f"%v{k}" for k in range(n)]
    inner = f"""
      {_fill()}
      {_regs_in(n)}
      {_st(shape, num, names, unpack)}
      {side(WAIT_ST)}
      nvvm.tcgen05.fence <before>
      {side("bar.sync 0;")}
      nvvm.tcgen05.fence <after>
      {_readback()}"""
    got = _run(inner, regs)
    assert_same_bits(got[:, :16], _stored(shape, num, regs, unpack))


@pytest.mark.parametrize("num", [1, 4])
@covers(MOVE_FORM)
def test_a_16x64b_store_fills_16_lanes_of_2_columns_a_repetition_once(num):
    """jax does not write 16x64b; the ISA's shape: 16 lanes by 64 bits a
    repetition, every cell once, and a 16x64b load gives the registers back."""
    n = num
    regs = np.zeros((128, 64), np.int64)
    regs[:, :n] = np.arange(128 * n).reshape(128, n) + 1000
    ld, ty = _ld("16x64b", num, n)
    inner = f"""
      {_fill()}
      {_regs_in(n)}
      {_st("16x64b", num, [f"%v{k}" for k in range(n)])}
      {side(WAIT_ST)}
      {_readback()}
      {side("bar.sync 0;")}
      {ld.replace("%ld", "%back")}
      {side(WAIT_LD)}
      {_regs_out(n, ty, "%back", 16, "b")}"""
    got = _run(inner, regs)
    for w in range(4):
        cells = got[32 * w: 32 * w + 32, :16]
        written = cells != SENTINEL
        assert written[:16, :2 * num].all() and not written[16:].any() \
            and not written[:, 2 * num:].any()
        assert sorted(cells[written].tolist()) == sorted(regs[32 * w: 32 * w + 32, :n].reshape(-1)
                                                         .tolist())
    assert_same_bits(got[:, 16:16 + n], regs[:, :n].astype(np.int32))


@pytest.mark.parametrize("shape,num", [("16x128b", 2), ("16x256b", 1), ("32x32b", 4)])
@covers(MOVE_FORM)
def test_a_pack_load_joins_the_low_halves_of_two_columns(shape, num):
    """Stored with .unpack::16b, loaded with .pack::16b: the registers again."""
    n = REGS[shape] * num
    regs = np.zeros((128, 64), np.int64)
    regs[:, :n] = np.resize(int_edges("i32"), (128, n))
    ld, ty = _ld(shape, num, n, suffix=".pack::16b.b32")
    inner = f"""
      {_regs_in(n)}
      {_st(shape, num, [f"%v{k}" for k in range(n)], unpack=True)}
      {side(WAIT_ST)}
      {ld}
      {side(WAIT_LD)}
      {_regs_out(n, ty)}"""
    assert_same_bits(_run(inner, regs)[:, :n], regs[:, :n].astype(np.int32))


RED_CASES = [("max", "", ".NaN", "f32"), ("min", "", ".NaN", "f32"), ("max", ".abs", ".NaN", "f32"),
             ("min", ".abs", ".NaN", "f32"), ("max", "", "", "f32"), ("min", "", "", "f32"),
             ("max", "", "", "s32"), ("min", "", "", "s32"), ("max", "", "", "u32"),
             ("min", "", "", "u32")]


@pytest.mark.parametrize("how,absolute,nan,ty", RED_CASES)
@covers(RED_FORM, MOVE_FORM)
def test_a_reducing_load_gives_each_thread_the_min_max_of_its_words(how, absolute, nan, ty):
    """jax's ``.max/min[.abs].NaN.f32`` and ``.s32``/``.u32`` (absmax of i32);
    without .NaN a NaN is ignored (a row of NaNs gives NaN); over edge values:
    +-0, +-inf, NaN, the extremes."""
    n = 8
    rng = np.random.default_rng(11)
    if ty == "f32":
        pool = float_edges("f32")
        words = rng.choice(pool, (128, n))
        words[0] = np.nan
        words[1, :3] = np.nan
        words[2] = [-0.0, 0.0] * 4
        bits = words.astype(np.float32).view(np.int32)
    else:
        bits = rng.choice(np.array(int_edges("i32"), np.int64), (128, n)).astype(np.int32)
    regs = np.zeros((128, 64), np.int64)
    regs[:, :n] = bits
    ld, ty_struct = _ld("32x32b", n, n, suffix=f"{absolute}{nan}.{ty}", red=f".{how}")
    inner = f"""
      {_regs_in(n)}
      {_st("32x32b", n, [f"%v{k}" for k in range(n)])}
      {side(WAIT_ST)}
      {ld}
      {side(WAIT_LD)}
      {_regs_out(n + 1, ty_struct)}"""
    got = _run(inner, regs)
    assert_same_bits(got[:, :n], bits)
    if ty == "f32":
        x = bits.view(np.float32).astype(np.float64)
        x = np.abs(x) if absolute else x
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # rows of NaNs only
            fn = {("max", True): np.max, ("min", True): np.min, ("max", False): np.nanmax,
                  ("min", False): np.nanmin}[how, bool(nan)]
            want = fn(x, axis=1)
        np.testing.assert_array_equal(got[:, n].view(np.float32).astype(np.float64), want)
        # the row of zeros of both signs: +0.0 > -0.0, as PTX max/min order them
        zero = got[2, n].view(np.float32)
        assert zero == 0 and np.signbit(zero) == (how == "min" and not absolute)
    else:
        x = bits.view(np.uint32) if ty == "u32" else bits
        want = (x.max(1) if how == "max" else x.min(1)).astype(x.dtype).view(np.int32)
        assert_same_bits(got[:, n], want)


@covers(*(form(t.format(g=2)) for t in (ALLOC, DEALLOC, RELINQUISH)))
def test_a_cta_pair_allocates_frees_and_relinquishes_in_each_cta():
    """cta_group::2 in a cluster of 2: warp 0 of each CTA allocates 64
    columns (column 0 of its own TMEM), writes the address to its SMEM, and
    frees them; the address is what each block's thread reads back."""
    got = run(cluster_launch(f"""
      %ncols = llvm.mlir.constant(64 : i32) : i32
      {side(ALLOC.format(g=2), "l,r", ("%smem", "!llvm.ptr<3>"), ("%ncols", "i32"))}
      {side(RELINQUISH.format(g=2))}
      %taddr = llvm.load %smem : !llvm.ptr<3> -> i32
      {side(DEALLOC.format(g=2), "r,r", ("%taddr", "i32"), ("%ncols", "i32"))}
      %rk = arith.index_cast %rank : i32 to index
      memref.store %taddr, %out[%rk] : memref<2xi32>"""),
              {"out": ("memref<2xi32>", np.full(2, -1, np.int32))}, host=True, sanitize=True)
    assert got["out"].tolist() == [0, 0]


@covers(form(ALLOC.format(g=1)), form(ALLOC.format(g=2)), MOVE_FORM)
def test_the_tmem_rules_are_errors():
    """Part of a warp allocating; an allocation after the permit is given up;
    cta_group::2 outside a pair; a load of columns never allocated."""
    from smalti.emulate.tmem import TmemError

    def kernel(body: str) -> str:
        return LAUNCH.format(threads=32, smem=64, body=f"""
          %ncols = llvm.mlir.constant(32 : i32) : i32
          {body}""")
    half = "%c16 = llvm.mlir.constant(16 : i32) : i32\n%lo = arith.cmpi ult, %t, %c16 : i32\n"
    with pytest.raises(EmulationError, match="executed by 16 threads of a warp"):
        run(kernel(half + side("@$2 " + ALLOC.format(g=1), "l,r,b", ("%smem", "!llvm.ptr<3>"),
                               ("%ncols", "i32"), ("%lo", "i1"))), host=True)
    with pytest.raises(TmemError, match="after tcgen05.relinquish_alloc_permit"):
        run(kernel(side(RELINQUISH.format(g=1)) + "\n" + side(
            ALLOC.format(g=1), "l,r", ("%smem", "!llvm.ptr<3>"), ("%ncols", "i32"))), host=True)
    with pytest.raises(EmulationError, match="cta_group::2 needs CTA pairs"):
        run(kernel(side(ALLOC.format(g=2), "l,r", ("%smem", "!llvm.ptr<3>"), ("%ncols", "i32"))),
            host=True)
    beyond = ('%c64 = llvm.mlir.constant(64 : i32) : i32\n'  # column 64 of 32 allocated
              '%ld = llvm.inline_asm has_side_effects "tcgen05.ld.sync.aligned.32x32b.x1.b32 '
              '{$0}, [$1];", "=r,r" %c64 : (i32) -> i32')
    with pytest.raises(TmemError, match="not allocated"):
        run(kernel(side(ALLOC.format(g=1), "l,r", ("%smem", "!llvm.ptr<3>"), ("%ncols", "i32"))
                   + "\n" + beyond), host=True)


# --- M = 64 MMAs: data path layout F -------------------------------------------------------

MMA_SMEM = 4096  # bytes: [0, 8) the MMA's mbarrier, [8, 12) the TMEM address, A and B from 1024
A_OFF, B1_OFF, B2_OFF = 1024, 3072, 3584  # A: 64 rows x 32 bytes; B1, B2: 16 rows x 32 bytes
MMA_COLS = 64
SBO_32B = 256  # 8 rows of 32 bytes: the next 8-row group


def _swizzle32(addr: np.ndarray) -> np.ndarray:
    """The PTX ISA's 32-byte swizzle: the 16-byte chunk bit (4) XORed with bit 7."""
    return addr ^ (((addr >> 7) & 1) << 4)


def _smem_image(a: np.ndarray, b1: np.ndarray, b2: np.ndarray) -> np.ndarray:
    """SMEM bytes A_OFF.. as K-major 32-byte-swizzled operands (row i of a
    matrix at 32 i from its start, before the swizzle): the words to copy in."""
    img = np.zeros(MMA_SMEM - A_OFF, np.uint8)
    for m, off in ((a, A_OFF), (b1, B1_OFF), (b2, B2_OFF)):
        i, j = np.indices(m.shape)
        img[_swizzle32(off + 32 * i + j) - A_OFF] = m.view(np.uint8)
    return img.view(np.int32)


def _mma_asm(a_tmem: bool, hi: int, group: int) -> str:
    """jax's tcgen05.mma block for kind::i8 (descriptor high words ``hi``)."""
    a_reg, a_mov = ("b32", "mov.b32 a_desc, a_desc_low;") if a_tmem else \
        ("b64", f"mov.b64 a_desc, {{a_desc_low, {hi}}};")
    return ("{ .reg .b32 a_desc_low, a_desc_high, b_desc_low, b_desc_high; "
            f".reg .{a_reg} a_desc; .reg .b64 b_desc; add.s32 a_desc_low, $1, 0; "
            f"add.s32 b_desc_low, $2, 0; mov.b64 b_desc, {{b_desc_low, {hi}}}; {a_mov} "
            f"tcgen05.mma.cta_group::{group}.kind::i8 [$0], "
            f"{'[a_desc]' if a_tmem else 'a_desc'}, b_desc, $3, $4; }}")


def _idesc_i8(m: int, n: int) -> int:
    """A kind::i8 instruction descriptor: s32 D (4-5), s8 A and B (7-9, 10-12),
    N >> 3 (17-22), M >> 4 (24-28)."""
    return (2 << 4) | (1 << 7) | (1 << 10) | ((n >> 3) << 17) | ((m >> 4) << 24)


def _issue(mmas: list[tuple[int, int | str, int, int, int]], group: int) -> list[str]:
    """The MMAs' inline PTX: (D address offset, A: "smem" or a TMEM offset, B's
    SMEM offset, N, accumulate), 64 rows of A and D a CTA."""
    hi = (SBO_32B >> 4) | (3 << 30)  # SBO, 32-byte swizzle (mode 3 in bits 62-63)
    issue = []
    for k, (d_off, a, b_off, n, acc) in enumerate(mmas):
        a_val = "%adesc" if a == "smem" else f"%aaddr{k}"
        issue += [f"%doff{k} = llvm.mlir.constant({d_off} : i32) : i32",
                  f"%daddr{k} = llvm.add %taddr, %doff{k} : i32",
                  f"%bo{k} = llvm.mlir.constant({(b_off >> 4) | (1 << 16)} : i32) : i32",
                  f"%bdesc{k} = llvm.add %sdesc, %bo{k} : i32",
                  f"%id{k} = llvm.mlir.constant({_idesc_i8(64 * group, n)} : i32) : i32",
                  f"%acc{k} = llvm.mlir.constant({acc} : i1) : i1"]
        if a != "smem":
            issue += [f"%aoff{k} = llvm.mlir.constant({a} : i32) : i32",
                      f"%aaddr{k} = llvm.add %taddr, %aoff{k} : i32"]
        issue.append(side(_mma_asm(a != "smem", hi, group), "r,r,r,r,b",
                          (f"%daddr{k}", "i32"), (a_val, "i32"), (f"%bdesc{k}", "i32"),
                          (f"%id{k}", "i32"), (f"%acc{k}", "i1")))
    return issue


def _m64_kernel(mmas: list[tuple[int, int | str, int, int, int]], pair: bool = False,
                issue: list[str] | None = None, smem: int = MMA_SMEM,
                wait: bool = True) -> str:
    """128 threads a CTA (``pair``: two CTAs of a cluster, cta_group::2): warp 0
    allocates MMA_COLS columns; the CTA's SMEM image (its row of "img", bytes
    A_OFF to ``smem``) is copied in; every warp fills its lanes with SENTINEL
    and stores its threads' words 0..7 of "regs" at columns 16-23 (A for the
    MMAs from TMEM); thread 0 (of CTA 0) issues ``mmas`` (:func:`_issue`; or
    the lines ``issue``) and commits them (to both CTAs' mbarriers); every
    thread reads its lane's MMA_COLS columns back into its row of "out" (the
    CTA's 128 rows, CTA 0's first) -- after waiting for the commit's
    mbarrier, or (not ``wait``) before."""
    g = 2 if pair else 1
    words = (smem - A_OFF) // 4
    copy = ["%cw = llvm.mlir.constant(" + str(words) + " : i32) : i32",
            "%img0 = llvm.mul %rank, %cw : i32"]
    for q in range(words // 128):
        copy += [f"%cq{q} = llvm.mlir.constant({128 * q} : i32) : i32",
                 f"%iq{q} = llvm.add %t, %cq{q} : i32",
                 f"%jq{q} = llvm.add %img0, %iq{q} : i32",
                 f"%gq{q} = llvm.getelementptr %img[%jq{q}] : (!llvm.ptr, i32) -> !llvm.ptr, i32",
                 f"%vq{q} = llvm.load %gq{q} : !llvm.ptr -> i32",
                 f"%sq{q} = llvm.getelementptr %abase[%iq{q}] : (!llvm.ptr<3>, i32) -> "
                 "!llvm.ptr<3>, i32",
                 f"llvm.store %vq{q}, %sq{q} : i32, !llvm.ptr<3>"]
    if pair:
        sync = "\n".join(side(f"barrier.cluster.{x}.aligned;") for x in ("arrive", "wait"))
        commit = ("%mask = llvm.mlir.constant(3 : i16) : i16\n"
                  'llvm.call_intrinsic "llvm.nvvm.tcgen05.commit.mc.cg2"(%smem, %mask) : '
                  "(!llvm.ptr<3>, i16) -> ()")
        head = ("%r0 = arith.cmpi eq, %rank, %z : i32\n"
                "%issuer = arith.andi %first, %r0 : i1")
    else:
        sync = ""
        commit = 'llvm.call_intrinsic "llvm.nvvm.tcgen05.commit.cg1"(%smem) : (!llvm.ptr<3>) -> ()'
        head = ("%rank = llvm.mlir.constant(0 : i32) : i32\n"
                "%one = llvm.mlir.constant(1 : i32) : i32\n"
                "%issuer = arith.andi %first, %first : i1")
    nl = "\n"
    mbar_wait = ("nvvm.mbarrier.try_wait.parity %smem, %z, %z : !llvm.ptr<3>, i32, i32\n"
                 "nvvm.tcgen05.fence <after>")
    ld, ty = _ld("32x32b", MMA_COLS, MMA_COLS)
    a_st = _st("32x32b", 8, [f"%v{k}" for k in range(8)]).replace("%taddr", "%acols")
    body = f"""
      {head}
      %ncols = llvm.mlir.constant({MMA_COLS} : i32) : i32
      %c32 = llvm.mlir.constant(32 : i32) : i32
      %c64 = llvm.mlir.constant(64 : i32) : i32
      %c16 = llvm.mlir.constant(16 : i32) : i32
      %c128 = llvm.mlir.constant(128 : i32) : i32
      %warp = llvm.udiv %t, %c32 : i32
      %w0 = arith.cmpi eq, %warp, %z : i32
      %rt0 = llvm.mul %rank, %c128 : i32
      %rt = llvm.add %rt0, %t : i32
      %row = llvm.mul %rt, %c64 : i32
      %slot = llvm.getelementptr %smem[8] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
      %abase = llvm.getelementptr %smem[{A_OFF}] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
      %sbase = llvm.ptrtoint %smem : !llvm.ptr<3> to i32
      %c4 = llvm.mlir.constant(4 : i32) : i32
      %sdesc = llvm.lshr %sbase, %c4 : i32
      %ao = llvm.mlir.constant({(A_OFF >> 4) | (1 << 16)} : i32) : i32
      %adesc = llvm.add %sdesc, %ao : i32
      {side("@$2 " + ALLOC.format(g=g), "l,r,b", ("%slot", "!llvm.ptr<3>"), ("%ncols", "i32"),
            ("%w0", "i1"))}
      {side("@$0 " + RELINQUISH.format(g=g), "b", ("%w0", "i1"))}
      {side("@$2 mbarrier.init.shared::cta.b64 [$0], $1;", "l,r,b", ("%smem", "!llvm.ptr<3>"),
            ("%one", "i32"), ("%first", "i1"))}
      {nl.join(copy)}
      {side("fence.proxy.async.shared::cta;")}
      {side("bar.sync 0;")}
      %taddr = llvm.load %slot : !llvm.ptr<3> -> i32
      {_fill(MMA_COLS)}
      {_regs_in(8)}
      %acols = llvm.add %taddr, %c16 : i32
      {a_st}
      {side(WAIT_ST)}
      nvvm.tcgen05.fence <before>
      {side("bar.sync 0;")}
      {sync}
      nvvm.tcgen05.fence <after>
      scf.if %issuer {{
        {nl.join(_issue(mmas, g) if issue is None else issue)}
        {commit}
      }}
      {mbar_wait if wait else ""}
      {ld}
      {side(WAIT_LD)}
      {_regs_out(MMA_COLS, ty)}
      {"" if wait else mbar_wait}
      {side("bar.sync 0;")}
      {side("@$2 " + DEALLOC.format(g=g), "r,r,b", ("%taddr", "i32"), ("%ncols", "i32"),
            ("%w0", "i1"))}"""
    if pair:
        return cluster_launch(body, smem=smem, threads=128)
    return LAUNCH.format(threads=128, smem=smem, body=body)


def _layout_f(r: np.ndarray, alignment: int) -> np.ndarray:
    """The PTX ISA's layout F (M = 64): rows 16 w .. 16 w + 15 in the 16 lanes of
    warp w's quarter from the lane alignment (0 or 16)."""
    return 32 * (r // 16) + alignment + r % 16


def _run_m64(mmas, a, b1, b2) -> np.ndarray:
    """Runs ``_m64_kernel(mmas)`` with A also in TMEM columns 16-23 of layout F's
    lanes (alignment 0); returns the (128 lanes, MMA_COLS) cells read back."""
    regs = np.full((128, 64), SENTINEL, np.int64)
    regs[_layout_f(np.arange(64), 0), :8] = a.view(np.int32)
    got = run(_m64_kernel(mmas), {
        "img": ("!llvm.ptr", _smem_image(a, b1, b2)),
        "regs": ("!llvm.ptr", regs.astype(np.int32)),
        "out": ("!llvm.ptr", np.zeros((128, 64), np.int32))}, host=True, sanitize=True)
    return got["out"][:, :MMA_COLS]


def _int8_operands(rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A (64 x 32), B1 and B2 (16 x 32) s8 with the extremes: products of
    -128 x -128 summed over a row reach 2^19, and mixed signs cancel."""
    a = rng.integers(-128, 128, (64, 32)).astype(np.int8)
    b1, b2 = (rng.integers(-128, 128, (16, 32)).astype(np.int8) for _ in range(2))
    a[0], b1[0] = -128, -128  # D[0, 0] = 32 * 2^14
    a[1], b1[1] = 127, -128
    a[63, ::2], a[63, 1::2] = -1, 1
    return a, b1, b2


MMA_FORM = r".*tcgen05\.mma.*"


@covers(MMA_FORM, "llvm.call_intrinsic", MOVE_FORM)
def test_an_m64_mma_puts_row_r_in_layout_f_lanes():
    """M = 64 (cta_group::1, kind::i8, A and B from 32-byte-swizzled SMEM): D's
    row r lands in lane 32 (r // 16) + r % 16 (lane alignment 0) or 16 lanes
    on (alignment 16, a second MMA with another B at D address lane 16), its
    N = 16 columns from the address's; every other cell keeps its sentinel.
    Exact against numpy, lane by lane."""
    a, b1, b2 = _int8_operands(np.random.default_rng(64))
    got = _run_m64([(0, "smem", B1_OFF, 16, 0), (16 << 16, "smem", B2_OFF, 16, 0)], a, b1, b2)
    want = np.full((128, MMA_COLS), SENTINEL, np.int64)
    r = np.arange(64)
    want[_layout_f(r, 0), 16:24] = a.view(np.int32)  # A, stored for the TMEM MMAs
    want[_layout_f(r, 0), :16] = a.astype(np.int64) @ b1.T.astype(np.int64)
    want[_layout_f(r, 16), :16] = a.astype(np.int64) @ b2.T.astype(np.int64)
    assert_same_bits(got, want.astype(np.int32))


@covers(MMA_FORM)
def test_an_m64_mma_reads_a_from_tmem_in_layout_f_and_accumulates():
    """A from TMEM (its rows in layout F's lanes, alignment 0, columns 16-23):
    D (N = 8, columns 24-31) = A B1[:8]^T, then += A B2[:8]^T (enable-input-d);
    exact, and in layout F's lanes only."""
    a, b1, b2 = _int8_operands(np.random.default_rng(65))
    got = _run_m64([(24, 16, B1_OFF, 8, 0), (24, 16, B2_OFF, 8, 1)], a, b1, b2)
    want = np.full((128, MMA_COLS), SENTINEL, np.int64)
    r = np.arange(64)
    want[_layout_f(r, 0), 16:24] = a.view(np.int32)
    want[_layout_f(r, 0), 24:32] = a.astype(np.int64) @ (b1[:8].T.astype(np.int64)
                                                        + b2[:8].T.astype(np.int64))
    assert_same_bits(got, want.astype(np.int32))



@covers(MMA_FORM, "llvm.call_intrinsic", form(ALLOC.format(g=2)))
def test_an_m128_pair_mma_folds_d_columns_into_layout_b_lanes():
    """cta_group::2 with M = 128 (64 rows of A and D a CTA: layout B), N = 32,
    B's rows split 16 a CTA (the even CTA's first): each CTA's D row r has
    its first 16 columns in lane r and the other 16 in lane 64 + r, in the
    same TMEM columns; every other cell keeps its sentinel. Exact, CTA by CTA."""
    rng = np.random.default_rng(128)
    (a0, b_even, _), (a1, b_odd, _) = _int8_operands(rng), _int8_operands(rng)
    unused = np.zeros((16, 32), np.int8)
    got = run(_m64_kernel([(0, "smem", B1_OFF, 32, 0)], pair=True), {
        "img": ("!llvm.ptr", np.stack([_smem_image(a0, b_even, unused),
                                       _smem_image(a1, b_odd, unused)])),
        "regs": ("!llvm.ptr", np.full((256, 64), SENTINEL, np.int32)),
        "out": ("!llvm.ptr", np.zeros((256, 64), np.int32))}, host=True, sanitize=True)["out"]
    b = np.concatenate([b_even, b_odd]).astype(np.int64)
    for cta, a in enumerate((a0, a1)):
        d = a.astype(np.int64) @ b.T
        want = np.full((128, MMA_COLS), SENTINEL, np.int64)
        want[:64, :16], want[64:, :16] = d[:, :16], d[:, 16:]
        assert_same_bits(got[128 * cta: 128 * cta + 128], want.astype(np.int32))


@covers(MMA_FORM)
def test_a_in_tmem_with_layout_b_is_unsupported():
    """A from TMEM in an M = 128 pair MMA (64 rows a CTA): not modelled, said so."""
    from smalti.emulate.errors import Unsupported

    a, b1, b2 = _int8_operands(np.random.default_rng(67))
    with pytest.raises(Unsupported, match="A in TMEM with 64 rows a CTA of a pair is not "
                       "modelled"):
        run(_m64_kernel([(0, 16, B1_OFF, 32, 0)], pair=True), {
            "img": ("!llvm.ptr", np.stack([_smem_image(a, b1, b2)] * 2)),
            "regs": ("!llvm.ptr", np.full((256, 64), SENTINEL, np.int32)),
            "out": ("!llvm.ptr", np.zeros((256, 64), np.int32))}, host=True)

@covers(MMA_FORM)
def test_the_m64_lane_rules_are_errors():
    """Layout F starts at lane 0 or 16 (D at lane 8 is an error), and A in TMEM
    must use D's lane alignment (A at lane 16 for D at lane 0 is one)."""
    a, b1, b2 = _int8_operands(np.random.default_rng(66))
    with pytest.raises(EmulationError, match=r"D at TMEM lane 8; with M = 64 \(data path "
                       r"layout F\) it starts at lane 0 or 16"):
        _run_m64([(8 << 16, "smem", B1_OFF, 16, 0)], a, b1, b2)
    with pytest.raises(EmulationError, match="A at TMEM lane 16 and D at lane 0; with M = 64"):
        _run_m64([(24, (16 << 16) + 16, B1_OFF, 8, 0)], a, b1, b2)


def test_the_m_values_the_isa_has_and_what_is_not_modelled():
    """cta_group::1 takes M = 64 or 128 (N a multiple of 8 with 64, of 16 with
    128), cta_group::2 M = 128 or 256; any other M is an error. Sparse M = 64
    (its metadata in half the lanes) is Unsupported, not guessed."""
    from smalti.emulate.errors import Unsupported
    from smalti.emulate.ops.tcgen05 import _idesc

    def desc(m: int, n: int, sparse: int = 0) -> int:
        return (1 << 4) | ((n >> 3) << 17) | ((m >> 4) << 24) | (sparse << 2)  # f16 -> f32

    assert _idesc(desc(64, 8), "f16", 1, False, "here")["m"] == 64
    assert _idesc(desc(128, 64), "f16", 2, False, "here")["m"] == 128
    for m, ctas in ((32, 1), (96, 1), (256, 1), (64, 2), (192, 2)):
        with pytest.raises(EmulationError, match=f"has M = {m}: cta_group::{ctas} takes M = "):
            _idesc(desc(m, 64), "f16", ctas, False, "here")
    with pytest.raises(EmulationError, match="with M = 128, N must be a multiple of 16"):
        _idesc(desc(128, 8), "f16", 1, False, "here")
    with pytest.raises(EmulationError, match="with M = 64, N must be a multiple of 8"):
        _idesc(desc(64, 264), "f16", 1, False, "here")
    with pytest.raises(Unsupported, match="tcgen05.mma.sp.cta_group::1 with M = 64"):
        _idesc(desc(64, 64, sparse=1), "f16", 1, True, "here")

# --- what only jax's code generators write whole: its kernels -----------------------------

@covers(r".*tcgen05\.mma.*", "llvm.call_intrinsic")
def test_an_mma_block_as_jax_writes_it():
    """f16 (128, 64) x (64, 64) -> f32 through jax's lowering, A in TMEM, committed
    with llvm.nvvm.tcgen05.commit.cg1; within the MMA bound of numpy's product."""
    from .. import test_tcgen05 as bw

    call, a_shape, b_shape = bw.mma_kernel(**bw.MMAS["f16-a-in-tmem-n64"])
    a, b = bw.normal(a_shape, np.float16), bw.normal(b_shape, np.float16)
    with recording_kernels():
        (got,) = bw.run(call, a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(got - want) <= bw.mma_bound(a.astype(np.float64), b.astype(np.float64)))


@pytest.mark.parametrize("swizzle", [128, None], ids=["128x256b", "128x128b"])
@covers(form("tcgen05.cp.cta_group::1.128x256b [$0], $1;"))
def test_an_smem_to_tmem_copy_as_jax_writes_it(swizzle):
    from .. import test_tcgen05 as bw

    x = np.arange(128 * 64, dtype=np.int32).reshape(128, 64) * -977
    x[0, :4] = [-2 ** 31, 2 ** 31 - 1, -1, 0]
    call, _ = bw.smem_to_tmem_kernel((128, 64), np.int32, swizzle)
    with recording_kernels():
        (got,) = bw.run(call, x)
    assert_same_bits(got, x)


# --- SMEM -> TMEM copies: every tcgen05.cp form, hand-written ---------------------------------

CP_SMEM = A_OFF + 4096  # the source: up to 128 rows x 32 bytes from A_OFF
CP_COL = 36  # the copies' first TMEM column
#: shape and multicast -> (rows, bytes a row, row i's TMEM lanes), as the PTX ISA names the
#: multicasts (the warps named together receive the same rows) and CUTLASS's UTCCP atoms
#: spell them out
CP_FORMS = {
    "128x256b": (128, 32, lambda i: [i]),
    "128x128b": (128, 16, lambda i: [i]),
    "64x128b.warpx2::02_13": (64, 16, lambda i: [i, 64 + i]),
    "64x128b.warpx2::01_23": (64, 16, lambda i: [64 * (i // 32) + i % 32,
                                                  64 * (i // 32) + 32 + i % 32]),
    "32x128b.warpx4": (32, 16, lambda i: [i, 32 + i, 64 + i, 96 + i]),
}


def _cp_source(rows: int, nbytes: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(the (rows, nbytes // 4) words, the SMEM image from A_OFF holding them in
    the canonical no-swizzle layout: 8 x 16-byte core matrices, byte j of row
    i at (i % 8) 16 + (i // 8) SBO + (j // 16) LBO, SBO 128, LBO 16 rows)."""
    words = rng.integers(-2 ** 31, 2 ** 31, (rows, nbytes // 4)).astype(np.int32)
    words[0, :4] = [-2 ** 31, 2 ** 31 - 1, -1, 0]
    words[-1, -1] = SENTINEL  # a copied SENTINEL is still copied
    img = np.zeros(CP_SMEM - A_OFF, np.uint8)
    i, j = np.indices((rows, nbytes))
    img[(i % 8) * 16 + (i // 8) * 128 + (j // 16) * 16 * rows + j % 16] = \
        words.view(np.uint8).reshape(rows, nbytes)
    return words, img.view(np.int32)


def _cp_issue(shape: str, group: int, rows: int) -> list[str]:
    """The copy from A_OFF (no swizzle, SBO 128, LBO 16 rows) to TMEM column CP_COL."""
    lo = (A_OFF >> 4) | ((16 * rows >> 4) << 16)
    return [f"%cpcol = llvm.mlir.constant({CP_COL} : i32) : i32",
            "%cpaddr = llvm.add %taddr, %cpcol : i32",
            f"%cplo = llvm.mlir.constant({lo} : i32) : i32",
            "%cpdlo = llvm.add %sdesc, %cplo : i32",
            "%cpd32 = llvm.zext %cpdlo : i32 to i64",
            f"%cphi = llvm.mlir.constant({(128 >> 4) << 32} : i64) : i64",
            "%cpdesc = llvm.or %cpd32, %cphi : i64",
            side(f"tcgen05.cp.cta_group::{group}.{shape} [$0], $1;", "r,l",
                 ("%cpaddr", "i32"), ("%cpdesc", "i64"))]


def _run_cp(shape: str, pair: bool, imgs: list[np.ndarray], wait: bool = True) -> np.ndarray:
    """Every CTA's (128 lanes, MMA_COLS) cells after thread 0 (of CTA 0) copies
    with ``shape`` and commits (the readers wait for it, or not)."""
    n = len(imgs)
    kernel = _m64_kernel([], pair=pair, smem=CP_SMEM, wait=wait,
                         issue=_cp_issue(shape, 2 if pair else 1, CP_FORMS[shape][0]))
    return run(kernel, {
        "img": ("!llvm.ptr", np.stack(imgs) if pair else imgs[0]),
        "regs": ("!llvm.ptr", np.full((128 * n, 64), SENTINEL, np.int32)),
        "out": ("!llvm.ptr", np.zeros((128 * n, 64), np.int32))},
        host=True, sanitize=True)["out"].reshape(n, 128, 64)[..., :MMA_COLS]


@pytest.mark.parametrize("pair", [False, True], ids=["cta_group1", "cta_group2"])
@pytest.mark.parametrize("shape", list(CP_FORMS))
@covers(form("tcgen05.cp.cta_group::1.128x256b [$0], $1;"), "llvm.call_intrinsic")
def test_a_copy_puts_each_source_row_in_its_multicast_lanes(shape, pair):
    """Each form from an unswizzled SMEM source (edge words: the int32 extremes,
    -1, 0): row i's words in columns CP_COL.. of each lane the form sends it
    to, every other cell keeping its SENTINEL; cta_group::2 copies each CTA's
    own SMEM into its own TMEM. Bit-exact, lane by lane, against numpy."""
    rows, nbytes, lanes_of = CP_FORMS[shape]
    rng = np.random.default_rng(rows + nbytes + pair)
    sources = [_cp_source(rows, nbytes, rng) for _ in range(2 if pair else 1)]
    got = _run_cp(shape, pair, [img for _, img in sources])
    for cta, (words, _) in enumerate(sources):
        want = np.full((128, MMA_COLS), SENTINEL, np.int32)
        for i in range(rows):
            want[lanes_of(i), CP_COL: CP_COL + nbytes // 4] = words[i]
        assert_same_bits(got[cta], want)


def _line(kernel: str, text: str) -> int:
    """The line of ``text``'s first occurrence in the function :func:`.harness.run`
    builds around ``kernel`` (an empty prelude and the func line come first)."""
    return kernel[:kernel.index(text)].count("\n") + 3


@covers(form("tcgen05.cp.cta_group::1.128x256b [$0], $1;"))
def test_reading_a_multicast_copy_before_its_commit_completes_races():
    """64x128b.warpx2::01_23 in a CTA pair, read back by every warp before the
    commit's mbarrier phase is waited for: races on TMEM between the copy (the
    tcgen05 unit of the issuing thread) and the tcgen05.ld, both lines named,
    the fix pointing at the commit; waiting first (the twin above, same
    kernel with ``wait``) is clean."""
    from smalti.emulate.sync.reports import RaceError

    shape = "64x128b.warpx2::01_23"
    kernel = _m64_kernel([], pair=True, smem=CP_SMEM, wait=False,
                         issue=_cp_issue(shape, 2, 64))
    rng = np.random.default_rng(7)
    imgs = np.stack([_cp_source(64, 16, rng)[1] for _ in range(2)])
    with pytest.raises(RaceError) as e:
        run(kernel, {"img": ("!llvm.ptr", imgs),
                     "regs": ("!llvm.ptr", np.full((256, 64), SENTINEL, np.int32)),
                     "out": ("!llvm.ptr", np.zeros((256, 64), np.int32))},
            host=True, sanitize=True)
    races = [r for r in e.value.races if r.space == "tmem"]
    races = {r.kind: r for r in e.value.races if r.space == "tmem"}
    # CTA 0's warps read after the copy; CTA 1's ran first, and the copy wrote over
    # what they had read: both orders are races
    assert set(races) == {"read-after-write", "write-after-read"}
    cp_line, ld_line = _line(kernel, "tcgen05.cp."), _line(kernel, "tcgen05.ld.")
    for kind, (first, second), fix in (
            ("read-after-write", (cp_line, ld_line), "tcgen05_commit_arrive"),
            ("write-after-read", (ld_line, cp_line), "tcgen05.wait::ld")):
        race = races[kind]
        for access, line in ((race.first, first), (race.second, second)):
            op = f"tcgen05.cp.cta_group::2.{shape}" if line == cp_line else "tcgen05.ld"
            assert access.op.startswith(op) and access.location.endswith(f":{line}")
        assert fix in race.fix


@pytest.mark.parametrize("text", [
    "tcgen05.cp.cta_group::1.4x256b [$0], $1;",
    "tcgen05.cp.cta_group::2.64x128b.warpx2::01_23.b8x16.b6x16_p32 [$0], $1;",
    "tcgen05.cp.cta_group::1.128x128b.b8x16.b4x16_p64 [$0], $1;"])
def test_the_copies_not_modelled_are_unsupported(text):
    """4x256b and the decompressing forms are refused, naming the form."""
    from smalti.emulate.errors import Unsupported

    shape = text.split(".", 3)[3].split(" ")[0]
    kernel = _m64_kernel([], smem=CP_SMEM, issue=[
        line.replace(f"tcgen05.cp.cta_group::1.{shape}", text.split(" ")[0])
        for line in _cp_issue(shape, 1, 128)])
    with pytest.raises(Unsupported, match="tcgen05.cp of shape .* are modelled"):
        run(kernel, {"img": ("!llvm.ptr", np.zeros((CP_SMEM - A_OFF) // 4, np.int32)),
                     "regs": ("!llvm.ptr", np.zeros((128, 64), np.int32)),
                     "out": ("!llvm.ptr", np.zeros((128, 64), np.int32))}, host=True)


def test_the_block_scaled_m_values_modelled():
    """Block-scaled kinds: M = 128 in cta_group::1; M = 256 (128 rows a CTA) or
    128 (64 rows a CTA) over a pair; M = 256 in cta_group::1 is Unsupported,
    named with what is modelled."""
    from smalti.emulate.errors import Unsupported
    from smalti.emulate.ops import tcgen05_scaled as scaled

    def desc(m: int, n: int) -> int:  # e4m3 A and B, ue8m0 scales
        return ((n >> 3) << 17) | (1 << 23) | ((m >> 7) << 27)

    assert scaled.idesc(desc(128, 64), "mxf8f6f4", 1, 1, False, "here")["m"] == 128
    for m in (128, 256):
        assert scaled.idesc(desc(m, 64), "mxf8f6f4", 1, 2, False, "here")["m"] == m
    with pytest.raises(Unsupported, match=r"cta_group::1 with M = 256 .* M = 128 in "
                       r"cta_group::1, 128 or 256 in cta_group::2 are modelled"):
        scaled.idesc(desc(256, 64), "mxf8f6f4", 1, 1, False, "here")
