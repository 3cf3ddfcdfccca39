"""Value sites: the places of an op where a value with a layout appears,
and the table in which inference reads them.

A value has one layout where it is produced (an op result or a block
argument) and possibly a different one where each consumer uses it (an
operand), because core may insert a relayout in between. So layouts belong to
*sites*, not to values.

Inference reads each op's layout sites once, in one loop
(:meth:`SiteTable.read`), as *rows*: plain tuples indexed by the site's
position among the op's layout sites, each with what a rule or the solver
needs of it (its kind, index, value, type, memory space, and for an operand
the variable and type of its value's definition, if described already).
:class:`ValueSite` objects, which rules hand around, are made from rows
only when a rule asks for them (:func:`sites_of`); an op whose rule is
``same_layout`` gets its variable straight from its rows
(:meth:`SiteTable.share`), and every other op's rule sees its rows through
a :class:`smalti.rules.ConstraintBuilder`. Either way the rows are linked to
their definitions by :meth:`SiteTable.link`.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.caching import per_context
from smalti.constraints import row_variable
from smalti.diagnostics import SmaltiValueError, format_location
from smalti.layouts import MemorySpace

if TYPE_CHECKING:
    from smalti.constraints import Variable
    from smalti.solver import ConstraintSystem

#: What inference knows of a value's definition: its producer's variable and type.
Definition = tuple["Variable", ir.Type]

REG = MemorySpace.REG


class SiteKind(enum.IntEnum):
    OPERAND = 0
    RESULT = 1
    ARGUMENT = 2


OPERAND, RESULT = SiteKind.OPERAND, SiteKind.RESULT


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

    __slots__ = ("op", "kind", "index", "region", "value", "type", "memory_space", "position",
                 "_op_hash", "_hash")

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
        #: Its row: its index among the op's layout sites when inference
        #: made it from them (see SiteTable.read), else -1.
        self.position = -1
        self._op_hash = op_hash
        self._hash: int | None = None

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


#: One layout site of an op as inference reads it (see :meth:`SiteTable.read`):
#: the op, the site's kind and index among the op's operands (or results),
#: its value, the value's type and memory space, and for an operand whose
#: value was described already, the definition's variable and type.
Row = tuple[ir.Operation, SiteKind, int, ir.Value, ir.Type, MemorySpace, Definition | None]


def sites_of(rows: list[Row], op_hash: int | None, first: int = 0) -> list[ValueSite]:
    """The sites of ``rows``: what the constructor makes, without reading
    anything through the bindings again (``op_hash``: ``hash`` of their op,
    if known; ``first``: the first row's index among its op's layout sites,
    -1: not known)."""
    sites = []
    position = first
    for row in rows:  # one call for an op's rows, and no __init__ call
        site = object.__new__(ValueSite)
        site.op, site.kind, site.index, site.value, site.type, site.memory_space, _ = row
        site.region = None
        site.position = position
        site._op_hash = op_hash
        site._hash = None
        sites.append(site)
        if position >= 0:
            position += 1
    return sites


def site_of(row: Row, op_hash: int | None = None) -> ValueSite:
    """The site of ``row``, alone (see :func:`sites_of`)."""
    return sites_of([row], op_hash, -1)[0]


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
            found.append((index, value, ty, space))  # a vector or ref: shaped
    return found


class SiteTable:
    """A kernel's layout sites as inference reads them, and their links.

    It keeps the variable and type of each defined value (op result or
    block argument), the operand rows that could not be linked to their
    definition yet, and the variable of each site a rule described other
    than its own op's rows (its regions' block arguments and terminators'
    operands), with the ops those belong to. The variables of an op's own
    rows stay with the op (see :attr:`smalti.rules.ConstraintBuilder.site_variables`).
    """

    __slots__ = ("variables", "pending", "definitions", "described_elsewhere")

    def __init__(self) -> None:
        #: Sites described by a rule other than their op's, and block arguments.
        self.variables: dict[ValueSite, Variable] = {}
        #: Operand rows whose value had no variable yet when they got theirs
        #: (uses of values defined later in the walk, such as the operands
        #: of a loop's terminator); the others are linked at once.
        self.pending: list[tuple[Row, Variable]] = []
        #: The variable of each defined value, with the value's type (read
        #: once: its uses need it, and reading it through the bindings is slow).
        self.definitions: dict[ir.Value, Definition] = {}
        #: Ops some of whose sites another op's rule described (a region's
        #: terminator, described by its parent), by their name and hash.
        self.described_elsewhere: dict[str, dict[int, ir.Operation]] = {}

    def read(self, op: ir.Operation) -> tuple[list[Row], int]:
        """Every operand and result of ``op`` that needs a layout, operands
        first, as rows; an operand whose value was described already takes
        its type and memory space from its definition (no bindings call).
        With the rows, how many of them are operands if all hold vectors
        (most ops), else -1: how the op's attributes are written."""
        definitions = self.definitions
        rows: list[Row] = []
        vectors = True
        operands = op.operands
        for index in range(len(operands)):  # by index: see layout_values
            value = operands[index]
            defined = definitions.get(value)
            if defined is None:  # defined later in the walk, or needing no layout
                ty = value.type
                space = (REG if isinstance(ty, ir.VectorType) else  # as in layout_values
                         memory_space_of_type(ty) if isinstance(ty, ir.MemRefType) else None)
                if space is None:
                    continue
            else:
                ty, space = defined[1], defined[0].memory_space
            if space is not REG:
                vectors = False
            rows.append((op, OPERAND, index, value, ty, space, defined))
        split = len(rows)
        results = op.results
        for index in range(len(results)):
            value = results[index]
            ty = value.type
            space = (REG if isinstance(ty, ir.VectorType) else
                     memory_space_of_type(ty) if isinstance(ty, ir.MemRefType) else None)
            if space is not None:
                if space is not REG:
                    vectors = False
                rows.append((op, RESULT, index, value, ty, space, None))
        return rows, split if vectors else -1

    def share(self, rows: list[Row], split: int, system: ConstraintSystem) -> Variable | None:
        """Gives all of an op's ``rows`` (``split``: as :meth:`read` says)
        one new variable, as the rule :func:`smalti.rules.same_layout` does,
        if they all hold vectors of one shape. Otherwise returns ``None``
        having changed nothing: the rule then runs through a builder, which
        reports what does not fit."""
        if split < 0:
            return None
        first: ir.Type | None = None
        shape = None
        for _, _, _, _, ty, _, defined in rows:
            if defined is not None:
                this = defined[0].shape  # a tuple: no bindings call
            elif first is not None and ty == first:  # most sites are of one type
                continue
            else:
                this = tuple(ty.shape)  # type: ignore[attr-defined]  # a vector
            if shape is None:
                first, shape = ty, this
            elif this != shape:
                return None
        variables = system.variables
        # Named after the op's last layout site, as ConstraintBuilder.variable()
        # does (made from its row only if asked for).
        var = row_variable(len(variables), rows[-1], REG, shape)  # type: ignore[arg-type]
        variables.append(var)
        self.link(rows, [var] * len(rows), system)
        return var

    def link(self, rows: list[Row], variables: list[Variable], system: ConstraintSystem
             ) -> None:
        """Records that the site of each of ``rows`` has its variable in
        ``variables``: a result or block argument defines its value; an
        operand is linked to its value's definition now if that was
        described already (nearly always: the walk is in program order),
        else by :meth:`connect`."""
        uses, definitions = system.uses, self.definitions
        for row, var in zip(rows, variables):
            defined = row[6]
            if defined is not None:  # system.use(), without the call: most rows
                uses.append((defined[0], var, defined[1]))
            elif row[1] is OPERAND:
                self.pending.append((row, var))
            else:
                definitions[row[3]] = (var, row[4])

    def row(self, site: ValueSite) -> Row:
        """The row of a site another op's rule described (a terminator's
        operand, a block argument), linked to its definition if there is one."""
        value = site.value
        defined = self.definitions.get(value) if site.kind is OPERAND else None
        return (site.op, site.kind, site.index, value, site.type,
                site.memory_space, defined)  # type: ignore[return-value]  # a layout site

    def described(self, rows: list[Row], op_hash: int) -> list[Variable | None]:
        """The variables another op's rule gave to each of ``rows`` (those of
        a terminator, described by its parent), ``None`` for the others."""
        found = self.variables
        return [found.get(site) for site in sites_of(rows, op_hash, -1)]

    def connect(self, system: ConstraintSystem) -> None:
        """Links the operands whose value was defined later in the walk to
        its definition's variable (the others were linked at once)."""
        definitions = self.definitions
        for row, var in self.pending:
            defined = definitions.get(row[3])
            if defined is None:
                site, source = site_of(row), producer_site(row[3])
                raise SmaltiValueError(
                    "SM103",
                    f"{site.describe()} is produced by {source.describe()}, which has no layout",
                    op=site.op,
                    fix="produce the value with an op that has a constraint rule, or "
                    "install a plugin that gives its producer one",
                )
            system.use(defined[0], var, defined[1])


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
