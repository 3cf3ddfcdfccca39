"""The constraint language and the solver, checked against jax's own semantics."""

from __future__ import annotations

import itertools

import pytest
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import constraints as jax_cs  # the reference
from jax.experimental.mosaic.gpu import dialect_lowering as jax_lowering  # the reference
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import launch_context as lc

from smalti import kernels, layouts
from smalti.constraints import (
    UNSUPPORTED,
    Collapsed,
    Constraint,
    Derived,
    Divides,
    Equal,
    Excludes,
    MinorDimDivisibleBy,
    OneOf,
    Reduced,
    Relayout,
    Reshaped,
    Transposed,
    Variable,
    merge_multiples,
)
from smalti.layouts import RegisterLayout, SmemTransforms
from smalti.sites import SiteKind, ValueSite
from smalti.solver import ConstraintSystem, Origin, Solver, Unsolvable, solve

REGISTER_LAYOUTS = [
    fa.WGMMA_LAYOUT, fa.WGMMA_TRANSPOSED_LAYOUT, fa.WGMMA_ROW_LAYOUT, fa.TCGEN05_LAYOUT,
    fa.TCGEN05_TRANSPOSED_LAYOUT, fa.TMEM_NATIVE_LAYOUT, fa.WGMMA_LAYOUT_UPCAST_2X,
    fa.WGMMA_LAYOUT_UPCAST_4X, fa.WGSplatFragLayout((128, 128)),
    fa.WGStridedFragLayout((128, 128), 2), fa.WGStridedFragLayout((128, 128), 4),
]


def jax_value(expr):
    """jax's reduction of a constant expression, as a smalti constant (or UNSUPPORTED)."""
    result = jax_cs.reduce_expression(expr, {})
    match result:
        case jax_cs.RegisterLayout(value=v):
            return RegisterLayout(v)
        case jax_cs.SMEMTransforms(tiling=t, swizzle=s):
            return SmemTransforms(None if t is None else t.tiling, s)
    return UNSUPPORTED  # unreduced or unsatisfiable: no layout


@pytest.mark.parametrize("layout", REGISTER_LAYOUTS, ids=str)
@pytest.mark.parametrize("axes", [(0,), (1,), (0, 1)])
@pytest.mark.parametrize("keep_dims", [False, True])
def test_reduced_matches_jax(layout, axes, keep_dims):
    ours = Reduced(RegisterLayout(layout), axes, 2, keep_dims).apply(RegisterLayout(layout))
    theirs = jax_value(jax_cs.Reduce(jax_cs.RegisterLayout(layout), axes, 2, keep_dims))
    if keep_dims and isinstance(layout, fa.TiledLayout):
        # jax cannot reduce tiled layouts keeping dims; smalti puts the reduced
        # dims back into the tiling as size-1 dims (see test_vector_ops.py).
        assert theirs is UNSUPPORTED
        untiled = 2 - len(layout.base_tile_shape)
        tiled = tuple(a - untiled for a in axes if a >= untiled)
        if not tiled:
            assert ours == RegisterLayout(layout)
        elif len(tiled) == len(layout.base_tile_shape):
            assert ours is UNSUPPORTED
        else:
            expected = layouts.insert_unit_dims(layout.reduce(tiled), tiled)
            assert ours == RegisterLayout(expected)
            assert layouts.remove_unit_dims(ours.layout, tiled) == layout.reduce(tiled)
        return
    assert ours == theirs


@pytest.mark.parametrize("layout", REGISTER_LAYOUTS, ids=str)
@pytest.mark.parametrize("target", [(16384,), (2, 64, 128), (128, 128), (64, 256), (256, 64)])
def test_reshaped_matches_jax(layout, target):
    source = (128, 128)
    ours = Reshaped(None, source, target).apply(RegisterLayout(layout))
    theirs = jax_value(jax_cs.Reshape(jax_cs.RegisterLayout(layout), source, target))
    if isinstance(layout, (fa.WGSplatFragLayout, fa.WGStridedFragLayout)):
        assert ours == theirs
    else:
        # jax leaves unsupported tiled reshapes unreduced; both mean "no layout".
        assert ours == theirs or (ours is UNSUPPORTED and theirs is UNSUPPORTED)


TILINGS = [(8, 64), (8, 32), (1, 128), (64, 8), (8, 8, 32), (2, 8, 64)]


@pytest.mark.parametrize("tiling", TILINGS)
@pytest.mark.parametrize("perm", list(itertools.permutations(range(3))))
def test_transposed_matches_jax(tiling, perm):
    value = SmemTransforms(tiling, 128)
    ours = Transposed(None, perm).apply(value)
    theirs = jax_value(jax_cs.Transpose(
        jax_cs.SMEMTransforms(lc.TileTransform(tiling), 128), perm))
    assert ours == theirs


@pytest.mark.parametrize("tiling", TILINGS + [(1, 1, 64), (4, 16, 64)])
@pytest.mark.parametrize("reassociation", [(1, 2), (2, 1), (3,), (1, 1, 1)])
def test_collapsed_matches_jax(tiling, reassociation):
    shape = (4, 16, 128)
    ours = Collapsed(None, shape, reassociation).apply(SmemTransforms(tiling, 64))
    theirs = jax_value(jax_cs.CollapseShape(
        jax_cs.SMEMTransforms(lc.TileTransform(tiling), 64), shape, reassociation))
    assert ours == theirs


@pytest.mark.parametrize("src", REGISTER_LAYOUTS, ids=str)
@pytest.mark.parametrize("dst", REGISTER_LAYOUTS, ids=str)
@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("bitwidth", [4, 8, 16, 32])
def test_relayout_matches_jax(src, dst, strict, bitwidth):
    ours = layouts.can_relayout(src, dst, bitwidth=bitwidth, strict=strict)
    constraint = jax_cs.Relayout(jax_cs.RegisterLayout(src), jax_cs.RegisterLayout(dst),
                                 bitwidth, strict).canonicalize()
    theirs = constraint.holds()
    assert ours == theirs


@pytest.mark.parametrize("strides", [(128, 1), (1, 128), (4096, 64, 1), (64, 4096, 1),
                                     (8192, 1, 64), (256, 2, 1)])
@pytest.mark.parametrize("tiling", [(8, 64), (8, 32), (1, 64), (2, 32), (64,)])
def test_tiled_strides_match_jax(strides, tiling):
    try:
        theirs = jax_lowering.tile_strides(strides, tiling)
    except ValueError:
        theirs = None
    try:
        ours = layouts.tiled_strides(strides, tiling)
    except ValueError:
        ours = None
    assert ours == theirs


def test_transformed_type_matches_jax():
    from smalti.refs import transformed_type

    context = kernels.make_context()
    with context, ir.Location.unknown():
        for text, tiling, swizzle in [
            ("memref<128x64xf16, #gpu.address_space<workgroup>>", (8, 64), 128),
            ("memref<2x128x64xf32, #gpu.address_space<workgroup>>", (8, 32), 128),
            ("memref<64x128xbf16, strided<[128, 1], offset: 8192>, #gpu.address_space<workgroup>>",
             (8, 64), 128),
            ("memref<64x128xbf16, #gpu.address_space<workgroup>>", None, 64),
        ]:
            ty = ir.MemRefType(ir.Type.parse(text))
            attr = layouts.to_attribute(SmemTransforms(tiling, swizzle))
            assert transformed_type(ty, attr) == jax_lowering.transform_type(ty, attr)


def test_divides_merge_and_check():
    assert merge_multiples((64, 128), (8, 64)) == (8, 64)
    assert merge_multiples((4, 64, 128), (96,)) == (32,)
    assert merge_multiples((), (8, 8)) == ()
    check = Divides(None, (64, 128)).check
    assert check((SmemTransforms((8, 64), 128),))
    assert not check((SmemTransforms((8, 256), 128),))
    assert not check((SmemTransforms((2, 8, 64), 128),))  # higher rank than the multiple
    assert check((SmemTransforms(None, None),))
    assert check((RegisterLayout(fa.WGStridedFragLayout((128, 128), 2)),))
    assert MinorDimDivisibleBy(None, 16).check((SmemTransforms((8, 64), 128),))
    assert not MinorDimDivisibleBy(None, 128).check((SmemTransforms((8, 64), 128),))


def test_one_of_dedupes_and_rejects_empty():
    wgmma = RegisterLayout(fa.WGMMA_LAYOUT)
    assert OneOf(None, (wgmma, wgmma)).allowed == (wgmma,)
    assert OneOf(None, [wgmma, RegisterLayout(fa.WGMMA_LAYOUT)]).allowed == (wgmma,)
    # A tuple handed again (rules pass cached ones) is deduped the same way.
    repeated = (wgmma, RegisterLayout(fa.WGMMA_LAYOUT), SmemTransforms(None, None))
    assert OneOf(None, repeated).allowed == OneOf(None, repeated).allowed == (
        wgmma, SmemTransforms(None, None))
    with pytest.raises(ValueError):
        OneOf(None, ())


def test_built_in_statements_compare_by_value_and_show_their_fields():
    wgmma = RegisterLayout(fa.WGMMA_LAYOUT)
    # Sequences are stored as tuples, so a list and a tuple state the same thing.
    assert Reduced(wgmma, [1], 2) == Reduced(wgmma, (1,), 2, keep_dims=False)
    assert Reduced(wgmma, (1,), 2) != Reduced(wgmma, (1,), 2, keep_dims=True)
    assert Reshaped(wgmma, [128, 128], [16384]).target_shape == (16384,)
    assert Equal(wgmma, wgmma) != Relayout(wgmma, wgmma, 16)  # another kind of statement
    assert Relayout(wgmma, wgmma, 16) == Relayout(wgmma, wgmma, 16, strict=False)
    assert repr(Divides(None, [64, 128])) == "Divides(expr=None, multiple=(64, 128))"
    assert repr(Transposed(None, [1, 0])) == "Transposed(expression=None, permutation=(1, 0))"
    # Mutable value objects: like attrs' classes that compare by value, unhashable.
    with pytest.raises(TypeError):
        hash(Equal(wgmma, wgmma))
    with pytest.raises(AttributeError):  # fields only: no __dict__ per statement
        Equal(wgmma, wgmma).note = "x"


@pytest.mark.parametrize("make", [
    lambda: Reduced(None, (1, 0), 2),  # axes not sorted
    lambda: Reduced(None, (), 2),
    lambda: Transposed(None, (0, 0)),  # not a permutation
    lambda: Collapsed(None, (4, 8, 16), (1, 1)),  # does not cover the source dims
    lambda: Collapsed(None, (4, 8), (2, 0)),
], ids=["unsorted axes", "no axes", "not a permutation", "short reassociation",
        "empty group"])
def test_built_in_statements_reject_malformed_fields(make):
    with pytest.raises(ValueError):
        make()


def test_register_layout_of_is_one_shared_constant_per_layout():
    shared = RegisterLayout.of(fa.WGMMA_LAYOUT)
    # Equal layouts built apart give the same object, equal to a plain one.
    assert RegisterLayout.of(fa.TiledLayout(
        fa.WGMMA_LAYOUT.tiling, fa.WGMMA_LAYOUT.warp_dims, fa.WGMMA_LAYOUT.lane_dims,
        fa.WGMMA_LAYOUT.vector_dim)) is shared
    assert shared == RegisterLayout(fa.WGMMA_LAYOUT)
    assert RegisterLayout.of(fa.WGSplatFragLayout((128,))) is not shared


def test_reduced_preimages_include_every_layout_that_reduces_to_the_result():
    from smalti.constraints import Variable
    from smalti.sites import SiteKind, ValueSite

    with kernels.make_context(), ir.Location.unknown():
        ty = ir.VectorType.get((128, 128), ir.F32Type.get())
        module = ir.Module.parse(
            "func.func @f() { %0 = arith.constant dense<1.0> : vector<128x128xf32> return }")
        op = module.body.operations[0].regions[0].blocks[0].operations[0]
        var = Variable(0, ValueSite(op, SiteKind.RESULT, 0), layouts.MemorySpace.REG)
        expr = Reduced(var, (1,), 2)
        row = RegisterLayout(fa.WGMMA_ROW_LAYOUT)
        preimages = list(expr.preimages(row, var))
        assert RegisterLayout(fa.WGMMA_LAYOUT) in preimages
        assert all(expr.apply(p) == row for p in preimages)
        del ty


def test_constraint_language_is_open_to_new_constraints():
    """A plugin-defined constraint takes part in solving like a built-in one."""
    class NotWgmma(Constraint):
        def __init__(self, expr):
            self.expr = expr

        def expressions(self):
            return (self.expr,)

        def check(self, values):
            return values[0] != RegisterLayout(fa.WGMMA_LAYOUT)

        def candidates(self, ctx):
            yield self.expr, RegisterLayout(fa.TCGEN05_LAYOUT)

    with kernels.make_context(), ir.Location.unknown():
        module = ir.Module.parse(
            "func.func @f() { %0 = arith.constant dense<1.0> : vector<128x128xf32> return }")
        op = module.body.operations[0].regions[0].blocks[0].operations[0]
        var = Variable(0, ValueSite(op, SiteKind.RESULT, 0), layouts.MemorySpace.REG)
        system = ConstraintSystem(variables=[var])
        system.require(NotWgmma(var), Origin("a custom rule"))
        assert solve(system, (9, 0))[var] == RegisterLayout(fa.TCGEN05_LAYOUT)

        system = ConstraintSystem(variables=[var])
        system.require(NotWgmma(var), Origin("a custom rule"))
        system.assignments.append((var, RegisterLayout(fa.WGMMA_LAYOUT), Origin("a cast")))
        with pytest.raises(Unsolvable) as error:
            solve(system, (9, 0))
        assert any("a custom rule" in line for line in error.value.lines)


def test_constraints_restated_on_one_class_are_solved_as_one():
    """Kernels state the same OneOf / Excludes about one class many times (an
    MMA per step on the same refs); the solver keeps one of each, but every
    different statement still counts, and a conflict still names a rule."""
    wgmma, tcgen05 = RegisterLayout.of(fa.WGMMA_LAYOUT), RegisterLayout.of(fa.TCGEN05_LAYOUT)
    strided = RegisterLayout(fa.WGStridedFragLayout((128, 128), 4))
    options = (wgmma, tcgen05, strided)
    with kernels.make_context(), ir.Location.unknown():
        module = ir.Module.parse(
            "func.func @f() { %0 = arith.constant dense<1.0> : vector<128x128xf32> return }")
        op = module.body.operations[0].regions[0].blocks[0].operations[0]

        def system_of(statements, assigned=None):
            variables = [Variable(i, ValueSite(op, SiteKind.RESULT, 0),
                                  layouts.MemorySpace.REG) for i in range(4)]
            system = ConstraintSystem(variables=variables)
            for a, b in itertools.pairwise(variables):
                system.require(Equal(a, b), Origin("a join"))
            for i, make in enumerate(statements):
                system.require(make(variables[i % 4]), Origin(f"rule {i}"))
            if assigned is not None:
                system.assignments.append((variables[3], assigned, Origin("a cast")))
            return variables, system

        restated = [lambda v: OneOf(v, options)] * 3
        variables, system = system_of(restated)
        assert set(solve(system, (9, 0)).values()) == {wgmma}  # the first tiled option
        # Other statements on the class each still count.
        variables, system = system_of(
            [*restated, lambda v: Excludes(v, fa.WGStridedFragLayout),
             lambda v: Excludes(v, fa.WGStridedFragLayout),
             lambda v: OneOf(v, (strided, tcgen05))])
        assert set(solve(system, (9, 0)).values()) == {tcgen05}
        variables, system = system_of([*restated, lambda v: OneOf(v, (strided,))])
        assert set(solve(system, (9, 0)).values()) == {strided}
        # A value outside the restated options is rejected, naming a rule.
        variables, system = system_of(
            restated, assigned=RegisterLayout.of(fa.WGMMA_TRANSPOSED_LAYOUT))
        with pytest.raises(Unsolvable) as error:
            solve(system, (9, 0))
        assert any("rule " in line for line in error.value.lines)


def test_strict_relayout_is_decided_by_its_source_whichever_is_known_first():
    """The solver watches a strict relayout at its source (and at its target
    only once the source is known splat): a layout reached either way must
    still be checked, and a non-splat source still implies its target."""
    wgmma, tcgen05 = RegisterLayout.of(fa.WGMMA_LAYOUT), RegisterLayout.of(fa.TCGEN05_LAYOUT)
    splat = RegisterLayout.of(fa.WGSplatFragLayout((128, 128)))
    with kernels.make_context(), ir.Location.unknown():
        module = ir.Module.parse(
            "func.func @f() { %0 = arith.constant dense<1.0> : vector<128x128xf32> return }")
        op = module.body.operations[0].regions[0].blocks[0].operations[0]

        def solved(source_value, target_value, *, target_first):
            source, target, pinned = (
                Variable(i, ValueSite(op, SiteKind.RESULT, 0), layouts.MemorySpace.REG)
                for i in range(3))
            system = ConstraintSystem(variables=[source, target, pinned])
            system.require(Relayout(source, target, 32, strict=True), Origin("a use"))
            # One side is known from the start, the other only through a
            # chain of equalities the propagation walks later.
            first, later = (target, source) if target_first else (source, target)
            first_value, later_value = ((target_value, source_value) if target_first
                                        else (source_value, target_value))
            if first_value is not None:
                system.assignments.append((first, first_value, Origin("a cast")))
            if later_value is not None:
                system.require(Equal(pinned, later_value), Origin("a pin"))
                system.require(Equal(later, pinned), Origin("a join"))
            solution = solve(system, (9, 0))
            return solution[source], solution[target]

        for target_first in (False, True):
            assert solved(wgmma, wgmma, target_first=target_first) == (wgmma, wgmma)
            assert solved(splat, tcgen05, target_first=target_first) == (splat, tcgen05)
            with pytest.raises(Unsolvable):
                solved(wgmma, tcgen05, target_first=target_first)
        assert solved(wgmma, None, target_first=False) == (wgmma, wgmma)  # implied
        assert solved(None, tcgen05, target_first=True)[1] == tcgen05


class _Unkeyed(Derived):
    """A plugin's derivation that does not say what decides it (the default)."""

    def __init__(self, expression):
        self.expression = expression

    def apply(self, value):
        return value


def test_variables_equal_to_one_derivation_of_one_class_are_one_class():
    """Row sums of one value taken at every step of a kernel have one layout:
    the solver merges the variables equal to derivations with equal
    congruence keys of one class, and still checks what each was required."""
    wgmma = RegisterLayout.of(fa.WGMMA_LAYOUT)
    with kernels.make_context(), ir.Location.unknown():
        module = ir.Module.parse(
            "func.func @f() { %0 = arith.constant dense<1.0> : vector<128x128xf32>\n"
            "%1 = arith.constant dense<1.0> : vector<128xf32> return }")
        block = module.body.operations[0].regions[0].blocks[0]
        big, row = block.operations[0], block.operations[1]

        def solved(*, pinned=None):
            x, y = (Variable(i, ValueSite(big, SiteKind.RESULT, 0), layouts.MemorySpace.REG)
                    for i in range(2))
            r1, r2, r3, u1, u2 = (
                Variable(i, ValueSite(row, SiteKind.RESULT, 0), layouts.MemorySpace.REG)
                for i in range(2, 7))
            system = ConstraintSystem(variables=[x, y, r1, r2, r3, u1, u2])
            system.require(Equal(x, y), Origin("a join"))
            system.require(Equal(r1, Reduced(x, (1,), 2)), Origin("a row sum"))
            system.require(Equal(Reduced(y, (1,), 2), r2), Origin("another row sum"))
            system.require(Equal(r3, Reduced(x, (0,), 2)), Origin("a column sum"))
            system.require(Equal(u1, _Unkeyed(r1)), Origin("a plugin's"))
            system.require(Equal(u2, _Unkeyed(r1)), Origin("a plugin's"))
            system.assignments.append((x, wgmma, Origin("a cast")))
            if pinned is not None:
                system.assignments.append((r2, pinned, Origin("a pin")))
            solver = Solver(system, (9, 0))
            return solver, (r1, r2, r3, u1, u2), solver.solve()

        solver, (r1, r2, r3, u1, u2), solution = solved()
        x = solver.variables[0]
        rows = Reduced(x, (1,), 2).apply(wgmma)
        assert solution[r1] == solution[r2] == solution[u1] == solution[u2] == rows
        assert solution[r3] == Reduced(x, (0,), 2).apply(wgmma) != rows
        assert solver.find(r1.id) == solver.find(r2.id) != solver.find(r3.id)
        assert solver.find(u1.id) != solver.find(u2.id)  # no key: solved, not merged
        # What the merged Equal required is still checked.
        with pytest.raises(Unsolvable) as error:
            solved(pinned=Reduced(x, (0,), 2).apply(wgmma))
        assert any("row sum" in line for line in error.value.lines)


def test_solver_points_every_variable_at_its_class_root():
    """Once classes are merged, the solver flattens them in one pass in
    order (a union keeps the earliest variable as root): long chains of
    Equals, stated in any order and joined late, end with every variable's
    parent its class's root, and every variable gets its class's layout."""
    wgmma = RegisterLayout.of(fa.WGMMA_LAYOUT)
    with kernels.make_context(), ir.Location.unknown():
        module = ir.Module.parse(
            "func.func @f() { %0 = arith.constant dense<1.0> : vector<128x128xf32> return }")
        op = module.body.operations[0].regions[0].blocks[0].operations[0]
        n = 64
        variables = [Variable(i, ValueSite(op, SiteKind.RESULT, 0), layouts.MemorySpace.REG)
                     for i in range(n)]
        system = ConstraintSystem(variables=list(variables))
        # Two chains built from their far ends (deep trees before any
        # path is compressed), then joined at their last variables.
        for i in reversed(range(1, n // 2)):
            system.require(Equal(variables[i - 1], variables[i]), Origin("evens"))
        for i in reversed(range(n // 2 + 1, n)):
            system.require(Equal(variables[i], variables[i - 1]), Origin("odds"))
        system.require(Equal(variables[n - 1], variables[n // 2 - 1]), Origin("the join"))
        system.assignments.append((variables[n - 1], wgmma, Origin("a cast")))
        solver = Solver(system, (9, 0))
        solution = solver.solve()
        assert all(solution[v] == wgmma for v in variables)
        assert solver.parent == [0] * n
