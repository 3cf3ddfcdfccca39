"""What rules receive: the constraint builder and the lowering context.

Constraint rules are called as ``rule(op, builder)`` and describe the op with
a :class:`ConstraintBuilder`. Lowering rules are called as ``rule(ctx, op)``
with a :class:`LoweringContext`, and return the op's replacement values or
:data:`RECURSED`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, cast

import numpy as np
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, builtin
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import launch_context as lc
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.constraints import Constraint, Variable, make_variable
from smalti.diagnostics import PluginError, SmaltiNotImplementedError, SmaltiValueError
from smalti.layouts import Constant, MemorySpace, RegisterLayout, SmemTransforms, TmemLayout
from smalti.registry import SAME_LAYOUT, RuleRecord
from smalti.sites import Row, SiteKind, SiteTable, ValueSite, sites_of
from smalti.solver import ConstraintSystem, Origin

OPERAND, RESULT = SiteKind.OPERAND, SiteKind.RESULT
REG = MemorySpace.REG


class ConstraintBuilder:
    """Describes one op in the constraint language.

    Every vector operand/result, SMEM ref and TMEM ref of the op (its *layout
    sites*) must end up in exactly one :meth:`variable`. The builder is a
    view of the op's rows in the kernel's :class:`smalti.sites.SiteTable`:
    it hands out their :class:`ValueSite` objects and keeps the variable
    each row gets (core links them once the rule is done).
    """

    __slots__ = ("_system", "_table", "_record", "_rows", "_sites", "_variables", "_operation",
                 "_op_hash", "_origin", "op", "arch", "opaque")

    def __init__(self, system: ConstraintSystem, table: SiteTable, op: ir.OpView,
                 arch: tuple[int, int], record: RuleRecord, rows: list[Row],
                 op_hash: int | None = None,
                 site_variables: list[Variable | None] | None = None) -> None:
        """``rows`` are the op's rows (``table.read(op)``), ``op_hash`` is
        ``hash(op)`` if known, and ``site_variables`` the variables another
        op's rule gave some of them."""
        self._system = system
        self._table = table
        self._record = record
        self._rows = rows
        # Made with the builder: a rule describes (so asks for) them all.
        self._sites = sites_of(rows, op_hash)
        self._variables: list[Variable | None] = (
            [None] * len(rows) if site_variables is None else site_variables)
        self._operation = op.operation
        self._op_hash = op_hash
        self._origin: Origin | None = None
        self.op = op
        self.arch = arch
        self.opaque = False

    @property
    def origin(self) -> Origin:
        """Where the statements of this rule come from (named in errors)."""
        # Made on first use: most rules only make variables and never need it.
        if self._origin is None:
            record = self._record
            self._origin = Origin(self._operation, record.plugin, record.function.__qualname__)
        return self._origin

    # --- sites -------------------------------------------------------------------

    def operand(self, index: int) -> ValueSite:
        # Operand i is usually at position i (when every operand before it
        # holds a vector or ref): looked for there first.
        sites = self._sites
        if index < len(sites):
            site = sites[index]
            if site.index == index and site.kind is OPERAND:
                return site
        return self._site(OPERAND, index)

    def result(self, index: int) -> ValueSite:
        # Results come last: an op's only result is its last site.
        sites = self._sites
        if sites:
            site = sites[-1]
            if site.index == index and site.kind is RESULT:
                return site
        return self._site(RESULT, index)

    def argument(self, region: int, index: int) -> ValueSite:
        """Argument ``index`` of the entry block of region ``region``."""
        return ValueSite(self.op, SiteKind.ARGUMENT, index, region, op_hash=self._op_hash)

    def _site(self, kind: SiteKind, index: int) -> ValueSite:
        # The site of the op's row, if any (see operand()), else a new one.
        for site in self._sites:
            if site.kind is kind and site.index == index:
                return site
        return ValueSite(self.op, kind, index, op_hash=self._op_hash)

    def layout_sites(self) -> list[ValueSite]:
        """Every operand and result needing a layout, operands first."""
        return list(self._sites)

    def vector_sites(self) -> list[ValueSite]:
        """The layout sites holding vectors (in registers), operands first."""
        return [s for s in self._sites if s.memory_space is MemorySpace.REG]

    @property
    def site_variables(self) -> list[Variable | None]:
        """The variable of each of the op's layout sites so far (``None``:
        none yet), in the order of :meth:`layout_sites`."""
        return self._variables

    # --- statements --------------------------------------------------------------

    def variable(self, *sites: ValueSite) -> Variable:
        """A new variable: all ``sites`` share its layout."""
        if not sites:
            self._malformed("variable() needs at least one site")
        space = sites[0].memory_space
        if space is None or (len(sites) > 1 and not _alike(sites)):
            self._malformed(
                "variable() joins sites of different shapes or memory spaces, or sites "
                f"that need no layout: {[s.describe() for s in sites]}")
        rows, own = self._rows, self._operation
        # The sites share a shape: a described operand's producer knows it
        # (an SMEM ref's is left unread, see Variable.shape).
        shape = None
        if space is not MemorySpace.SMEM:
            for site in sites:
                if site.position >= 0 and site.op is own:
                    defined = rows[site.position][6]
                    if defined is not None:
                        shape = defined[0].shape
                        break
        variables = self._system.variables
        var = make_variable(len(variables), sites[-1], space, shape)
        variables.append(var)
        claimed = self._variables
        for site in sites:
            position = site.position
            if position >= 0 and site.op is own and claimed[position] is None:
                claimed[position] = var  # one of the op's own rows: see _claim
            else:
                self._claim(site, var)
        return var

    def _claim(self, site: ValueSite, var: Variable) -> None:
        """Records that ``site`` has ``var`` (a site gets one variable). The
        op's own rows are linked to their definitions once its rule is
        done (see SiteTable.link), another op's site (a terminator's
        operand, a block argument) at once."""
        own = self._operation
        position = site.position
        if position < 0 or site.op is not own:
            position = self._position_of(site)
        if position >= 0:
            # One of the op's operands and results: it stays with the op.
            variables = self._variables
            claimed = variables[position]
            if claimed is None:
                variables[position] = var
                return
        else:
            table = self._table
            other = site.op
            if other is not own and other != own:  # a terminator of its regions
                if not _within(other, own):
                    # Described already, or never to get its attributes.
                    self._malformed(
                        f"{site.describe()} is not a site of {own.name} or of an op in its "
                        "regions: a rule describes its op's operands and results, its "
                        "regions' block arguments and the ops inside them")
                table.described_elsewhere.setdefault(other.name, {})[hash(other)] = other
            claimed = table.variables.get(site)
            if claimed is None:
                table.variables[site] = var
                table.link([table.row(site)], [var], self._system)
                return
        if claimed is var:
            self._malformed(f"variable() got a site twice: {site.describe()}")
        self._malformed(f"{site.describe()} was given two variables")

    def _position_of(self, site: ValueSite) -> int:
        """The index of ``site`` among the op's layout sites, -1 if it is not
        one (a block argument, another op's site)."""
        if site.kind is not SiteKind.ARGUMENT and (
                site.op is self._operation or site.op == self._operation):
            kind, index = site.kind, site.index
            for position, row in enumerate(self._rows):
                if row[1] is kind and row[2] == index:
                    return position
        return -1

    def assign(self, variable: Variable, value: Constant) -> None:
        """``variable`` has layout ``value``."""
        self._check_statement("assign", variable, value)
        self._system.assignments.append((variable, value, self.origin))

    def require(self, *constraints: Constraint) -> None:
        origin, system = self._origin or self.origin, self._system
        for constraint in constraints:
            if not isinstance(constraint, Constraint):
                self._malformed(f"require() got {constraint!r}, not a smalti Constraint")
            # system.require(), without a call per statement
            system.constraints.append(constraint)
            system.origins.append(origin)

    def fallback(self, variable: Variable, value: Constant) -> None:
        """Try ``value`` for ``variable`` if nothing else determines it."""
        self._check_statement("fallback", variable, value)
        self._system.fallbacks.setdefault(variable, []).append(value)

    def _check_statement(self, what: str, variable: object, value: object) -> None:
        # Caught here, a wrong argument names the plugin; in the solver it
        # would read as an unsatisfiable kernel or crash.
        if not isinstance(variable, Variable):
            self._malformed(f"{what}() got {variable!r}, not a Variable from variable()")
        if not isinstance(value, (RegisterLayout, SmemTransforms, TmemLayout)):
            self._malformed(f"{what}() got {value!r}, not a smalti layout constant "
                            "(RegisterLayout, SmemTransforms or TmemLayout)")

    @property
    def shared(self) -> dict[Any, Any]:
        """Storage shared by every rule during one inference run, e.g. to make
        ops that alias each other (SMEM slices with one ``alias_id``) share a
        variable. Prefix keys with your plugin's name."""
        return self._system.shared

    def opaque_regions(self) -> None:
        """The op's regions are already at Lane level: inference skips them."""
        self.opaque = True

    def _malformed(self, message: str) -> NoReturn:
        raise PluginError(
            "SM006",
            f"constraint rule {self.origin.rule} of plugin {self.origin.plugin!r}: {message}",
            op=self.op,
            fix=f"fix the plugin {self.origin.plugin!r}",
        )


def same_layout(op: ir.OpView, b: ConstraintBuilder) -> None:
    """A ready-made constraint rule: every layout site of the op (its vector
    operands and results, for an elementwise op) shares one layout.

    Register it for ops it describes, e.g.
    ``registry.constraint_rule("my_ops.relu")(smalti.rules.same_layout)``:
    its records say ``same_layout``, and inference gives an op's sites
    their variable without calling it (:meth:`smalti.sites.SiteTable.share`),
    unless they do not fit (then the call reports it).
    """
    b.variable(*b.layout_sites())


setattr(same_layout, SAME_LAYOUT, True)  # a declaration for RuleRecord.same_layout


def malformed_op(op: ir.OpView | ir.Operation, message: str, *, fix: str | Sequence[str],
                 lowering: bool = False, **values: Any) -> SmaltiValueError:
    """The error for an op whose operands, types or attributes do not fit
    together as its rule relies on (SM108; SM205 from a lowering rule).

    Raise it before indexing: an op the user built wrongly is the user's
    error, not a crash of the plugin (SM005)."""
    return SmaltiValueError("SM205" if lowering else "SM108", message, op=op, values=values,
                            fix=fix)


def verifier_failure(op: ir.OpView | ir.Operation) -> str | None:
    """What the MLIR verifier says of ``op`` (and what it holds), or ``None``
    if it passes. Inference and lowering do not verify up front (it costs a
    walk): a rule that crashes on an op the verifier rejects is told apart
    from a plugin's bug afterwards."""
    try:
        op.operation.verify()
    except ir.MLIRError as e:
        return "; ".join(d.message for d in e.error_diagnostics) or str(e)
    return None


def invalid_op(op: ir.OpView | ir.Operation, problem: str, *, lowering: bool = False
               ) -> SmaltiValueError:
    """:func:`malformed_op` for an op the MLIR verifier rejects (``problem``:
    what it says)."""
    name = op.operation.name
    return malformed_op(op, f"{name} fails the MLIR verifier: {problem}",
                        fix=[f"fix the {name} so that the verifier accepts it",
                             "verify modules you build (module.operation.verify()): "
                             "inference and lowering assume valid ops"],
                        lowering=lowering)


def _within(op: ir.Operation, ancestor: ir.Operation) -> bool:
    """Whether ``op`` is nested in a region of ``ancestor``."""
    parent = op.parent
    while parent is not None:
        if parent == ancestor:
            return True
        parent = parent.parent
    return False


def _alike(sites: Sequence[ValueSite]) -> bool:
    """Whether the sites hold values of one shape in one memory space."""
    first = sites[0]
    space, ty = first.memory_space, first.type
    for site in sites[1:]:
        if site.memory_space is not space or (
                site.type != ty
                and cast(ir.ShapedType, site.type).shape != cast(ir.ShapedType, ty).shape):
            return False
    return True


class _Recursed:
    def __repr__(self) -> str:
        return "RECURSED"


#: Returned by a lowering rule that rewrote its op (and its regions) itself.
RECURSED = _Recursed()


def default_is_signed(element_type: ir.Type) -> bool | None:
    """Integers are unsigned unless an op says otherwise; floats have no sign."""
    return False if isinstance(element_type, ir.IntegerType) else None


def to_ir(array: fa.FragmentedArray, ty: ir.Type) -> ir.Value:
    """Packs a ``FragmentedArray`` into one IR value of vector type ``ty``.

    The registers travel as the operands of an unrealized conversion cast that
    records their layout; :func:`from_ir` unpacks it in the consumer.
    """
    cast = builtin.UnrealizedConversionCastOp([ty], array.registers.flatten().tolist())
    cast.attributes["layout"] = mgpu_layouts.to_layout_attr(array.layout)
    return cast.result


def from_ir(value: ir.Value, layout: ir.Attribute | fa.FragmentedLayout,
            is_signed: bool | None = None) -> fa.FragmentedArray:
    """Unpacks a value made by :func:`to_ir`, relaid out to ``layout``."""
    cast = value.owner
    if not isinstance(cast, builtin.UnrealizedConversionCastOp) or "layout" not in cast.attributes:
        raise SmaltiValueError(
            "SM201",
            f"a vector value reached lowering without its registers: its producer "
            f"{describe_owner(value)} was not lowered",
            fix="lower the whole module with smalti.lower (or jax's pipeline), not parts of it",
        )
    produced = mgpu_layouts.from_layout_attr(cast.attributes["layout"])
    vector = ir.VectorType(value.type)
    shape = produced.registers_shape(tuple(vector.shape))
    registers = list(cast.operands)
    if len(registers) != math.prod(shape):
        raise SmaltiValueError("SM201", f"expected {math.prod(shape)} registers for {vector} in "
                               f"{produced}, found {len(registers)}")
    if isinstance(vector.element_type, ir.IntegerType) and is_signed is None:
        is_signed = False
    array = fa.FragmentedArray(
        _registers=np.array(registers).reshape(shape), _layout=produced, _is_signed=is_signed
    )
    if isinstance(layout, ir.Attribute):
        layout = mgpu_layouts.from_layout_attr(layout)
    return array.to_layout(layout)


def describe_owner(value: ir.Value) -> str:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return "a block argument"
    return owner.operation.name


class LoweringContext:
    """What lowering rules get: the kernel's launch context and predicates,
    and access to the layouts inference chose."""

    def __init__(
        self,
        launch_context: lc.LaunchContext,
        *,
        single_thread_per_warp_predicate: ir.Value,
        single_thread_per_warpgroup_predicate: ir.Value,
        single_thread_per_block_predicate: ir.Value,
        single_warp_per_block_predicate: ir.Value,
        auto_barriers: bool,
        smem_requested_bytes: int,
        arch: tuple[int, int],
        lower_op: Callable[[ir.OpView], None],
    ) -> None:
        self.launch_context = launch_context
        self.single_thread_per_warp_predicate = single_thread_per_warp_predicate
        self.single_thread_per_warpgroup_predicate = single_thread_per_warpgroup_predicate
        self.single_thread_per_block_predicate = single_thread_per_block_predicate
        self.single_warp_per_block_predicate = single_warp_per_block_predicate
        self.auto_barriers = auto_barriers
        self.smem_requested_bytes = smem_requested_bytes
        self.arch = arch
        self.thread_semantics = mgpu_utils.ThreadSubset.WARPGROUP
        self.is_collective_kernel: bool | None = None
        self.lower_op = lower_op

    @property
    def single_lane_predicate(self) -> ir.Value:
        if self.thread_semantics == mgpu_utils.ThreadSubset.WARP:
            return self.single_thread_per_warp_predicate
        return self.single_thread_per_warpgroup_predicate

    def lane_predicate(self, extra: ir.Value | None) -> ir.Value:
        """:attr:`single_lane_predicate`, and ``extra`` too when an op has its
        own ``predicate`` operand (emitted as ``lane && extra``)."""
        predicate = self.single_lane_predicate
        return predicate if extra is None else arith.andi(predicate, extra)

    # --- layouts chosen by inference -----------------------------------------------

    @staticmethod
    def in_layouts(op: ir.OpView) -> list[ir.Attribute]:
        return _array_attr(op, "in_layouts")

    @staticmethod
    def out_layouts(op: ir.OpView) -> list[ir.Attribute]:
        return _array_attr(op, "out_layouts")

    @staticmethod
    def in_transforms(op: ir.OpView) -> list[ir.Attribute]:
        return _array_attr(op, "in_transforms")

    @staticmethod
    def out_transforms(op: ir.OpView) -> list[ir.Attribute]:
        return _array_attr(op, "out_transforms")

    @staticmethod
    def in_tmem_layouts(op: ir.OpView) -> list[ir.Attribute]:
        return _array_attr(op, "in_tmem_layouts")

    @staticmethod
    def out_tmem_layouts(op: ir.OpView) -> list[ir.Attribute]:
        return _array_attr(op, "out_tmem_layouts")

    # --- values --------------------------------------------------------------------

    from_ir = staticmethod(from_ir)
    to_ir = staticmethod(to_ir)

    def operand_arrays(self, op: ir.OpView, is_signed: bool | None = None,
                       *, layout: ir.Attribute | None = None) -> list[fa.FragmentedArray]:
        """Every vector operand of ``op`` as a ``FragmentedArray`` in ``layout``
        (default: the op's single out layout)."""
        if layout is None:
            [layout] = self.out_layouts(op)
        return [
            from_ir(v, layout, is_signed)
            for v in op.operation.operands
            if isinstance(v.type, ir.VectorType)
        ]

    def fail(self, op: ir.OpView, message: str, *, fix: str | Sequence[str] = (),
             **values: Any) -> SmaltiValueError:
        """An SM203 error for ``op`` to raise from a lowering rule: the op is
        wrong as annotated (jax raises ``ValueError``)."""
        return SmaltiValueError("SM203", message, op=op, values=values, fix=fix)

    def unsupported(self, op: ir.OpView, message: str, *, fix: str | Sequence[str] = (),
                    **values: Any) -> SmaltiNotImplementedError:
        """An SM203 error for ``op`` to raise from a lowering rule: a valid form
        the rule does not lower (jax raises ``NotImplementedError``)."""
        return SmaltiNotImplementedError("SM203", message, op=op, values=values, fix=fix)


def _array_attr(op: ir.OpView, name: str) -> list[ir.Attribute]:
    attributes = op.operation.attributes
    if name not in attributes:
        raise SmaltiValueError(
            "SM201", f"{op.operation.name} has no {name} attribute", op=op,
            fix="run smalti.infer_layouts(module) before lowering")
    return list(ir.ArrayAttr(attributes[name]))
