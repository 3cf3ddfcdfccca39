"""What :mod:`smalti.vocabulary.index_ranges` reads from the ops that
computed an index: each op's range rule on its edge values (the type's
ends, negative operands, overflow), unknown where nothing narrower holds,
and jnp's wrap of negative indices recognized in both operand orders and
not in its near misses."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, func, vector

from smalti.vocabulary import index_ranges
from smalti.vocabulary.index_ranges import bounds, constant, unwrapped

I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1


@pytest.fixture
def build() -> Iterator[Callable[..., ir.Value]]:
    """``build(fn)``: ``fn(x, v)`` called inside a function whose arguments
    are an i32 ``x`` and a ``vector<4xi32>`` ``v``, its result returned."""
    with mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.create()
        i32 = ir.IntegerType.get_signless(32)
        vec = ir.VectorType.get([4], i32)
        with ir.InsertionPoint(module.body):
            f = func.FuncOp("f", ir.FunctionType.get([i32, vec], []))
            block = f.add_entry_block()

        def run(fn: Callable[[ir.Value, ir.Value], ir.Value]) -> ir.Value:
            with ir.InsertionPoint(block):
                return fn(*block.arguments)

        yield run


def c(value: int, bits: int = 32) -> ir.Value:
    return arith.constant(ir.IntegerType.get_signless(bits), value)


def splat(value: int) -> ir.Value:
    vec = ir.VectorType.get([4], ir.IntegerType.get_signless(32))
    return vector.broadcast(vec, c(value))


def test_unknown_values_and_constants(build):
    assert build(lambda x, v: bounds(x)) is None  # an argument: anything
    assert build(lambda x, v: bounds(c(7))) == (7, 7)
    assert build(lambda x, v: bounds(c(-1))) == (-1, -1)
    assert build(lambda x, v: bounds(splat(I32_MIN))) == (I32_MIN, I32_MIN)
    assert build(lambda x, v: constant(splat(5))) == 5
    assert build(lambda x, v: constant(v)) is None


def test_dense_splat_constants(build):
    def fn(x, v):
        t = ir.VectorType.get([4], ir.IntegerType.get_signless(32))
        dense = arith.constant(t, ir.DenseElementsAttr.get_splat(
            t, ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 127)))
        return constant(dense), bounds(arith.andi(v, dense))
    assert build(fn) == (127, (0, 127))


def test_and_with_a_non_negative_operand(build):
    assert build(lambda x, v: bounds(arith.andi(v, splat(127)))) == (0, 127)
    assert build(lambda x, v: bounds(arith.andi(splat(63), v))) == (0, 63)
    assert build(lambda x, v: bounds(arith.andi(v, splat(0)))) == (0, 0)
    # a negative mask keeps the sign bit: nothing known
    assert build(lambda x, v: bounds(arith.andi(v, splat(-128)))) is None
    # two known operands: the smaller bound
    assert build(lambda x, v: bounds(
        arith.andi(arith.andi(v, splat(255)), splat(1000)))) == (0, 255)


def test_remainders(build):
    assert build(lambda x, v: bounds(arith.remui(v, splat(96)))) == (0, 95)
    # signed: the dividend's sign, so both sides unless it is non-negative
    assert build(lambda x, v: bounds(arith.remsi(v, splat(96)))) == (-95, 95)
    assert build(lambda x, v: bounds(
        arith.remsi(arith.andi(v, splat(I32_MAX)), splat(96)))) == (0, 95)
    assert build(lambda x, v: bounds(
        arith.remsi(arith.andi(v, splat(7)), splat(96)))) == (0, 7)
    assert build(lambda x, v: bounds(arith.remui(v, splat(0)))) is None
    assert build(lambda x, v: bounds(arith.remui(v, v))) is None  # not a constant


def test_clamps_and_selects(build):
    def clip(v, lo, hi):
        return arith.minsi(arith.maxsi(v, splat(lo)), splat(hi))
    assert build(lambda x, v: bounds(clip(v, 0, 127))) == (0, 127)
    assert build(lambda x, v: bounds(clip(v, -3, I32_MAX))) == (-3, I32_MAX)
    assert build(lambda x, v: bounds(arith.minsi(v, splat(5)))) == (I32_MIN, 5)

    def sel(x, v):
        cond = arith.cmpi(arith.CmpIPredicate.slt, v, splat(0))
        return bounds(arith.select(cond, clip(v, 0, 3), clip(v, 10, 20)))
    assert build(sel) == (0, 20)


def test_adds_that_cannot_overflow(build):
    masked = lambda v: arith.andi(v, splat(127))  # noqa: E731
    assert build(lambda x, v: bounds(arith.addi(masked(v), splat(128)))) == (128, 255)
    assert build(lambda x, v: bounds(arith.subi(masked(v), splat(128)))) == (-128, -1)
    assert build(lambda x, v: bounds(arith.subi(splat(0), masked(v)))) == (-127, 0)
    # one that may wrap around is unknown
    assert build(lambda x, v: bounds(
        arith.addi(arith.andi(v, splat(I32_MAX)), splat(1)))) is None
    assert build(lambda x, v: bounds(arith.addi(v, splat(1)))) is None


def test_shifts(build):
    assert build(lambda x, v: bounds(arith.shrui(v, splat(25)))) == (0, 127)
    assert build(lambda x, v: bounds(arith.shrsi(v, splat(25)))) == (-64, 63)
    assert build(lambda x, v: bounds(
        arith.shrui(arith.andi(v, splat(1023)), splat(3)))) == (0, 127)
    assert build(lambda x, v: bounds(arith.shrui(v, splat(0)))) is None
    assert build(lambda x, v: bounds(arith.shrui(v, splat(32)))) is None  # poison: unknown
    assert build(lambda x, v: bounds(arith.shrui(v, v))) is None


def test_extensions(build):
    i8 = ir.IntegerType.get_signless(8)
    i32 = ir.IntegerType.get_signless(32)
    assert build(lambda x, v: bounds(
        arith.extui(i32, arith.trunci(i8, x)))) == (0, 255)
    # any i8, sign-extended: the i8's range
    assert build(lambda x, v: bounds(arith.extsi(i32, arith.trunci(i8, x)))) == (-128, 127)
    assert build(lambda x, v: bounds(
        arith.extsi(i32, arith.andi(arith.trunci(i8, x), c(7, 8))))) == (0, 7)


def test_moves_keep_the_range_and_depth_is_bounded(build):
    def moved(x, v):
        vec = ir.VectorType.get([4], ir.IntegerType.get_signless(32))
        scalar = arith.andi(x, c(15))
        return bounds(vector.broadcast(vec, scalar))
    assert build(moved) == (0, 15)

    def deep(x, v):
        value = arith.andi(v, splat(15))
        for _ in range(index_ranges.DEPTH + 2):
            value = arith.andi(value, splat(-1))  # passes the range on
        return bounds(value), index_ranges._bounds(value, 100)
    shallow, far = build(deep)
    assert shallow is None and far == (0, 15)


def wrap(v: ir.Value, n: int, *, swap: bool = False, predicate=arith.CmpIPredicate.slt,
         zero: int = 0) -> ir.Value:
    """jnp's ``where(v < 0, v + n, v)``."""
    added = arith.addi(splat(n), v) if swap else arith.addi(v, splat(n))
    return arith.select(arith.cmpi(predicate, v, splat(zero)), added, v)


def test_unwrapped_recognizes_jnps_wrap(build):
    assert build(lambda x, v: unwrapped(wrap(v, 128), 128) == v)
    assert build(lambda x, v: unwrapped(wrap(v, 128, swap=True), 128) == v)


@pytest.mark.parametrize("miss", [
    dict(n=64),  # another axis length than the gather's
    dict(predicate=arith.CmpIPredicate.sle),
    dict(zero=1),
])
def test_unwrapped_refuses_near_misses(build, miss):
    n = miss.pop("n", 128)
    assert build(lambda x, v: unwrapped(wrap(v, n, **miss), 128)) is None


def test_unwrapped_refuses_other_operands(build):
    def other_value(x, v):
        w = arith.andi(v, splat(3))
        cond = arith.cmpi(arith.CmpIPredicate.slt, v, splat(0))
        return unwrapped(arith.select(cond, arith.addi(w, splat(128)), v), 128)
    assert build(other_value) is None
    assert build(lambda x, v: unwrapped(v, 128)) is None
    assert build(lambda x, v: unwrapped(arith.andi(v, splat(1)), 128)) is None
