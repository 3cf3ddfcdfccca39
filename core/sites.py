"""Value sites: the places of an op where a value with a layout appears.

A value has one layout where it is produced (an op result or a block
argument) and possibly a different one where each consumer uses it (an
operand), because core may insert a relayout in between. So layouts belong to
*sites*, not to values.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, cast

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.caching import per_context
from smalti.diagnostics import format_location
from smalti.layouts import MemorySpace

if TYPE_CHECKING:
    from smalti.constraints import Variable

#: What inference knows of a value's definition: its producer's variable and type.
Definition = tuple["Variable", ir.Type]

REG = MemorySpace.REG


class SiteKind(enum.IntEnum):
    OPERAND = 0
    RESULT = 1
    ARGUMENT = 2


class ValueSite:
    """Operand ``index``, result ``index``, or argument ``index`` of the entry
    block of region ``region`` of ``op``, with its value, the value's type
    and the memory space whose layout it needs (``None``: it needs none).

    Immutable and hashable; hand-written rather than a dataclass because
    inference creates one per operand and result of a kernel. Hashing an
    ``ir.Operation`` goes through the bindings and is slow: a site is hashed
    only when first asked (inference mostly is not), from ``op_hash`` if its
    maker knew the op's hash.
    """

    __slots__ = ("op", "kind", "index", "region", "value", "type", "memory_space", "_op_hash",
                 "_hash", "_position", "_definition")

    def __init__(self, op: ir.Operation | ir.OpView, kind: SiteKind, index: int,
                 region: int | None = None, *, value: ir.Value | None = None,
                 op_hash: int | None = None) -> None:
        self.op: ir.Operation = op.operation
        self.kind = kind
        self.index = index
        self.region = region
        if value is None:
            if kind is SiteKind.OPERAND:
                value = self.op.operands[index]
            elif kind is SiteKind.RESULT:
                value = self.op.results[index]
            else:
                value = self.op.regions[region].blocks[0].arguments[index]
        self.value: ir.Value = value
        self.type: ir.Type = value.type
        self.memory_space: MemorySpace | None = memory_space_of_type(self.type)
        self._op_hash = op_hash
        self._hash: int | None = None
        #: Its index among the op's layout sites when inference made it with
        #: them (see layout_sites), else -1.
        self._position = -1
        #: For an operand, what inference knew of its value's definition when
        #: it made the site (see SiteTable.layout_sites), else None.
        self._definition: Definition | None = None

    def __hash__(self) -> int:
        if self._hash is None:
            op_hash = hash(self.op) if self._op_hash is None else self._op_hash
            self._hash = _site_hash(op_hash, self.kind, self.index, self.region)
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ValueSite) and self.index == other.index
                and self.kind == other.kind and self.region == other.region
                and hash(self) == hash(other) and self.op == other.op)

    def describe(self) -> str:
        kind = {SiteKind.OPERAND: "operand", SiteKind.RESULT: "result", SiteKind.ARGUMENT: "arg"}
        where = format_location(self.op.location)
        loc = f" at {where}" if where else ""
        region = f" of region {self.region}" if self.kind is SiteKind.ARGUMENT else ""
        # A terminator's operand is a value its parent op passes on: name the parent.
        parent = _terminated_op(self.op) if self.kind is SiteKind.OPERAND else None
        passed = f" (ending a region of {parent.name})" if parent is not None else ""
        return f"{self.op.name} {kind[self.kind]} #{self.index}{region}{loc}{passed}"

    def __repr__(self) -> str:
        return self.describe()


def _site_hash(op_hash: int, kind: SiteKind, index: int, region: int | None) -> int:
    # Arithmetic rather than hashing a tuple: inference hashes every site.
    spread = (index * 4 + kind) * 0x9E3779B1
    return op_hash + spread if region is None else op_hash + spread + (region + 1) * 0x85EBCA77


def _terminated_op(op: ir.Operation) -> ir.Operation | None:
    """The op whose region ``op`` terminates (the last op of a block, with no
    results, nested in another op), else ``None``."""
    if len(op.results) or op.parent is None:
        return None
    operations = op.block.operations
    if operations[len(operations) - 1] != op:
        return None
    return op.parent


def memory_space_of(value: ir.Value) -> MemorySpace | None:
    """The memory space whose layout a value needs, or ``None`` if it needs none."""
    return memory_space_of_type(value.type)


def memory_space_of_type(ty: ir.Type) -> MemorySpace | None:
    """The memory space whose layout a value of type ``ty`` needs, if any."""
    # By class first: only refs need the (cached) look at their memory space.
    if isinstance(ty, ir.VectorType):
        return MemorySpace.REG
    if isinstance(ty, ir.MemRefType):
        return _memory_space_of_ref_type(ty)
    return None


@per_context
def _memory_space_of_ref_type(ty: ir.MemRefType) -> MemorySpace | None:
    if mgpu_utils.is_tmem_ref(ty):
        return MemorySpace.TMEM
    if isinstance(ty.element_type, mgpu.BarrierType):
        return None  # barriers are never transformed
    if mgpu_utils.is_smem_ref(ty) or mgpu_utils.is_cluster_smem_ref(ty):
        return MemorySpace.SMEM
    return None


def make_site(op: ir.Operation, op_hash: int | None, kind: SiteKind, index: int,
              value: ir.Value, ty: ir.Type, space: MemorySpace = MemorySpace.REG,
              position: int = -1, definition: Definition | None = None) -> ValueSite:
    """The site of ``value`` (of type ``ty``, needing a layout in ``space``)
    at ``op``: what the constructor makes, without reading anything through
    the bindings again. ``op_hash`` is ``hash(op)`` if known, ``position``
    the site's index among the op's layout sites, ``definition`` what
    inference knows of an operand's definition."""
    # Inference makes one per operand and result of a kernel: no __init__ call.
    site = object.__new__(ValueSite)
    site.op = op
    site.kind = kind
    site.index = index
    site.region = None
    site.value = value
    site.type = ty
    site.memory_space = space
    site._op_hash = op_hash
    site._hash = None
    site._position = position
    site._definition = definition
    return site


#: What :func:`layout_values` finds: each value needing a layout, with its
#: index among the op's operands (or results), its type and memory space.
LayoutValues = list[tuple[int, ir.Value, ir.ShapedType, MemorySpace]]


def layout_values(values: ir.OpOperandList | ir.OpResultList) -> LayoutValues:
    """The values among an op's operands (or results) that need a layout,
    with their index, type and memory space."""
    found: LayoutValues = []
    # By index: these sequences have no __iter__, and iterating them ends
    # by raising (and catching) an IndexError.
    for index in range(len(values)):
        value = values[index]
        ty = value.type
        # Vectors and scalars (most values) known without a call.
        space = (REG if isinstance(ty, ir.VectorType) else
                 memory_space_of_type(ty) if isinstance(ty, ir.MemRefType) else None)
        if space is not None:
            found.append((index, value, cast(ir.ShapedType, ty), space))  # a vector or ref
    return found


def layout_sites(op: ir.Operation, op_hash: int | None = None) -> list[ValueSite]:
    """Every operand and result of ``op`` that needs a layout, operands first
    (``op_hash``: ``hash(op)``, if known)."""
    operands, results = layout_values(op.operands), layout_values(op.results)
    if not (operands or results):  # most ops of a kernel
        return []
    sites = [make_site(op, op_hash, SiteKind.OPERAND, index, value, ty, space, position)
             for position, (index, value, ty, space) in enumerate(operands)]
    first = len(sites)
    sites += [make_site(op, op_hash, SiteKind.RESULT, index, value, ty, space, position)
              for position, (index, value, ty, space) in enumerate(results, first)]
    return sites


def producer_site(value: ir.Value) -> ValueSite:
    """The result or block-argument site where ``value`` is defined."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        block = owner
        parent = block.owner
        for region_index, region in enumerate(parent.regions):
            if region.blocks and region.blocks[0] == block:
                index = ir.BlockArgument(value).arg_number
                return ValueSite(parent, SiteKind.ARGUMENT, index, region_index, value=value)
        raise ValueError(f"{value} is an argument of a non-entry block")
    return ValueSite(owner, SiteKind.RESULT, ir.OpResult(value).result_number, value=value)
