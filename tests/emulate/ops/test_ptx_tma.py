"""TMA reductions and prefetches (:mod:`smalti.emulate.ops.tma_reduce`,
:mod:`~smalti.emulate.ops.tma_prefetch`), op by op as jax writes them: 32
threads each put one element of a box in SMEM, and one thread issues
``@$0 cp.reduce.async.bulk.tensor.<r>d...`` of it into a tensor, under the
synchronization checker; the tensor equals numpy's combination of the two on
edge values (wraparound, INT_MIN/INT_MAX, NaN for min/max, inc/dec at their
bounds), for every operation, every element type the tensor map gives it
and boxes of rank 1 to 5. A prefetch of any rank changes nothing, and one
through a map of another rank is an error."""

from __future__ import annotations

import numpy as np
import pytest

from smalti.emulate.errors import EmulationError

from .harness import FLOAT_TYPES, assert_same_bits, covers, float_edges, int_edges, run
from .test_builtin import INIT, init_tma_desc, tma_inputs
from .test_ptx import LAUNCH, form, side

REDUCE = ("@$0 cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta.{op}.tile.bulk_group "
          "[$2,{{{coords}}}], [$1];")
PREFETCH = "@$0 cp.async.bulk.prefetch.tensor.{rank}d.L2.global{tile} [$1, {{{coords}}}];"
REDUCE_FORM = form(REDUCE.format(rank=2, op="add", coords="$3, $4"))
PREFETCH_FORM = form(PREFETCH.format(rank=2, tile=".tile", coords="$2, $3"))

# (tensor shape, box, box start outermost first): 32 elements a box
SHAPES = {1: ((40,), (32,), (5,)), 2: ((6, 16), (4, 8), (1, 8)),
          3: ((3, 4, 8), (2, 2, 8), (1, 1, 0)),
          4: ((2, 3, 2, 8), (2, 2, 1, 8), (0, 1, 1, 0)),
          5: ((2, 2, 2, 2, 8), (2, 1, 2, 1, 8), (0, 1, 0, 1, 0))}
# Mosaic's tensor-map type codes (launch_context._tma_dma_type)
CODES = {np.dtype(np.float16): 5, np.dtype(np.float32): 6,
         np.dtype(FLOAT_TYPES["bf16"]): 7, np.dtype(np.uint32): 3, np.dtype(np.int32): 9,
         np.dtype(np.uint64): 4, np.dtype(np.int64): 10}
BITS = {2: "i16", 4: "i32", 8: "i64"}


def _coords(start: tuple[int, ...], first: int) -> tuple[str, str, list[tuple[str, str]]]:
    """Constants for the box start (innermost first, as PTX takes them):
    (MLIR, the ``$k`` list from operand ``first`` on, the operands)."""
    names = [(f"%at{k}", v) for k, v in enumerate(reversed(start))]
    consts = "\n".join(f"{n} = llvm.mlir.constant({v} : i32) : i32" for n, v in names)
    dollars = ", ".join(f"${first + k}" for k in range(len(names)))
    return consts, dollars, [(n, "i32") for n, _ in names]


def _reduce(x: np.ndarray, src: np.ndarray, op: str, rank: int, code: int,
            prefetch: str = "") -> np.ndarray:
    """Thread t stores src[t] at element t of the SMEM box; thread 0 reduces
    the box into x at SHAPES[rank]'s start; returns x after."""
    _, box, start = SHAPES[rank]
    ity = BITS[x.dtype.itemsize]
    consts, dollars, operands = _coords(start, 3)
    body = f"""
      %tile = llvm.getelementptr %smem[128] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
      %mine = llvm.getelementptr %tile[%t] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, {ity}
      %from = llvm.getelementptr %src[%t] : (!llvm.ptr, i32) -> !llvm.ptr, {ity}
      %v = llvm.load %from : !llvm.ptr -> {ity}
      llvm.store %v, %mine : {ity}, !llvm.ptr<3>
      {consts}
      {prefetch}
      {side("fence.proxy.async.shared::cta;")}
      {side("bar.sync 0;")}
      {side(REDUCE.format(rank=rank, op=op, coords=dollars), "b,l,l" + ",r" * rank,
            ("%first", "i1"), ("%tile", "!llvm.ptr<3>"), ("%desc", "!llvm.ptr"), *operands)}
      {side("@$0 cp.async.bulk.commit_group;", "b", ("%first", "i1"))}
      {side("cp.async.bulk.wait_group.read 0;")}
      llvm.store %v, %mine : {ity}, !llvm.ptr<3>
      {side("cp.async.bulk.wait_group 0;")}"""
    inputs = {**tma_inputs(x, box), "src": ("!llvm.ptr", src)}
    got = run(init_tma_desc(dtype_code=code, rank=rank) + LAUNCH.format(threads=32, smem=512,
                                                                      body=body),
              inputs, host=True, prelude=INIT, sanitize=True)
    return got["x"]


def _box(rank: int) -> tuple[slice, ...]:
    _, box, start = SHAPES[rank]
    return tuple(slice(s, s + b) for s, b in zip(start, box))


def _combined(x: np.ndarray, src: np.ndarray, rank: int, fn) -> np.ndarray:
    want = x.copy()
    at = _box(rank)
    with np.errstate(all="ignore"):
        want[at] = fn(x[at], src.reshape(want[at].shape))
    return want


def _ints(dt: np.dtype, n: int, seed: int) -> np.ndarray:
    """Every edge value of the type (as signed, viewed as ``dt``), then random ones."""
    signed = {4: "i32", 8: "i64"}[dt.itemsize]
    edges = np.array(int_edges(signed), np.int64)
    rng = np.random.default_rng(seed)
    vals = np.concatenate([rng.permutation(edges), rng.integers(-2 ** 31, 2 ** 31, n)])[:n]
    return vals.astype(np.dtype(f"i{dt.itemsize}")).view(dt)


def _inc(d, s):
    return np.where(d >= s, 0, d + 1).astype(d.dtype)


def _dec(d, s):
    return np.where((d == 0) | (d > s), s, d - 1).astype(d.dtype)


INT_OPS = {"add": np.add, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and,
           "or": np.bitwise_or, "xor": np.bitwise_xor, "inc": _inc, "dec": _dec}
INT_CASES = ([("u32", op) for op in INT_OPS] + [("s32", "min"), ("s32", "max"), ("u64", "add"),
             ("u64", "min"), ("s64", "max")])


@pytest.mark.parametrize("ty,op", INT_CASES)
@covers(REDUCE_FORM, "llvm.inline_asm")
def test_integer_reductions_equal_numpy(ty, op):
    """Add wraps; min/max compare as the map's type says (jax gives smin/smax
    a signed map, everything else an unsigned one); inc/dec wrap at the bound."""
    dt = np.dtype({"u32": np.uint32, "s32": np.int32, "u64": np.uint64, "s64": np.int64}[ty])
    x = _ints(dt, 64, 1)[:40].reshape(SHAPES[1][0])
    src = _ints(dt, 32, 2)
    if op in ("inc", "dec"):
        x = (np.arange(40) % 5).astype(dt)
        src = np.array([0, 1, 2, 3, 4, -1] * 6, np.int64)[:32].astype(dt)
    want = _combined(x, src, 1, INT_OPS[op])
    assert_same_bits(_reduce(x, src, op, 1, CODES[dt]), want)


def _floats(ty: str, n: int, seed: int) -> np.ndarray:
    e = float_edges(ty)
    return np.random.default_rng(seed).permutation(np.tile(e, n // e.size + 1))[:n]


@pytest.mark.parametrize("ty", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("op", ["add", "min", "max"])
@covers(REDUCE_FORM)
def test_float_reductions_round_once_and_let_nan_lose_min_max(ty, op):
    dt = np.dtype(FLOAT_TYPES[ty])
    x = _floats(ty, 96, 3).reshape(SHAPES[2][0])
    src = _floats(ty, 32, 4)
    if op == "add":
        def fn(d, s):
            return (d.astype(np.float64) + s.astype(np.float64)).astype(dt)
    else:
        fn = np.fmin if op == "min" else np.fmax
    want = _combined(x, src, 2, lambda d, s: fn(d, s).astype(dt))
    bits = np.dtype(f"i{dt.itemsize}")
    got = _reduce(x.view(bits), src.view(bits), op, 2, CODES[dt])
    if op == "add":
        assert_same_bits(got.view(dt), want)
    else:  # the sign of a zero from two zeros is not said
        np.testing.assert_array_equal(got.view(dt).astype(np.float64), want.astype(np.float64))


@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
@covers(REDUCE_FORM, PREFETCH_FORM)
def test_every_rank_reduces_its_box_and_a_prefetch_changes_nothing(rank):
    """add of the box at SHAPES[rank]'s start, after a prefetch of the same
    box (with and without .tile): only the box changes."""
    shape = SHAPES[rank][0]
    x = np.arange(np.prod(shape), dtype=np.int32).reshape(shape) * 3 + 50
    src = (2 ** 31 - 1 - 7 * np.arange(32)).astype(np.int32)  # some wrap past INT_MAX
    _, dollars, operands = _coords(SHAPES[rank][2], 2)
    prefetch = "\n".join(side(PREFETCH.format(rank=rank, tile=tile, coords=dollars),
                              "b,l" + ",r" * rank, ("%first", "i1"), ("%desc", "!llvm.ptr"),
                              *operands) for tile in (".tile", ""))
    want = _combined(x, src, rank, lambda d, s: (d.astype(np.int64) + s).astype(np.int32))
    assert_same_bits(_reduce(x.view(np.uint32), src, "add", rank, 3, prefetch).view(np.int32),
                     want)


@covers(PREFETCH_FORM)
def test_a_prefetch_through_a_map_of_another_rank_is_an_error():
    x = np.zeros(SHAPES[2][0], np.float32)
    prefetch = side(PREFETCH.format(rank=3, tile=".tile", coords="$2, $3, $4"), "b,l,r,r,r",
                    ("%first", "i1"), ("%desc", "!llvm.ptr"), ("%at0", "i32"), ("%at1", "i32"),
                    ("%at0", "i32"))
    with pytest.raises(EmulationError, match="a 3-d TMA prefetch through a rank-2 tensor map"):
        _reduce(x, np.zeros(32, np.float32), "add", 2, 6, prefetch)
