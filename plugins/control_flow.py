"""Structured control flow: ``scf.for``, ``scf.while``, ``scf.if``, ``scf.index_switch``.

**Inference.** A value that crosses a region boundary appears at several
sites: a loop-carried value as the loop's init operand, the body's block
argument, the result and the operand of the body's terminator; a branch
result as the op's result and as the operand of every branch's ``scf.yield``.
All of them share one variable. Core links each site to its producer and
consumers as usual, so layouts flow both ways: into the body from the init
value, out of it through the terminator, and back from uses after the op.
The terminators (``scf.yield``, ``scf.condition``) get no rule call of their
own: their parent's rule maps their operands.

**Lowering.** A vector cannot cross a region boundary at Lane level: it
becomes its registers. The rules rebuild the op with every vector operand,
block argument, terminator operand and result replaced by the flat list of
its registers (in the chosen layout), move the old blocks' ops into the new
blocks and lower them there. Ops with regions but no vectors crossing them
keep their op; only the ops inside are lowered.

``scf.if`` with vector results is beyond jax 0.11.2 (it has no rule for it);
smalti handles it like ``scf.index_switch``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import scf
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

from smalti.records import Record
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import RECURSED, ConstraintBuilder, LoweringContext, default_is_signed
from smalti.sites import SiteKind, ValueSite, memory_space_of

YIELD = "scf.yield"
CONDITION = "scf.condition"

# scf.for's operands are (lower bound, upper bound, step, *inits).
_FOR_BOUNDS = 3


# --- helpers ---------------------------------------------------------------------------


def _terminator(op: ir.OpView, region: int) -> ir.Operation:
    """The terminator of the entry block of ``op``'s region ``region`` (the
    verifier guarantees it is an ``scf.yield``, or ``scf.condition`` for the
    ``before`` region of ``scf.while``)."""
    return op.operation.regions[region].blocks[0].operations[-1].operation


def _has_layout(value: ir.Value) -> bool:
    return memory_space_of(value) is not None


def _is_vector(value: ir.Value) -> bool:
    return isinstance(value.type, ir.VectorType)


def _operand_site(op: ir.Operation, index: int) -> ValueSite:
    return ValueSite(op, SiteKind.OPERAND, index)


# --- constraint rules --------------------------------------------------------------------


def for_loop(op: scf.ForOp, b: ConstraintBuilder) -> None:
    """Each loop-carried value has one layout as init, body argument, result
    and yielded value (block argument 0 is the induction variable)."""
    yield_op = _terminator(op, 0)
    # The site order decides the order in which core links the sites to their
    # producers and consumers, hence the search order: keep jax's. SMEM and
    # TMEM refs share their producer's layout (jax maps no TMEM refs here,
    # and fails on them).
    # Result i is carried from init i: the op's own layout sites say which
    # carry a layout, without reading the operands again.
    for result in b.layout_sites():
        if result.kind is SiteKind.RESULT:
            i = result.index
            b.variable(b.operand(_FOR_BOUNDS + i), b.argument(0, i + 1), result,
                       _operand_site(yield_op, i))


def while_loop(op: scf.WhileOp, b: ConstraintBuilder) -> None:
    """An init shares its layout with the ``before`` region's argument and the
    value the ``after`` region yields back to it; a result with the ``after``
    region's argument and the value ``scf.condition`` forwards."""
    condition = _terminator(op, 0)
    yield_op = _terminator(op, 1)
    for i, init in enumerate(op.inits):
        if _has_layout(init):
            b.variable(b.operand(i), b.argument(0, i), _operand_site(yield_op, i))
    for i, result in enumerate(op.results):
        if _has_layout(result):
            # scf.condition's operand 0 is the condition itself.
            b.variable(b.result(i), b.argument(1, i), _operand_site(condition, i + 1))


def branches(op: ir.OpView, b: ConstraintBuilder) -> None:
    """A result of ``scf.if`` / ``scf.index_switch`` has one layout in every
    branch that yields it."""
    yields = [_terminator(op, r) for r in range(len(op.operation.regions))]
    for i, result in enumerate(op.operation.results):
        if _has_layout(result):
            b.variable(b.result(i), *(_operand_site(y, i) for y in yields))


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("scf.for")(for_loop)
    registry.constraint_rule("scf.while")(while_loop)
    registry.constraint_rule("scf.if", "scf.index_switch")(branches)


# --- lowering: vectors <-> flat registers --------------------------------------------------


class _VectorShape(Record):
    """How to rebuild a vector from its flattened registers."""

    __slots__ = ("registers_shape", "layout", "type")
    registers_shape: tuple[int, ...]
    layout: fa.FragmentedLayout
    type: ir.VectorType

    def __init__(self, registers_shape: tuple[int, ...], layout: fa.FragmentedLayout,
                 type: ir.VectorType) -> None:
        self._set(registers_shape, layout, type)

    @property
    def count(self) -> int:
        return math.prod(self.registers_shape)


#: One entry per original value: ``None`` for a value passed through as is.
Template = list[_VectorShape | None]


def _flatten(ctx: LoweringContext, values: Iterable[ir.Value],
             layouts: Sequence[ir.Attribute]) -> tuple[list[ir.Value], Template]:
    """Vectors become their registers (relaid out to ``layouts``, one per
    vector, in order); other values are kept."""
    layout_of_next_vector = iter(layouts)
    flat: list[ir.Value] = []
    template: Template = []
    for value in values:
        if not _is_vector(value):
            flat.append(value)
            template.append(None)
            continue
        array = ctx.from_ir(value, next(layout_of_next_vector))
        flat.extend(array.registers.flat)
        template.append(_VectorShape(array.registers.shape, array.layout,
                                     ir.VectorType(value.type)))
    return flat, template


def _unflatten(ctx: LoweringContext, flat: Sequence[ir.Value],
               template: Template) -> list[ir.Value]:
    """The inverse of :func:`_flatten`: packs registers back into vectors."""
    values: list[ir.Value] = []
    position = 0
    for entry in template:
        if entry is None:
            values.append(flat[position])
            position += 1
            continue
        registers = np.asarray(flat[position:position + entry.count], dtype=object)
        position += entry.count
        array = fa.FragmentedArray(
            _registers=registers.reshape(entry.registers_shape), _layout=entry.layout,
            _is_signed=default_is_signed(entry.type.element_type))
        values.append(ctx.to_ir(array, entry.type))
    return values


def _flat_result_types(op: ir.OpView, out_layouts: Sequence[ir.Attribute]) -> list[ir.Type]:
    """The result types of ``op`` once each vector result is its registers."""
    layout_of_next_vector = iter(out_layouts)
    types: list[ir.Type] = []
    for result in op.operation.results:
        if not _is_vector(result):
            types.append(result.type)
            continue
        vector = ir.VectorType(result.type)
        layout = mgpu_layouts.from_layout_attr(next(layout_of_next_vector))
        count = math.prod(layout.registers_shape(tuple(vector.shape)))
        types.extend([layout.registers_element_type(vector.element_type)] * count)
    return types


def _vector_layouts(ctx: LoweringContext, op: ir.Operation, side: str) -> list[ir.Attribute]:
    """``in_layouts`` / ``out_layouts`` of ``op``, empty when it has no vector there."""
    values = op.operands if side == "in" else op.results
    if not any(_is_vector(v) for v in values):
        return []
    return ctx.in_layouts(op) if side == "in" else ctx.out_layouts(op)


def _rebuild_terminator(ctx: LoweringContext, terminator: ir.Operation) -> Template:
    """Recreates ``terminator`` (at the current insertion point) with its
    vectors flattened; returns the template of what it passes on."""
    layouts = _vector_layouts(ctx, terminator, "in")
    if terminator.name == CONDITION:
        condition, *forwarded = terminator.operands
        flat, template = _flatten(ctx, forwarded, layouts)
        scf.condition(condition, flat)
    else:
        flat, template = _flatten(ctx, terminator.operands, layouts)
        scf.yield_(flat)
    terminator.erase()
    return template


def _move_block(ctx: LoweringContext, old: ir.Block, new: ir.Block, args: Template,
                *leading: ir.Value) -> Template:
    """Moves ``old``'s ops into ``new`` (whose arguments are ``leading`` and
    then the flattened ``args``), lowering each; rebuilds the terminator.
    Returns the template of the values the terminator passes on."""
    with ir.InsertionPoint(new):
        carried = _unflatten(ctx, list(new.arguments)[len(leading):], args)
        for old_arg, new_arg in zip(old.arguments, [*leading, *carried], strict=True):
            old_arg.replace_all_uses_with(new_arg)
        *body, terminator = list(old.operations)
        for inner in body:
            new.append(inner)  # moves it
            ctx.lower_op(inner)
        return _rebuild_terminator(ctx, terminator.operation)


def _traverse(ctx: LoweringContext, op: ir.OpView) -> object:
    """Lowers the ops inside ``op`` and keeps ``op`` itself."""
    for region in op.operation.regions:
        for block in region.blocks:
            for inner in list(block.operations):
                with ir.InsertionPoint(inner):
                    ctx.lower_op(inner)
    return RECURSED


def _carries_vectors(op: ir.OpView) -> bool:
    operation = op.operation
    return any(_is_vector(v) for v in [*operation.operands, *operation.results])


def _check_same(ctx: LoweringContext, op: ir.OpView, what: str,
                expected: Sequence[ir.Attribute], found: Sequence[ir.Attribute]) -> None:
    if list(expected) != list(found):
        raise ctx.fail(
            op, f"Layout mismatch: {what} must have the layouts of the values they carry",
            expected=[str(a) for a in expected], found=[str(a) for a in found],
            fix="re-run smalti.infer_layouts, which gives every carried value one layout")


# --- lowering rules --------------------------------------------------------------------------


def lower_for(ctx: LoweringContext, op: scf.ForOp) -> object:
    """Rebuilds the loop with its vectors as registers."""
    if not _carries_vectors(op):
        return _traverse(ctx, op)
    in_layouts, out_layouts = ctx.in_layouts(op), ctx.out_layouts(op)
    yield_op = _terminator(op, 0)
    _check_same(ctx, op, "the results", in_layouts, out_layouts)
    _check_same(ctx, op, "the yielded values", in_layouts, ctx.in_layouts(yield_op))
    flat_inits, template = _flatten(ctx, op.initArgs, in_layouts)
    new_op = scf.ForOp(op.lowerBound, op.upperBound, op.step, flat_inits)
    _move_block(ctx, op.body, new_op.body, template, new_op.induction_variable)
    return _unflatten(ctx, list(new_op.results), template)


def lower_while(ctx: LoweringContext, op: scf.WhileOp) -> object:
    """Rebuilds the loop with its vectors as registers, in both regions."""
    if not _carries_vectors(op):
        return _traverse(ctx, op)
    operation = op.operation
    in_layouts = _vector_layouts(ctx, operation, "in")
    out_layouts = _vector_layouts(ctx, operation, "out")
    if in_layouts:
        _check_same(ctx, op, "the yielded values", in_layouts,
                    ctx.in_layouts(_terminator(op, 1)))
    if out_layouts:
        _check_same(ctx, op, "the values scf.condition forwards", out_layouts,
                    ctx.in_layouts(_terminator(op, 0)))
    flat_inits, inits = _flatten(ctx, op.inits, in_layouts)
    result_types = _flat_result_types(op, out_layouts)
    new_op = scf.WhileOp(result_types, flat_inits)
    before = new_op.before.blocks.append(*[v.type for v in flat_inits])
    results = _move_block(ctx, op.before.blocks[0], before, inits)
    after = new_op.after.blocks.append(*result_types)
    _move_block(ctx, op.after.blocks[0], after, results)
    return _unflatten(ctx, list(new_op.results), results)


def _lower_branches(ctx: LoweringContext, op: ir.OpView, new_op: ir.OpView) -> list[ir.Value]:
    results: Template = []
    for region, new_region in zip(op.operation.regions, new_op.operation.regions, strict=True):
        results = _move_block(ctx, region.blocks[0], new_region.blocks[0], [])
    return _unflatten(ctx, list(new_op.operation.results), results)


def _check_branch_layouts(ctx: LoweringContext, op: ir.OpView,
                          out_layouts: Sequence[ir.Attribute]) -> None:
    for region in range(len(op.operation.regions)):
        yielded = _vector_layouts(ctx, _terminator(op, region), "in")
        _check_same(ctx, op, f"the values region {region} yields", out_layouts, yielded)


def lower_index_switch(ctx: LoweringContext, op: scf.IndexSwitchOp) -> object:
    """Rebuilds the switch with its vector results as registers."""
    if not _carries_vectors(op):
        return _traverse(ctx, op)
    out_layouts = ctx.out_layouts(op)
    _check_branch_layouts(ctx, op, out_layouts)
    new_op = scf.IndexSwitchOp(_flat_result_types(op, out_layouts), op.arg, op.cases)
    return _lower_branches(ctx, op, new_op)


def lower_if(ctx: LoweringContext, op: scf.IfOp) -> object:
    """Rebuilds the conditional with its vector results as registers."""
    if not _carries_vectors(op):
        return _traverse(ctx, op)
    out_layouts = ctx.out_layouts(op)
    _check_branch_layouts(ctx, op, out_layouts)
    new_op = scf.IfOp(op.condition, _flat_result_types(op, out_layouts), has_else=True)
    return _lower_branches(ctx, op, new_op)


def lower_terminator(ctx: LoweringContext, op: ir.OpView) -> object:
    """``scf.yield`` / ``scf.condition`` are rebuilt by their parent's rule;
    reached on their own (a loop without vectors), refs pass through as is."""
    if _carries_vectors(op):
        parent = op.operation.parent.name
        raise ctx.fail(
            op, f"{op.operation.name} passes vectors out of a {parent}, whose lowering does "
            "not turn them into registers",
            fix=f"return the vectors through scf.for / scf.while / scf.if / "
            f"scf.index_switch, or install a plugin that lowers {parent} with vectors")
    return RECURSED


def register_lowerings(registry: LoweringRegistry) -> None:
    # Like jax, loops and branches also lower inside mosaic_gpu.warp_map
    # bodies; scf.while does not.
    registry.lowering_rule("scf.for", warp_semantics=True)(lower_for)
    registry.lowering_rule("scf.while")(lower_while)
    registry.lowering_rule("scf.if", warp_semantics=True)(lower_if)
    registry.lowering_rule("scf.index_switch", warp_semantics=True)(lower_index_switch)
    registry.lowering_rule(YIELD, CONDITION, warp_semantics=True)(lower_terminator)
