"""Every form of the inline-PTX table (``llvm.inline_asm``,
:mod:`smalti.emulate.ops.inline_asm`), run: value instructions against the
PTX ISA's definitions on edge values (signed zeros, infinities, NaN,
subnormals under ``.ftz``), mbarriers, barriers, cluster barriers,
``st.async`` and jax's remote arrival between the blocks of a cluster, bulk
and TMA copies (tile, gather4, scatter4) under the synchronization checker,
a WGMMA block as jax writes it (and the .tf32 forms jax never writes,
refused), 16-bit integer max/min, and the clocks and ids jax's profiler
reads."""

from __future__ import annotations

import numpy as np
import pytest

from smalti.emulate.errors import Unsupported
from smalti.emulate.ops import inline_asm as ptx
from smalti.emulate.sync.reports import Deadlock, RaceError

from .harness import (
    FLOAT_TYPES,
    assert_same_bits,
    covers,
    float_edges,
    pairs,
    recording_kernels,
    run,
)
from .test_builtin import INIT, init_tma_desc, tma_inputs


def form(text: str) -> str:
    """The table form a PTX string reaches."""
    entry = ptx.lookup(text)
    assert entry is not None, text
    return entry.form


def asm(text: str, constraints: str, args: dict, out: str):
    """``%r = llvm.inline_asm text`` on the named inputs; returns %r."""
    names = list(args)
    types = ", ".join(t for t, _ in args.values())
    operands = ", ".join("%" + n for n in names)
    return run(f'%r = llvm.inline_asm "{text}", "{constraints}" {operands} : ({types}) -> {out}',
               args, {"r": out})["r"]


F32_TINY = np.float32(np.finfo(np.float32).tiny)


def _ftz(x: np.ndarray) -> np.ndarray:
    """Subnormals flushed to zero of the same sign, as .ftz does."""
    return np.where(np.abs(x) < F32_TINY, np.copysign(np.float32(0), x), x).astype(x.dtype)


APPROX = {"ex2": np.exp2, "lg2": np.log2, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
          "rsqrt": lambda x: 1 / np.sqrt(x), "sqrt": np.sqrt, "rcp": lambda x: 1 / x}


@pytest.mark.parametrize("ftz", [False, True])
@covers(form("ex2.approx.f32 $0, $1;"))
def test_approx_f32_is_the_exact_function_rounded_once(ftz):
    x = np.concatenate([float_edges("f32"), np.float32([-126.5, 128.0, 1e-39, -1e-39, 3.0])])
    for name, fn in APPROX.items():
        op = f"{name}.approx{'.ftz' if ftz else ''}.f32"
        got = asm(f"{op} $0, $1;", "=f,f", {"a": ("f32", x)}, "f32")
        with np.errstate(all="ignore"):
            inp = _ftz(x) if ftz else x
            want = np.asarray(fn(inp.astype(np.float64))).astype(np.float32)
            want = _ftz(want) if ftz else want
        try:
            assert_same_bits(got, want)
        except AssertionError as e:
            raise AssertionError(f"{op}: {e}") from None


def _halves(regs: np.ndarray, dt) -> np.ndarray:
    u = regs.view(np.uint32)
    return np.stack([u & 0xFFFF, u >> 16], -1).astype(np.uint16).view(dt)


def _pack(h: np.ndarray) -> np.ndarray:
    u = h.view(np.uint16).astype(np.uint32)
    return (u[..., 0] | u[..., 1] << 16).view(np.int32)


@pytest.mark.parametrize("ty", ["f16", "bf16"])
@covers(form("tanh.approx.f16 $0, $1;"), form("abs.f16 $0, $1;"))
def test_packed_and_single_half_unary(ty):
    dt = np.dtype(FLOAT_TYPES[ty])
    h = float_edges(ty)
    h = np.concatenate([h, h[:1]]) if h.size % 2 else h
    regs = _pack(h.reshape(-1, 2))
    for base, fn in [("tanh.approx", np.tanh), ("abs", np.abs)]:
        got = asm(f"{base}.{ty}x2 $0, $1;", "=r,r", {"a": ("i32", regs)}, "i32")
        with np.errstate(all="ignore"):
            want = fn(h.astype(np.float64)).astype(dt)
        assert_same_bits(_halves(got, dt).reshape(-1), want)
        got1 = asm(f"{base}.{ty} $0, $1;", "=h,h", {"a": ("i16", h.view(np.int16))}, "i16")
        assert_same_bits(got1.view(dt), want)


@covers(form("abs.f32 $0, $1;"))
def test_abs_f32_with_ftz():
    x = np.concatenate([float_edges("f32"), np.float32([-1e-39])])
    assert_same_bits(asm("abs.f32 $0, $1;", "=f,f", {"a": ("f32", x)}, "f32"), np.abs(x))
    got = asm("abs.ftz.f32 $0, $1;", "=f,f", {"a": ("f32", x)}, "f32")
    assert_same_bits(got, np.abs(_ftz(x)))


def _ptx_extremum(x: float, y: float, nan: bool, smaller: bool) -> float:
    """PTX ISA 9.1, "Floating Point Instructions: max" (min mirrored), one pair:
    ``max_nan``/``max_num``, with "+0.0 > -0.0 here"."""
    if np.isnan(x) or np.isnan(y):
        if nan or (np.isnan(x) and np.isnan(y)):
            return np.nan
        return y if np.isnan(x) else x

    def key(v: float) -> tuple[float, bool]:
        return (v, not np.signbit(v))  # +0.0 above -0.0
    return (x if key(x) < key(y) else y) if smaller else (x if key(x) > key(y) else y)


@pytest.mark.parametrize("ty", ["f32", "f16", "bf16"])
@covers(form("max.f32 $0, $1, $2;"), form("add.f32 $0, $1, $2;"))
def test_binary_value_instructions(ty):
    """max/min (.NaN: NaN-propagating; ``+0.0 > -0.0``) and add/sub/mul,
    rounded once."""
    dt = np.dtype(FLOAT_TYPES[ty])
    a, b = pairs(float_edges(ty))
    cases = {f"{op}.rn": fn for op, fn in [("add", np.add), ("sub", np.subtract),
                                            ("mul", np.multiply)]}
    for op in ("max", "min", "max.NaN", "min.NaN"):
        cases[op] = np.vectorize(lambda x, y, op=op: _ptx_extremum(
            x, y, "NaN" in op, op.startswith("min")), otypes=[np.float64])
    for op, fn in cases.items():
        with np.errstate(all="ignore"):
            want = np.asarray(fn(a.astype(np.float64), b.astype(np.float64))).astype(dt)
        if ty == "f32":
            got = asm(f"{op}.f32 $0, $1, $2;", "=f,f,f", {"a": ("f32", a), "b": ("f32", b)}, "f32")
        else:
            regs = [_pack(v.reshape(-1, 2)) for v in (a, b)] if a.size % 2 == 0 else None
            got = asm(f"{op}.{ty} $0, $1, $2;", "=h,h,h", {"a": ("i16", a.view(np.int16)),
                                                            "b": ("i16", b.view(np.int16))}, "i16")
            got = got.view(dt)
            if regs is not None:
                got2 = asm(f"{op}.{ty}x2 $0, $1, $2;", "=r,r,r",
                           {"a": ("i32", regs[0]), "b": ("i32", regs[1])}, "i32")
                assert_same_bits(_halves(got2, dt).reshape(-1), got)
        if op.startswith(("max", "min")):
            nans = np.isnan(want.astype(np.float64))  # payloads are not modelled
            assert np.isnan(got[nans].astype(np.float64)).all(), op
            assert_same_bits(got[~nans], want[~nans])
            zeros = (a == 0) & (b == 0) & (np.signbit(a) != np.signbit(b))
            assert zeros.any() and (np.signbit(got[zeros]) == op.startswith("min")).all(), op
        else:
            assert_same_bits(got, want)


def test_extremum_forms_not_modelled_are_refused():
    """``.xorsign.abs`` and 16-bit ``.ftz`` are not modelled: no function, so
    the op raises Unsupported instead of computing a plain max."""
    assert ptx._value_fn("max.xorsign.abs.f32", 2) is None
    assert ptx._value_fn("max.ftz.NaN.f16x2", 2) is None
    flush = ptx._value_fn("max.ftz.NaN.f32", 2)
    tiny = np.float32(1e-39)
    assert flush(np.float32([tiny, -tiny]), np.float32([-1.0, -2.0])).tolist() == [0.0, 0.0]


def _prmt(a: int, b: int, c: int) -> int:
    """prmt.b32 (default mode): byte i of d is byte c[4i+2:4i] of {b, a},
    sign-replicated if c[4i+3] is set."""
    src = (a & 0xFFFFFFFF) | (b & 0xFFFFFFFF) << 32
    d = 0
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        byte = (src >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        d |= byte << (8 * i)
    return d - (1 << 32) if d >> 31 else d


@covers("llvm.inline_asm", form("prmt.b32 $0, $1, $2, $3;"))
def test_prmt_b32():
    rng = np.random.default_rng(1)
    a = rng.integers(-2 ** 31, 2 ** 31, 64).astype(np.int32)
    b = rng.integers(-2 ** 31, 2 ** 31, 64).astype(np.int32)
    c = np.array([0x3210, 0x7654, 0x0123, 0x4444, 0x8888, 0xF0F0, 0x5140, 0x3B2A] * 8, np.int32)
    got = asm("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r",
              {"a": ("i32", a), "b": ("i32", b), "c": ("i32", c)}, "i32")
    assert got.tolist() == [_prmt(int(x), int(y), int(z)) for x, y, z in zip(a, b, c)]


@pytest.mark.parametrize("selector", [0x3210, 0x7654, 0xFEDC, 0xBA98, 0x8F07, 0x0000, 0xFFFF])
def test_prmt_b32_with_a_uniform_selector(selector):
    """A selector the same in every thread (an immediate, as jax's blocks
    have it) takes another path; every nibble value, sign bytes included."""
    rng = np.random.default_rng(2)
    a = rng.integers(-2 ** 31, 2 ** 31, 64).astype(np.int32)
    b = rng.integers(-2 ** 31, 2 ** 31, 64).astype(np.int32)
    got = run(f"""
      %c = arith.constant {selector} : i32
      %r = llvm.inline_asm "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r" %a, %b, %c
        : (i32, i32, i32) -> i32""", {"a": ("i32", a), "b": ("i32", b)}, {"r": "i32"})["r"]
    assert got.tolist() == [_prmt(int(x), int(y), selector) for x, y in zip(a, b)]


@covers(form(""))
def test_empty_string_is_an_optimization_barrier():
    got = run("""
      %r = llvm.inline_asm "", "=r,0" %a : (i32) -> i32
      %s = llvm.inline_asm "", "=r,=f,0,1" %a, %f : (i32, f32) -> !llvm.struct<(i32, f32)>
      %f2 = llvm.extractvalue %s[1] : !llvm.struct<(i32, f32)>""",
              {"a": ("i32", np.arange(32, dtype=np.int32)), "f": ("f32", -0.0)},
              {"r": "i32", "f2": "f32"})
    assert got["r"].tolist() == list(range(32)) and np.signbit(got["f2"])
    with pytest.raises(Unsupported, match="inline PTX ''"):
        run('%r = llvm.inline_asm "", "=r,r" %a : (i32) -> i32', {"a": ("i32", 1)}, {"r": "i32"})


NO_OPS = ["fence.mbarrier_init.release.cluster;", "@$0 prefetch.tensormap [$1];",
          "griddepcontrol.wait;", "griddepcontrol.launch_dependents;", "fence.acq_rel.cta;",
          "fence.sc.cta;", "wgmma.fence.sync.aligned;", "setmaxnreg.dec.sync.aligned.u32 40;"]


@covers(*(form(t) for t in NO_OPS))
def test_instructions_with_nothing_to_model_change_nothing():
    """Between a store and a load of the same SMEM word by every thread, with
    the checker on: the value is unchanged and nothing is reported."""
    lines = "\n".join(
        f'llvm.inline_asm has_side_effects "{t}", "b,l" %p, %g : (i1, !llvm.ptr) -> ()'
        if "$1" in t else f'llvm.inline_asm has_side_effects "{t}", "" : () -> ()'
        for t in NO_OPS)
    got = run(LAUNCH.format(threads=32, smem=256, body=f"""
        %p = arith.constant true
        {SMEM_WORD}
        llvm.store %t, %w : i32, !llvm.ptr<3>
        {lines}
        %v = llvm.load %w : !llvm.ptr<3> -> i32
        memref.store %v, %out[%tx] : memref<32xi32>"""),
              {"out": ("memref<32xi32>", np.zeros(32, np.int32)),
               "g": ("!llvm.ptr", np.zeros(128, np.uint8))}, host=True, sanitize=True)
    assert got["out"].tolist() == list(range(32))


# a host function launching one block (or a grid of clusters) with dynamic SMEM
LAUNCH = """
  %one_block = arith.constant 1 : index
  %cthreads = arith.constant {threads} : index
  %smem_bytes = arith.constant {smem} : i32
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %one_block, %gy = %one_block, %gz = %one_block)
             threads(%tx, %ty, %tz) in (%sx = %cthreads, %sy = %one_block, %sz = %one_block)
             dynamic_shared_memory_size %smem_bytes {{
    %raw = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
    %base = memref.extract_aligned_pointer_as_index %raw : memref<?xi8, #gpu.address_space<workgroup>> -> index
    %b64 = arith.index_cast %base : index to i64
    %smem = llvm.inttoptr %b64 : i64 to !llvm.ptr<3>
    %t = nvvm.read.ptx.sreg.tid.x : i32
    %z = llvm.mlir.constant(0 : i32) : i32
    %first = arith.cmpi eq, %t, %z : i32
    {body}
    gpu.terminator
  }}"""  # noqa: E501 -- MLIR text, one op a line
# %w: the thread's own SMEM word, 64 bytes on (the first 64 hold mbarriers)
SMEM_WORD = """
    %w0 = llvm.getelementptr %smem[64] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
    %w = llvm.getelementptr %w0[%t] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i32"""


def side(text: str, constraints: str = "", *operands: tuple[str, str]) -> str:
    """An ``llvm.inline_asm has_side_effects`` line on (name, type) operands."""
    names = ", ".join(n for n, _ in operands)
    types = ", ".join(t for _, t in operands)
    return f'llvm.inline_asm has_side_effects "{text}", "{constraints}" {names} : ({types}) -> ()'


ARRIVES = ["mbarrier.arrive.release.cta.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
           "mbarrier.arrive.shared.b64"]


@covers(form("mbarrier.init.shared::cta.b64 [$0], $1;"),
        *(form(f"{a} _, [$0];") for a in ARRIVES),
        form("mbarrier.complete_tx.shared::cta.b64 [$0], $1;"),
        form("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [$0], $1;"))
def test_mbarrier_forms_count_arrivals_and_bytes():
    """A barrier for 37 arrivals and 96 bytes: every thread arrives once
    (release.cta), thread 0 twice more with a count of 2 (a literal, a
    register) and once expecting 96 bytes, which complete_tx delivers in two
    parts; then parity 0 has completed and the wait returns. Leave one part
    out and it cannot."""
    def kernel(skip_last: bool) -> str:
        arrivals = "\n".join(side(f"{a} _, [$0];", "l", ("%smem", "!llvm.ptr<3>"))
                             for a in ARRIVES[:1])
        return LAUNCH.format(threads=32, smem=128, body=f"""
          %n = llvm.mlir.constant(37 : i32) : i32
          %two = llvm.mlir.constant(2 : i32) : i32
          %nbytes = llvm.mlir.constant(96 : i32) : i32
          %part = llvm.mlir.constant(48 : i32) : i32
          {side("@$2 mbarrier.init.shared::cta.b64 [$0], $1;", "l,r,b",
                ("%smem", "!llvm.ptr<3>"), ("%n", "i32"), ("%first", "i1"))}
          {arrivals}
          {side("@$1 mbarrier.arrive.shared::cta.b64 _, [$0], 2;", "l,b",
                ("%smem", "!llvm.ptr<3>"), ("%first", "i1"))}
          {side("@$2 mbarrier.arrive.shared.b64 _, [$0], $1;", "l,r,b",
                ("%smem", "!llvm.ptr<3>"), ("%two", "i32"), ("%first", "i1"))}
          {side("@$2 mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [$0], $1;", "l,r,b",
                ("%smem", "!llvm.ptr<3>"), ("%nbytes", "i32"), ("%first", "i1"))}
          {side("@$2 mbarrier.complete_tx.shared::cta.b64 [$0], $1;", "l,r,b",
                ("%smem", "!llvm.ptr<3>"), ("%part", "i32"), ("%first", "i1"))}
          {"" if skip_last else side("@$2 mbarrier.complete_tx.shared::cta.b64 [$0], $1;",
                                       "l,r,b", ("%smem", "!llvm.ptr<3>"), ("%part", "i32"),
                                       ("%first", "i1"))}
          nvvm.mbarrier.try_wait.parity %smem, %z, %z : !llvm.ptr<3>, i32, i32""")
    run(kernel(False), host=True, sanitize=True)
    with pytest.raises(Deadlock, match="0 arrivals and 48 transaction bytes outstanding"):
        run(kernel(True), host=True)


BARRIERS = ["bar.sync $0;", "barrier.sync $0;", "bar.sync.aligned $0;", "barrier.sync.aligned $0;"]


@covers(*(form(b) for b in BARRIERS))
def test_block_barriers_order_two_warpgroups():
    """Each thread writes its word; after the barrier it reads its neighbour's
    (from the other warpgroup for the last thread of each), race-free, once
    per spelling, the named form (id 1, 256 threads) among them."""
    for text in BARRIERS + ["bar.sync $0, 256;"]:
        got = run(LAUNCH.format(threads=256, smem=2048, body=f"""
          {SMEM_WORD}
          llvm.store %t, %w : i32, !llvm.ptr<3>
          %id = llvm.mlir.constant({1 if "256" in text else 0} : i32) : i32
          {side(text, "r", ("%id", "i32"))}
          %c1 = llvm.mlir.constant(1 : i32) : i32
          %c255 = llvm.mlir.constant(255 : i32) : i32
          %t1 = llvm.add %t, %c1 : i32
          %nb = llvm.and %t1, %c255 : i32
          %wn = llvm.getelementptr %w0[%nb] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i32
          %v = llvm.load %wn : !llvm.ptr<3> -> i32
          memref.store %v, %out[%tx] : memref<256xi32>"""),
                  {"out": ("memref<256xi32>", np.zeros(256, np.int32))}, host=True, sanitize=True)
        assert got["out"].tolist() == [(k + 1) % 256 for k in range(256)], text


@covers(form("barrier.sync $0;"))
def test_without_the_barrier_the_checker_reports_the_race():
    with pytest.raises(RaceError, match="read-after-write"):
        run(LAUNCH.format(threads=256, smem=2048, body=f"""
          {SMEM_WORD}
          llvm.store %t, %w : i32, !llvm.ptr<3>
          %id = llvm.mlir.constant(0 : i32) : i32
          {side("barrier.sync $0;", "r", ("%id", "i32"))}
          llvm.store %t, %w : i32, !llvm.ptr<3>
          %c1 = llvm.mlir.constant(1 : i32) : i32
          %c255 = llvm.mlir.constant(255 : i32) : i32
          %t1 = llvm.add %t, %c1 : i32
          %nb = llvm.and %t1, %c255 : i32
          %wn = llvm.getelementptr %w0[%nb] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i32
          %v = llvm.load %wn : !llvm.ptr<3> -> i32"""), host=True, sanitize=True)


@covers(form("wgmma.mma_async"), form("wgmma.commit_group.sync.aligned;"),
        form("wgmma.wait_group.sync.aligned 0;"))
def test_a_wgmma_block_as_jax_writes_it():
    """s8 x s8 -> s32 (exact) through jax's own lowering of plgpu.wgmma."""
    from smalti import emulate as emu

    from .. import kernels

    case = kernels._wgmma(64, 128, 64, np.int8, tb=True)
    with recording_kernels():
        (got,) = emu.run(case.fn, *case.args)
    assert_same_bits(got, case.ref(*case.args))


# --- clusters: barrier.cluster, st.async, cluster-scope expect_tx, remote arrival -------

# a host function launching {blocks} blocks in clusters of 2, {threads} threads each
CLUSTER_LAUNCH = """
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %cgrid = arith.constant {blocks} : index
  %cthreads = arith.constant {threads} : index
  %ccluster = arith.constant {cluster} : index
  %smem_bytes = arith.constant {smem} : i32
  gpu.launch clusters(%cx, %cy, %cz) in (%ncx = %ccluster, %ncy = %c1, %ncz = %c1)
             blocks(%bx, %by, %bz) in (%gx = %cgrid, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %cthreads, %sy = %c1, %sz = %c1)
             dynamic_shared_memory_size %smem_bytes {{
    %raw = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
    %base = memref.extract_aligned_pointer_as_index %raw : memref<?xi8, #gpu.address_space<workgroup>> -> index
    %b64 = arith.index_cast %base : index to i64
    %smem = llvm.inttoptr %b64 : i64 to !llvm.ptr<3>
    %bar2 = llvm.getelementptr %smem[8] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
    %t = nvvm.read.ptx.sreg.tid.x : i32
    %z = llvm.mlir.constant(0 : i32) : i32
    %one = llvm.mlir.constant(1 : i32) : i32
    %first = arith.cmpi eq, %t, %z : i32
    %rank = nvvm.read.ptx.sreg.cluster.ctarank : i32
    %peer = llvm.xor %rank, %one : i32
    {body}
    gpu.terminator
  }}"""  # noqa: E501 -- MLIR text, one op a line


def cluster_launch(body: str, blocks: int = 2, smem: int = 256, threads: int = 32,
                   cluster: int = 2) -> str:
    """:data:`CLUSTER_LAUNCH` around ``body`` (clusters of ``cluster`` blocks)."""
    return CLUSTER_LAUNCH.format(blocks=blocks, smem=smem, body=body, threads=threads,
                                 cluster=cluster)


ARRIVE = ["barrier.cluster.arrive", "barrier.cluster.arrive.aligned",
          "barrier.cluster.arrive.relaxed", "barrier.cluster.arrive.relaxed.aligned",
          "barrier.cluster.arrive.release", "barrier.cluster.arrive.release.aligned"]
WAIT = ["barrier.cluster.wait", "barrier.cluster.wait.aligned", "barrier.cluster.wait.acquire",
        "barrier.cluster.wait.acquire.aligned"]
ST_ASYNC = f"{ptx.ST_ASYNC}.b32 [$0], $1, [$2];"
EXPECT_CLUSTER = "mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64 _, [$0], $1;"


def _cluster_exchange(remote_rank: str = "%peer") -> dict:
    """Each block of a cluster of 2 stores rank * 100 + t into word t of its
    peer's SMEM with st.async, completing on the peer's barrier; each waits
    for its own barrier (bytes expected at cluster scope), then arrives on the
    peer's second barrier the way jax's ClusterBarrier does and waits for its
    own; between phases, every spelling of barrier.cluster arrive/wait."""
    cluster_syncs = "\n".join(
        side(f"{a};") + "\n" + side(f"{WAIT[k % len(WAIT)]};") for k, a in enumerate(ARRIVE))
    body = f"""
      %c64 = llvm.mlir.constant(64 : i32) : i32
      %c100 = llvm.mlir.constant(100 : i32) : i32
      %nbytes = llvm.mlir.constant(128 : i32) : i32
      {side("@$2 mbarrier.init.shared::cta.b64 [$0], $1;", "l,r,b", ("%smem", "!llvm.ptr<3>"),
            ("%one", "i32"), ("%first", "i1"))}
      {side("@$2 mbarrier.init.shared::cta.b64 [$0], $1;", "l,r,b", ("%bar2", "!llvm.ptr<3>"),
            ("%one", "i32"), ("%first", "i1"))}
      {cluster_syncs}
      %own = nvvm.mapa %smem, %rank : !llvm.ptr<3> -> !llvm.ptr<7>
      {side("@$2 " + EXPECT_CLUSTER, "l,r,b", ("%own", "!llvm.ptr<7>"), ("%nbytes", "i32"),
            ("%first", "i1"))}
      %w0 = llvm.getelementptr %smem[64] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
      %w = llvm.getelementptr %w0[%t] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i32
      %wp = nvvm.mapa %w, %peer : !llvm.ptr<3> -> !llvm.ptr<7>
      %bp = nvvm.mapa %smem, %peer : !llvm.ptr<3> -> !llvm.ptr<7>
      %r100 = llvm.mul %rank, %c100 : i32
      %val = llvm.add %r100, %t : i32
      {side(ST_ASYNC, "l,r,l", ("%wp", "!llvm.ptr<7>"), ("%val", "i32"), ("%bp", "!llvm.ptr<7>"))}
      nvvm.mbarrier.try_wait.parity %smem, %z, %z : !llvm.ptr<3>, i32, i32
      %got = llvm.load %w : !llvm.ptr<3> -> i32
      %bar2i = llvm.ptrtoint %bar2 : !llvm.ptr<3> to i32
      {REMOTE}
      nvvm.mbarrier.try_wait.parity %bar2, %z, %z : !llvm.ptr<3>, i32, i32
      %i = arith.index_cast %t : i32 to index
      %rk = arith.index_cast %rank : i32 to index
      %c32i = arith.constant 32 : index
      %row = arith.muli %rk, %c32i : index
      %at = arith.addi %row, %i : index
      memref.store %got, %out[%at] : memref<64xi32>"""
    return run(cluster_launch(body.replace("%REMOTE_RANK", remote_rank)),
               {"out": ("memref<64xi32>", np.zeros(64, np.int32))}, host=True, sanitize=True)


REMOTE = ('llvm.inline_asm has_side_effects "{ .reg .b32 remAddr32; @$0 mapa.shared::cluster.u32 '
          'remAddr32, $1, $2; @$0 mbarrier.arrive.shared::cluster.b64 _, [remAddr32]; }", '
          '"b,r,r" %first, %bar2i, %REMOTE_RANK : (i1, i32, i32) -> ()')


@covers(*(form(f"{a};") for a in ARRIVE + WAIT), form(ST_ASYNC), form(EXPECT_CLUSTER),
        form(REMOTE.split('"')[1]), "nvvm.mapa")
def test_a_cluster_of_two_exchanges_words_and_arrives_on_each_other():
    got = _cluster_exchange()
    t = np.arange(32)
    assert got["out"].tolist() == [*(100 + t), *t]  # each block holds its peer's words


@covers(form(REMOTE.split('"')[1]))
def test_remote_arrivals_on_one_block_leave_the_other_waiting():
    from smalti.emulate.sync.reports import Deadlock

    with pytest.raises(Deadlock, match="mbarrier"):
        _cluster_exchange(remote_rank="%z")  # both arrive on block 0's barrier


# --- bulk and TMA copies, under the checker ---------------------------------

TILE_LOAD = ("@$4 cp.async.bulk.tensor.2d.shared::cta.global.mbarrier::complete_tx::bytes "
             "[$0], [$1, {$2, $3}], [$5];")
TILE_STORE = "@$3 cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [$0, {$1, $2}], [$4];"
FENCES = ["fence.proxy.async.shared::cta;", "fence.proxy.async;", "fence.proxy.async.global;"]
COMMIT = "@$0 cp.async.bulk.commit_group;"
WAIT_READ = "cp.async.bulk.wait_group.read 0;"
WAIT_ALL = "cp.async.bulk.wait_group 0;"
INIT_BAR = side("@$2 mbarrier.init.shared::cta.b64 [$0], $1;", "l,r,b", ("%smem", "!llvm.ptr<3>"),
                ("%one", "i32"), ("%first", "i1"))
EXPECT = side("@$2 mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [$0], $1;", "l,r,b",
              ("%smem", "!llvm.ptr<3>"), ("%nbytes", "i32"), ("%first", "i1"))
DOUBLE_OWN_WORD = """
    %w0 = llvm.getelementptr %smem[64] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
    %w = llvm.getelementptr %w0[%t] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, f32
    %e = llvm.load %w : !llvm.ptr<3> -> f32
    %e2 = llvm.fadd %e, %e : f32
    llvm.store %e2, %w : f32, !llvm.ptr<3>"""


def _copy_kernel(load: str, store: str, fence: str = FENCES[0], wait: str = WAIT_READ,
                 nbytes: int = 128, extra_inputs: dict | None = None, box=(4, 8)):
    """32 threads: a copy into SMEM (bytes at 64 on) completing on the
    barrier at 0, each thread doubles its word, then a copy out of SMEM in a
    bulk group, then each thread overwrites its word after ``wait``."""
    x = np.arange(16 * 16, dtype=np.float32).reshape(16, 16) - 7
    body = f"""
      %one = llvm.mlir.constant(1 : i32) : i32
      %nbytes = llvm.mlir.constant({nbytes} : i32) : i32
      %col = llvm.mlir.constant(8 : i32) : i32
      %row = llvm.mlir.constant(4 : i32) : i32
      %tile = llvm.getelementptr %smem[64] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
      {INIT_BAR}
      {side("fence.mbarrier_init.release.cluster;")}
      {side("bar.sync 0;")}
      {EXPECT}
      {load}
      nvvm.mbarrier.try_wait.parity %smem, %z, %z : !llvm.ptr<3>, i32, i32
      {DOUBLE_OWN_WORD}
      {side(fence) if fence else ""}
      {side("bar.sync 0;")}
      {store}
      {side(COMMIT, "b", ("%first", "i1"))}
      {side(wait) if wait else ""}
      llvm.store %e, %w : f32, !llvm.ptr<3>
      {side(WAIT_ALL)}"""
    inputs = {**tma_inputs(x, box), **(extra_inputs or {})}
    got = run(init_tma_desc() + LAUNCH.format(threads=32, smem=256, body=body), inputs,
              host=True, prelude=INIT, sanitize=True)
    return x, got


TILE_COPY = (side(TILE_LOAD, "l,l,r,r,b,l", ("%tile", "!llvm.ptr<3>"), ("%desc", "!llvm.ptr"),
                  ("%col", "i32"), ("%row", "i32"), ("%first", "i1"), ("%smem", "!llvm.ptr<3>")),
             side(TILE_STORE, "l,r,r,b,l", ("%desc", "!llvm.ptr"), ("%col", "i32"), ("%row", "i32"),
                  ("%first", "i1"), ("%tile", "!llvm.ptr<3>")))


@covers(form(TILE_LOAD), *(form(f) for f in FENCES[:2]), form(COMMIT), form(WAIT_READ),
        form(WAIT_ALL))
def test_tma_tile_copies_round_trip_the_box():
    """Box (4, 8) at column 8, row 4: loaded, doubled, stored back in place,
    with each spelling of the proxy fence that covers SMEM."""
    for fence in FENCES[:2]:
        x, got = _copy_kernel(*TILE_COPY, fence=fence)
        want = x.copy()
        want[4:8, 8:16] *= 2
        assert_same_bits(got["x"], want)


@covers(form(FENCES[2]))
def test_a_proxy_fence_of_global_memory_leaves_smem_writes_unfenced():
    """``fence.proxy.async.global`` covers GMEM only (PTX: a fence names the
    state space it orders): the TMA store still reads the doubled SMEM words
    unfenced."""
    with pytest.raises(RaceError, match="read-after-write") as err:
        _copy_kernel(*TILE_COPY, fence=FENCES[2])
    assert "commit_smem" in err.value.races[0].fix


@covers(form(TILE_LOAD), form(WAIT_READ))
def test_without_the_fence_or_the_read_wait_the_checker_reports_a_race():
    with pytest.raises(RaceError, match="read-after-write"):
        _copy_kernel(*TILE_COPY, fence="")
    with pytest.raises(RaceError, match="write-after-read"):
        _copy_kernel(*TILE_COPY, wait="")


BULK_LOAD = ("@$3 cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes "
             "[$0], [$1], $2, [$4];")
BULK_STORE = "@$3 cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;"


@covers(form(BULK_LOAD), form(BULK_STORE))
def test_bulk_copies_move_bytes():
    """128 bytes of y (from byte 64) into SMEM, doubled, out to y's start."""
    y = np.arange(64, dtype=np.float32) * 0.25
    load = side(BULK_LOAD, "l,l,r,b,l", ("%tile", "!llvm.ptr<3>"), ("%ysrc", "!llvm.ptr"),
                ("%nbytes", "i32"), ("%first", "i1"), ("%smem", "!llvm.ptr<3>"))
    store = side(BULK_STORE, "l,l,r,b", ("%y", "!llvm.ptr"), ("%tile", "!llvm.ptr<3>"),
                 ("%nbytes", "i32"), ("%first", "i1"))
    load = "%ysrc = llvm.getelementptr %y[64] : (!llvm.ptr) -> !llvm.ptr, i8\n" + load
    _, got = _copy_kernel(load, store, extra_inputs={"y": ("!llvm.ptr", y)})
    want = y.copy()
    want[:32] = 2 * y[16:48]
    assert_same_bits(got["y"], want)


GATHER = f"@$6 {ptx.GATHER4} [$0], [$1, {{$2, $3, $4, $5, $7}}], [$8];"
SCATTER = f"@$5 {ptx.SCATTER4} [$0, {{$1, $2, $3, $4, $6}}], [$7];"


@covers(form(GATHER), form(SCATTER))
def test_gather4_and_scatter4_move_four_rows():
    """Rows 5, 0, 15, 3 (columns 8-15) gathered densely into SMEM, doubled,
    scattered to rows 1, 9, 2, 12 at column 0."""
    rows = [("%g0", 5), ("%g1", 0), ("%g2", 15), ("%g3", 3)]
    dst = [("%s0", 1), ("%s1", 9), ("%s2", 2), ("%s3", 12)]
    consts = "\n".join(f"{n} = llvm.mlir.constant({v} : i32) : i32" for n, v in rows + dst)
    load = consts + "\n" + side(
        GATHER, "l,l,r,r,r,r,b,r,l", ("%tile", "!llvm.ptr<3>"), ("%desc", "!llvm.ptr"),
        ("%col", "i32"), *((n, "i32") for n, _ in rows[:3]), ("%first", "i1"),
        (rows[3][0], "i32"), ("%smem", "!llvm.ptr<3>"))
    store = side(SCATTER, "l,r,r,r,r,b,r,l", ("%desc", "!llvm.ptr"), ("%z", "i32"),
                 *((n, "i32") for n, _ in dst[:3]), ("%first", "i1"), (dst[3][0], "i32"),
                 ("%tile", "!llvm.ptr<3>"))
    x, got = _copy_kernel(load, store, box=(1, 8))
    want = x.copy()
    for (_, r), (_, d) in zip(rows, dst):
        want[d, 0:8] = 2 * x[r, 8:16]
    assert_same_bits(got["x"], want)


# --- 16-bit integer max/min (FragmentedArray.max/min of int16/uint16) ---------

INT16 = np.array([-2 ** 15, -2 ** 15 + 1, -2, -1, 0, 1, 2, 255, 256, 2 ** 15 - 2, 2 ** 15 - 1],
                 np.int16)


@pytest.mark.parametrize("opcode", ["max.s16", "min.s16", "max.u16", "min.u16"])
@covers(form("max.s16 $0, $1, $2;"))
def test_int16_max_min_compare_each_half_signed_or_unsigned(opcode):
    """On every pair of the 16-bit edges (-32768, -1, 0, 32767, 255/256...):
    one half in an ``h`` register, and ``x2`` on two halves of an ``r``
    register, each compared on its own."""
    a, b = pairs(INT16)
    half = np.int16 if ".s" in opcode else np.uint16
    fn = np.maximum if opcode.startswith("max") else np.minimum
    want = fn(a.view(half), b.view(half))
    got = asm(f"{opcode} $0, $1, $2;", "=h,h,h", {"a": ("i16", a), "b": ("i16", b)}, "i16")
    assert_same_bits(got.view(half), want)
    ra = np.stack([a, b[::-1]], -1).view(np.int32).reshape(-1)  # (low, high) halves
    rb = np.stack([b, a[::-1]], -1).view(np.int32).reshape(-1)
    got2 = asm(f"{opcode}x2 $0, $1, $2;", "=r,r,r", {"a": ("i32", ra), "b": ("i32", rb)}, "i32")
    want2 = np.stack([want, fn(b[::-1].view(half), a[::-1].view(half))], -1)
    assert_same_bits(got2.view(half).reshape(-1, 2), want2)


# --- the profiler's clocks and ids -------------------------------------------

CLOCK_EVENT = "@$0 st.shared.v2.u32 [$1], {$2, %clock};"
TIMERS = ["mov.u64 $0, %globaltimer;", "mov.u32 $0, %globaltimer_lo;",
          "mov.u32 $0, %globaltimer_hi;", "mov.u32 $0, %smid;", "mov.u32 $0, %clock;"]


@covers(*(form(t) for t in TIMERS), form(CLOCK_EVENT))
def test_clocks_increase_in_program_order_and_smid_is_the_block_modulo_132():
    """Block (5, 2) of a (70, 3) grid: %globaltimer, then its low and high
    halves, then %clock, then the profiler's event record (tag, %clock) by
    the even threads: each read one tick later than the one before it, the
    same for every thread; %smid is (5 + 70 * 2) % 132."""
    got = run(f"""
      %t = nvvm.read.ptx.sreg.tid.x : i32
      %one = llvm.mlir.constant(1 : i32) : i32
      %zero = llvm.mlir.constant(0 : i32) : i32
      %bit = llvm.and %t, %one : i32
      %even = arith.cmpi eq, %bit, %zero : i32
      %g = llvm.inline_asm has_side_effects "{TIMERS[0]}", "=l" : () -> i64
      %lo = llvm.inline_asm has_side_effects "{TIMERS[1]}", "=r" : () -> i32
      %hi = llvm.inline_asm has_side_effects "{TIMERS[2]}", "=r" : () -> i32
      %sm = llvm.inline_asm "{TIMERS[3]}", "=r" : () -> i32
      %ck = llvm.inline_asm has_side_effects "{TIMERS[4]}", "=r" : () -> i32
      %at = llvm.getelementptr %buf[%t] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i64
      %tag = llvm.mul %t, %t : i32
      {side(CLOCK_EVENT, "b,l,r", ("%even", "i1"), ("%at", "!llvm.ptr<3>"), ("%tag", "i32"))}""",
              {"buf": ("!llvm.ptr<3>", np.full((32, 2), -5, np.int32))},
              {"g": "i64", "lo": "i32", "hi": "i32", "sm": "i32", "ck": "i32"},
              block_id=(5, 2, 0), grid=(70, 3, 1))
    g = int(np.asarray(got["g"]).reshape(-1)[0])
    assert np.all(np.asarray(got["g"]) == g) and g > 0
    assert np.all(np.asarray(got["lo"]) == g + 1) and np.all(np.asarray(got["hi"]) == 0)
    assert np.all(np.asarray(got["sm"]) == (5 + 70 * 2) % 132)
    assert np.all(np.asarray(got["ck"]) == g + 3)
    t = np.arange(32)
    want = np.where((t % 2 == 0)[:, None], np.stack([t * t, np.full(32, g + 4)], -1), -5)
    assert_same_bits(got["buf"], want.astype(np.int32))


def _tf32_wgmma(shape: str, a_regs: bool, imms: int, dtype: str = "f32") -> str:
    """A ``wgmma.mma_async.m64n8k8.{dtype}.tf32.tf32`` block, jax's constraint
    layout (4 accumulators, tied; A descriptor or four A registers; B
    descriptor; scale-d; ``imms`` immediates), on dummy operands: the forms
    below are refused when compiled, before anything runs."""
    regs = ["$8", "$9", "$10", "$11"] if a_regs else ["$8"]
    b = 8 + len(regs)
    imm = "".join(f", ${b + 2 + i}" for i in range(imms))
    text = (f"{{ .reg .pred p; setp.ne.b32 p, ${b + 1}, 0; wgmma.mma_async.sync.aligned.{shape}."
            f"{dtype}.tf32.tf32 {{$0,$1,$2,$3}}, {'{' + ','.join(regs) + '}' if a_regs else '$8'}, "
            f"${b}, p{imm}; }}")
    a_cons, a_ops, a_tys = ((["r"] * 4, ["%i"] * 4, ["i32"] * 4) if a_regs
                            else (["l"], ["%d"], ["i64"]))
    cons = ",".join(["=f"] * 4 + ["0", "1", "2", "3"] + a_cons + ["l"] + ["n"] * (1 + imms))
    ops = ", ".join(["%c"] * 4 + a_ops + ["%d"] + ["%i"] * (1 + imms))
    tys = ", ".join(["f32"] * 4 + a_tys + ["i64"] + ["i32"] * (1 + imms))
    return f'%r = llvm.inline_asm has_side_effects "{text}", "{cons}" {ops} : ({tys}) -> ' \
        "!llvm.struct<(f32, f32, f32, f32)>"


@pytest.mark.parametrize("a_regs,imms,dtype,why", [
    (True, 2, "f32", r"\.tf32 with A in registers"),
    (False, 4, "f32", r"\.tf32 with 4 immediates: PTX gives \.tf32 no imm-trans-a/b"),
    (False, 2, "f16", r"WGMMA of \.tf32 into a \.f16 accumulator")])
def test_tf32_wgmma_forms_jax_never_emits_are_refused(a_regs, imms, dtype, why):
    """PTX has tf32 A in registers (jax's wgmma takes f32 A from SMEM only: not
    modelled); it has no imm-trans for .tf32 (transposes are .f16/.bf16 only)
    and no f16 accumulator for it. Each is Unsupported, named, where it is."""
    inputs = {"c": ("f32", np.zeros(128, np.float32)), "d": ("i64", np.int64(0)),
              "i": ("i32", np.int32(1))}
    with pytest.raises(Unsupported, match=why + ".* at loc\\("):
        run(_tf32_wgmma("m64n8k8", a_regs, imms, dtype), inputs, threads=128)
