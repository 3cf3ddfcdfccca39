"""Rules for ``vector.scatter`` and ``vector.gather`` on 1-D SMEM refs: the
dialect ops :func:`smalti.vocabulary.movement.take` goes through.

Semantics are MLIR's: ``vector.scatter %base[%o][%idx], %mask, %value``
stores ``value[i]`` at ``base[o + idx[i]]`` where ``mask[i]``;
``vector.gather %base[%o][%idx], %mask, %pass_thru`` reads ``base[o + idx[i]]``
where ``mask[i]`` and ``pass_thru[i]`` elsewhere. Indices, mask, value /
pass_thru and result have one shape.

Inference: indices, mask, value / pass_thru and result share one register
layout -- any layout, since each element is addressed by its own index --
and the ref is neither tiled nor swizzled.

Lowering: the operands are unpacked in that layout and each register
element becomes one scalar ``memref.load`` / ``memref.store`` on the plain
ref at its index (under ``scf.if`` when its mask element is not a constant
true). Threads of the warpgroup read what other threads wrote, so a scatter
is preceded and followed by a warpgroup barrier (the scratch is free; every
write is visible) and a gather is followed by one (every read is done before
the scratch is written again). Elements replicated across threads are
stored once per copy, with one value: the duplicates agree.
"""

from __future__ import annotations

import numpy as np
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, memref, scf, vector
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.diagnostics import SmaltiNotImplementedError
from smalti.layouts import SmemTransforms
from smalti.refs import unwrap_transformed_ref
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext

SCATTER = "vector.scatter"
GATHER = "vector.gather"
type GatherOrScatter = vector.GatherOp | vector.ScatterOp


# --- inference --------------------------------------------------------------------------


def _check_base(op: GatherOrScatter) -> None:
    ref_type = ir.MemRefType(op.base.type)
    if ref_type.rank != 1:
        raise SmaltiNotImplementedError(
            "SM105", f"{op.operation.name} of a {ref_type.rank}-D ref: smalti lowers it on "
            "1-D SMEM refs only", op=op, values={"ref": str(ref_type)},
            fix="collapse the ref to 1-D and linearize the indices")


def _element_sites(op: GatherOrScatter, b: ConstraintBuilder) -> list:
    """The register sites of the op: indices, mask, value / pass_thru (and result)."""
    first = 1 + len(op.offsets)
    sites = [b.operand(first + k) for k in range(3)]
    if op.operation.results:
        sites.append(b.result(0))
    return sites


def gather_scatter(op: GatherOrScatter, b: ConstraintBuilder) -> None:
    """One register layout for every element site; a plain (untransformed) ref."""
    _check_base(op)
    b.variable(*_element_sites(op, b))
    b.assign(b.variable(b.operand(0)), SmemTransforms(None, None))


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule(SCATTER, GATHER)(gather_scatter)


# --- lowering ---------------------------------------------------------------------------


def _plain_ref(ctx: LoweringContext, op: GatherOrScatter) -> ir.Value:
    [transforms] = ctx.in_transforms(op)
    if len(ir.ArrayAttr(transforms)):
        raise ctx.unsupported(op, f"{op.operation.name} of a transformed ref ({transforms})",
                              fix="gather from / scatter to an untiled, unswizzled SMEM ref")
    return unwrap_transformed_ref(op.base, transforms)


def _arrays(ctx: LoweringContext, op: GatherOrScatter) -> list[fa.FragmentedArray]:
    """indices, mask and value / pass_thru in the layout inference chose."""
    [layout, *_] = ctx.in_layouts(op)
    first = 1 + len(op.offsets)
    values = list(op.operation.operands)[first:first + 3]
    return [ctx.from_ir(v, layout) for v in values]


def _elements(register: ir.Value) -> list[ir.Value]:
    """The scalars of one register (a scalar register is its own element)."""
    if not isinstance(register.type, ir.VectorType):
        return [register]
    vt = ir.VectorType(register.type)
    positions = np.ndindex(*vt.shape)
    return [vector.extract(register, dynamic_position=[], static_position=list(p))
            for p in positions]


def _pack(like: ir.Value, elements: list[ir.Value]) -> ir.Value:
    if not isinstance(like.type, ir.VectorType):
        [element] = elements
        return element
    return vector.from_elements(like.type, elements)


def _is_true(value: ir.Value) -> bool:
    """Whether ``value`` is a constant ``true`` (nothing to guard): an
    ``arith.constant``, possibly broadcast and extracted from."""
    while True:
        owner = value.owner
        if not isinstance(owner, (ir.Operation, ir.OpView)):
            return False
        operation = owner.operation if isinstance(owner, ir.OpView) else owner
        if operation.name in ("vector.extract", "vector.broadcast", "vector.splat") \
                and operation.operands:
            value = operation.operands[0]
            continue
        if operation.name != "arith.constant":
            return False
        attr = operation.attributes["value"]
        if isinstance(attr, ir.DenseElementsAttr):
            attr = ir.DenseElementsAttr(attr)
            if not attr.is_splat:
                return False
            attr = attr.get_splat_value()
        if isinstance(attr, ir.BoolAttr):
            return bool(ir.BoolAttr(attr).value)
        return isinstance(attr, ir.IntegerAttr) and ir.IntegerAttr(attr).value != 0


def _is_zero(value: ir.Value) -> bool:
    """Whether ``value`` is the constant 0 (an offset nothing needs adding)."""
    owner = value.owner
    if not isinstance(owner, (ir.Operation, ir.OpView)):
        return False
    operation = owner.operation if isinstance(owner, ir.OpView) else owner
    if operation.name != "arith.constant":
        return False
    attr = operation.attributes["value"]
    return isinstance(attr, ir.IntegerAttr) and ir.IntegerAttr(attr).value == 0


def _address(offset: ir.Value, index: ir.Value) -> ir.Value:
    if not isinstance(index.type, ir.IndexType):
        index = arith.index_cast(ir.IndexType.get(), index)
    return index if _is_zero(offset) else arith.addi(offset, index)


def _guards(mask_register: ir.Value, count: int) -> list[ir.Value | None]:
    """Each element's mask, ``None`` where it is a constant true."""
    if _is_true(mask_register):
        return [None] * count
    return [None if _is_true(m) else m for m in _elements(mask_register)]


def lower_scatter(ctx: LoweringContext, op: vector.ScatterOp) -> list[ir.Value]:
    ref = _plain_ref(ctx, op)
    [offset] = op.offsets
    indices, mask, value = _arrays(ctx, op)
    mgpu_utils.warpgroup_barrier()  # earlier reads of the ref are done
    for idx_reg, mask_reg, val_reg in zip(indices.registers.flat, mask.registers.flat,
                                          value.registers.flat, strict=True):
        idx, val = _elements(idx_reg), _elements(val_reg)
        for i, m, v in zip(idx, _guards(mask_reg, len(idx)), val, strict=True):
            address = _address(offset, i)
            if m is None:
                memref.store(v, ref, [address])
                continue
            branch = scf.IfOp(m)
            with ir.InsertionPoint(branch.then_block):
                memref.store(v, ref, [address])
                scf.yield_([])
    mgpu_utils.warpgroup_barrier()  # every write is visible to every thread
    return []


def lower_gather(ctx: LoweringContext, op: vector.GatherOp) -> list[ir.Value]:
    ref = _plain_ref(ctx, op)
    [offset] = op.offsets
    indices, mask, pass_thru = _arrays(ctx, op)
    registers = np.empty(pass_thru.registers.shape, dtype=object)
    for k, (idx_reg, mask_reg, pass_reg) in enumerate(zip(
            indices.registers.flat, mask.registers.flat, pass_thru.registers.flat, strict=True)):
        idx = _elements(idx_reg)
        guards = _guards(mask_reg, len(idx))
        passed = _elements(pass_reg) if any(g is not None for g in guards) else guards
        loaded = []
        for i, m, p in zip(idx, guards, passed, strict=True):
            address = _address(offset, i)
            if m is None:
                loaded.append(memref.load(ref, [address]))
                continue
            assert p is not None  # guarded elements have their pass-through value
            branch = scf.IfOp(m, [p.type], has_else=True)
            with ir.InsertionPoint(branch.then_block):
                scf.yield_([memref.load(ref, [address])])
            with ir.InsertionPoint(branch.else_block):
                scf.yield_([p])
            loaded.append(branch.result)
        registers.flat[k] = _pack(pass_reg, loaded)
    mgpu_utils.warpgroup_barrier()  # every read is done before the ref is reused
    result = fa.FragmentedArray(_registers=registers, _layout=pass_thru.layout,
                                _is_signed=pass_thru.is_signed)
    return [ctx.to_ir(result, op.result.type)]


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule(SCATTER)(lower_scatter)
    registry.lowering_rule(GATHER)(lower_gather)
