"""The inference driver: from a Warpgroup-semantics module to layout attributes.

``infer_layouts`` walks the module, asks each op's constraint rule to describe
it, connects every use of a value to its definition, solves the system and
only then writes the attributes jax uses (``in_layouts``, ``out_layouts``,
``in_transforms``, ``out_transforms``, ``in_tmem_layouts``,
``out_tmem_layouts``). On any error the module is left untouched.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterator
from typing import NamedTuple

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir

from smalti import arch_policy, layouts
from smalti.constraints import Variable
from smalti.diagnostics import (
    PluginError,
    SmaltiError,
    SmaltiNotImplementedError,
    SmaltiValueError,
    UnsatisfiableLayoutsError,
    describe_op,
    format_location,
)
from smalti.layouts import ATTRIBUTE_NAMES, Constant, MemorySpace
from smalti.pipeline import Pipeline, default_pipeline
from smalti.records import Fields
from smalti.registry import RuleKind, RuleRecord
from smalti.rules import ConstraintBuilder, invalid_op, verifier_failure
from smalti.sites import OPERAND, Row, SiteTable
from smalti.solver import (
    BudgetExhausted,
    ConstraintFault,
    ConstraintSystem,
    Solver,
    Unsolvable,
)

TRACE_ENV = "SMALTI_TRACE"
ADVANCE, SKIP, INTERRUPT = ir.WalkResult.ADVANCE, ir.WalkResult.SKIP, ir.WalkResult.INTERRUPT


class TraceEntry(Fields):
    """Which rule described an op, and what was chosen for it."""

    __slots__ = ("op", "location", "plugin", "rule", "layouts", "summary", "why")

    def __init__(self, op: str, location: str | None, plugin: str, rule: str,
                 layouts: dict[str, str] | None = None, summary: dict[str, str] | None = None,
                 why: dict[str, list[str]] | None = None) -> None:
        self.op = op
        self.location = location
        self.plugin = plugin
        self.rule = rule
        #: attribute name -> the attribute as written in the module
        self.layouts = {} if layouts is None else layouts
        #: attribute name -> short names of the layouts (``[WGMMA, splat[128]]``)
        self.summary = {} if summary is None else summary
        #: attribute name -> per entry, why it was chosen ("forced by ...",
        #: "implied by ...", "chosen by the search")
        self.why = {} if why is None else why


class InferenceReport(Fields):
    """What :func:`infer_layouts` did (returned; printed by ``smalti infer --explain``)."""

    __slots__ = ("ops", "variables", "constraints", "seconds", "ops_per_plugin", "trace",
                 "arch_fallbacks")

    def __init__(self, ops: int = 0, variables: int = 0, constraints: int = 0,
                 seconds: float = 0.0, ops_per_plugin: dict[str, int] | None = None,
                 trace: list[TraceEntry] | None = None,
                 arch_fallbacks: list[str] | None = None) -> None:
        self.ops = ops
        self.variables = variables
        self.constraints = constraints
        self.seconds = seconds
        self.ops_per_plugin = {} if ops_per_plugin is None else ops_per_plugin
        self.trace = [] if trace is None else trace
        #: SM002's text for each op name handled by a rule for another
        #: architecture (the lenient policy of :mod:`smalti.arch_policy`)
        self.arch_fallbacks = [] if arch_fallbacks is None else arch_fallbacks


#: The ops that get layout attributes: each with its rows, their variables,
#: and how many of the rows are operands if all hold vectors, else -1.
Annotated = list[tuple[ir.Operation, list[Row], list[Variable], int]]
#: Ops whose rule is :func:`smalti.rules.same_layout`, described without a
#: builder: each with the variable of all its sites, and how many operands
#: and results hold vectors.
Shared = list[tuple[ir.Operation, Variable, int, int]]


class Collected(NamedTuple):
    """What the rules said about a kernel, ready for the solver."""

    system: ConstraintSystem
    annotated: Annotated
    shared: Shared


def collect(module: ir.Module, arch: tuple[int, int], pipeline: Pipeline,
            report: InferenceReport | None = None, *, trace: bool = False,
            strict_arch: bool = False) -> Collected:
    """Asks every op's rule to describe it and links each use of a value to
    its definition. The ops that carry layouts come in walk order (those
    described by their parent's rule last); with ``trace``, all of them are
    annotated, so that they line up with ``report.trace``.

    An op none of whose rules supports ``arch`` is described by the nearest
    rule, with an :class:`smalti.arch_policy.ArchitectureWarning`, or, with
    ``strict_arch``, refused (SM002)."""
    if strict_arch:
        fallbacks: frozenset[str] = frozenset()
        table = pipeline.table(RuleKind.CONSTRAINT, arch)
    else:
        table, fallbacks = pipeline.table_with_fallbacks(RuleKind.CONSTRAINT, arch)
    fallbacks_used: dict[str, ir.Operation] = {}
    system = ConstraintSystem()
    sites = SiteTable()
    described_elsewhere = sites.described_elsewhere
    annotated: Annotated = []
    shared: Shared = []
    described_by_parent: Annotated = []
    failures: list[BaseException] = []
    ops_per_plugin = report.ops_per_plugin if report is not None else {}

    def visit(op: ir.Operation) -> ir.WalkResult:
        """Describes ``op``; whether to enter its regions (a rule may have
        declared them opaque: already at Lane level). An exception stops the
        walk and is raised after it: the bindings would turn it into a
        RuntimeError."""
        try:
            name = op.name
            record = table.get(name)
            if fallbacks and name in fallbacks:
                fallbacks_used.setdefault(name, op)
            rows, split = sites.read(op)
            if not rows:
                # Lane-level regions stay unseen even when the op itself
                # carries no layouts (a rule registered opaque_regions=True).
                return SKIP if record is not None and record.opaque_regions else ADVANCE
            # A terminator some of whose sites its parent's rule described? Most
            # kernels have none, and only ops of those terminators' names are hashed.
            elsewhere = described_elsewhere.get(name) if described_elsewhere else None
            op_hash = hash(op) if elsewhere else None
            described = None
            if op_hash is not None and op_hash in elsewhere:  # type: ignore[operator]
                described = sites.described(rows, op_hash)
                if None not in described:
                    # A terminator (scf.yield...): its parent's rule
                    # described it. Like jax, it still gets its attributes.
                    described_by_parent.append((op, rows, described, split))  # type: ignore[arg-type]
                    return ADVANCE
            if record is None:
                raise _no_rule(pipeline, op, arch)
            var = (sites.share(rows, split, system)
                   if record.same_layout and described is None else None)
            if var is not None:
                if trace:  # annotated as the builder would, to line up with the trace
                    annotated.append((op, rows, [var] * len(rows), split))
                else:
                    shared.append((op, var, split, len(rows) - split))
                opaque = False
            else:
                view = op.opview
                # The rows the parent's rule described are linked already.
                fresh = None if described is None else [v is None for v in described]
                builder = ConstraintBuilder(system, sites, view, arch, record, rows, op_hash,
                                            described)
                try:
                    record.function(view, builder)
                except SmaltiError:
                    raise
                except Exception as e:
                    raise _rule_failed(record, view, e) from e
                variables = builder.site_variables
                if None in variables:
                    builder._malformed(
                        "left these sites without a variable: "
                        + ", ".join(s.describe() for s, v in zip(builder.layout_sites(), variables)
                                    if v is None))
                if fresh is None:
                    sites.link(rows, variables, system)  # type: ignore[arg-type]
                else:
                    sites.link([r for r, new in zip(rows, fresh) if new],
                               [v for v, new in zip(variables, fresh) if new],  # type: ignore[misc]
                               system)
                annotated.append((op, rows, variables, split))  # type: ignore[arg-type]
                opaque = builder.opaque
            plugin = record.plugin
            ops_per_plugin[plugin] = ops_per_plugin.get(plugin, 0) + 1
            if trace and report is not None:  # every op's rule is annotated
                report.trace.append(TraceEntry(op.name, format_location(op.location), plugin,
                                               record.function.__qualname__))
            return SKIP if opaque or record.opaque_regions else ADVANCE
        except BaseException as e:
            failures.append(e)
            return INTERRUPT

    # Pre-order, driven by MLIR (cheaper than a stack of op views): an op's
    # regions are entered after its rule ran.
    for top in module.body.operations:
        top.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
        if failures:
            break
    if fallbacks_used:
        texts = arch_policy.warn_fallbacks(fallbacks_used, table,
                                           pipeline.rules[RuleKind.CONSTRAINT], arch,
                                           RuleKind.CONSTRAINT, stacklevel=4)
        if report is not None:
            report.arch_fallbacks += texts
    if failures:
        raise failures.pop()  # held by no local: no cycle through its traceback
    sites.connect(system)
    # After the ops whose rules ran, so that they line up with report.trace.
    annotated.extend(described_by_parent)
    return Collected(system, annotated, shared)


def _no_rule(pipeline: Pipeline, op: ir.Operation, arch: tuple[int, int]) -> SmaltiError:
    """The error for an op with layout sites and no constraint rule."""
    elsewhere = pipeline.unsupported_on(RuleKind.CONSTRAINT, op.name)
    if elsewhere:
        return arch_policy.unsupported(op, arch, RuleKind.CONSTRAINT, elsewhere)
    return (
        SmaltiNotImplementedError(
            "SM003",
            f"No layout inference rule defined for {op.name}",  # jax's phrase
            op=op,
            values={"op": describe_op(op)},
            fix=[
                "install a plugin that registers a constraint rule for "
                f"{op.name} (see docs/writing-plugins.md)",
                "check `smalti plugins` for a blocked plugin that provides it",
            ],
        ))


def _rule_failed(record: RuleRecord, view: ir.OpView, error: Exception) -> SmaltiError:
    """The error for a crash in ``record``'s rule: the plugin's error, unless
    the op itself is invalid (the user's)."""
    problem = verifier_failure(view)
    if problem is not None:
        return invalid_op(view, problem)
    return PluginError(
        "SM005",
        f"constraint rule {record.name} of plugin {record.plugin!r} raised "
        f"{type(error).__name__}: {error}",
        op=view.operation,
        fix=[f"report this to the authors of {record.plugin!r}",
             f"or block the plugin: SMALTI_BLOCK_PLUGINS={record.plugin}"],
    )


IN_LAYOUTS, OUT_LAYOUTS = ATTRIBUTE_NAMES[MemorySpace.REG]


def _attribute_name(row: Row) -> str:
    return ATTRIBUTE_NAMES[row[5]][row[1] is not OPERAND]


def _grouped(rows: list[Row], values: list[Constant]) -> dict[str, list[Constant]]:
    """The chosen constants of an op (``values``: one per row), by attribute
    name (``in_layouts``...)."""
    grouped: dict[str, list[Constant]] = {}
    for row, value in zip(rows, values):
        grouped.setdefault(_attribute_name(row), []).append(value)
    return grouped


def _write_attributes(collected: Collected, solution: list[Constant]) -> None:
    """Writes the chosen constants of every op as its attributes."""
    cache = _AttributeCache()
    register_layouts, shared_layouts = cache.register_layouts, cache.shared_layouts
    for op, rows, variables, split in collected.annotated:
        values = [solution[var.id] for var in variables]
        if split < 0:  # refs among its sites: grouped by attribute name
            attributes = op.attributes
            for name, attribute in cache.by_name(rows, values):
                attributes[name] = attribute
            continue
        ins, outs = register_layouts(values, split)
        attributes = op.attributes
        if ins is not None:
            attributes[IN_LAYOUTS] = ins
        if outs is not None:
            attributes[OUT_LAYOUTS] = outs
    for op, var, operands, results in collected.shared:
        ins, outs = shared_layouts(solution[var.id], operands, results)
        attributes = op.attributes
        if ins is not None:
            attributes[IN_LAYOUTS] = ins
        if outs is not None:
            attributes[OUT_LAYOUTS] = outs


#: An op's ``in_layouts`` and ``out_layouts`` (``None``: it has no such sites).
_InsOuts = tuple[ir.Attribute | None, ir.Attribute | None]


class _AttributeCache:
    """Array attributes by content: kernels repeat the same few layouts.

    Keyed by the identity of the constants (the solver hands out the same
    few objects), which is much cheaper than hashing them; the cache keeps
    them alive. Most ops are looked up once for both of their attributes.
    """

    def __init__(self) -> None:
        self._arrays: dict[tuple[int, ...], tuple[ir.Attribute, list[Constant]]] = {}
        self._single: dict[Constant, ir.Attribute] = {}
        self._registers: dict[tuple[int, ...], tuple[_InsOuts, list[Constant]]] = {}
        self._shared: dict[tuple[int, int, int], tuple[_InsOuts, Constant]] = {}
        self._by_name: dict[tuple[object, ...], tuple[list[tuple[str, ir.Attribute]],
                                                      list[Constant]]] = {}

    def array(self, values: list[Constant]) -> ir.Attribute:
        key = tuple(map(id, values))
        cached = self._arrays.get(key)
        if cached is None:
            cached = self._arrays[key] = (
                ir.ArrayAttr.get([self._one(v) for v in values]), values)
        return cached[0]

    def register_layouts(self, values: list[Constant], split: int) -> _InsOuts:
        """Those of an op whose sites all hold vectors, the first ``split`` of
        them operands."""
        key = (split, *[id(v) for v in values])  # faster than *map() here
        cached = self._registers.get(key)
        if cached is None:
            pair = (self.array(values[:split]) if split else None,
                    self.array(values[split:]) if split < len(values) else None)
            cached = self._registers[key] = (pair, values)
        return cached[0]

    def by_name(self, rows: list[Row], values: list[Constant]
                ) -> list[tuple[str, ir.Attribute]]:
        """Those of an op with refs among its sites (``values``: the layout of
        each site), by attribute name: an MMA's ``in_layouts``,
        ``in_transforms`` and ``out_layouts``. Keyed by the sites' attribute
        names (strings hash once) and the identity of the values."""
        key = (*[ATTRIBUTE_NAMES[row[5]][row[1] is not OPERAND] for row in rows],
               *[id(v) for v in values])
        cached = self._by_name.get(key)
        if cached is None:
            cached = self._by_name[key] = (
                [(name, self.array(group)) for name, group in _grouped(rows, values).items()],
                values)
        return cached[0]

    def shared_layouts(self, value: Constant, operands: int, results: int) -> _InsOuts:
        """Those of an op whose ``operands`` vector operands and ``results``
        vector results all have layout ``value`` (most of a kernel)."""
        key = (id(value), operands, results)
        cached = self._shared.get(key)
        if cached is None:
            pair = (self.array([value] * operands) if operands else None,
                    self.array([value] * results) if results else None)
            cached = self._shared[key] = (pair, value)
        return cached[0]

    def _one(self, value: Constant) -> ir.Attribute:
        attr = self._single.get(value)
        if attr is None:
            attr = self._single[value] = layouts.to_attribute(value)
        return attr


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:  # the object is broken already: do not fail twice
        return f"<{type(value).__name__}>"


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def infer_layouts(module: ir.Module, *, arch: tuple[int, int] = (9, 0),
                  pipeline: Pipeline | None = None, trace: bool | None = None,
                  fuel: int | None = None, strict_arch: bool | None = None
                  ) -> InferenceReport:
    """Infers layouts for ``module`` in place, like ``mgpu.infer_layout``.

    Every op with vector operands or results gets ``in_layouts`` /
    ``out_layouts``, every op with SMEM refs ``in_transforms`` /
    ``out_transforms``, every op with TMEM refs ``in_tmem_layouts`` /
    ``out_tmem_layouts``, one entry per such operand or result. Raises a
    :class:`smalti.diagnostics.SmaltiError` and leaves the module unchanged if
    there is no solution.

    With ``trace`` (default: the ``SMALTI_TRACE`` environment variable), the
    returned report records which plugin and rule handled each op and the
    layouts chosen for it.

    ``fuel`` bounds the solver's work as jax's ``fuel`` does: the number of
    layouts it may assign, those propagation implies and those its search
    tries (default: no bound on propagation, and the search's own budget).
    Exhausting it is SM104.

    An op none of whose rules supports ``arch`` is handled by the nearest
    rule with a warning, like jax, which does not check the architecture;
    ``strict_arch`` (default: the ``SMALTI_STRICT_ARCH`` environment
    variable) makes it an error, SM002 (see :mod:`smalti.arch_policy`).
    """
    start = time.perf_counter()
    pipeline = pipeline or default_pipeline()
    arch = tuple(arch)  # type: ignore[assignment]
    if trace is None:
        trace = os.environ.get(TRACE_ENV, "").strip().lower() not in ("", "0", "false", "no")
    report = InferenceReport()
    if fuel is not None and (isinstance(fuel, bool) or not isinstance(fuel, int) or fuel < 0):
        raise SmaltiValueError(
            "SM104", f"fuel must be a non-negative int, got {fuel!r}",
            values={"fuel": repr(fuel)}, fix="pass fuel=None for the default budget, or an int")
    # Inference makes many small acyclic objects: collecting them mid-pass is
    # waste. They die when _infer returns, before collection resumes, so the
    # collector never scans them either.
    with _gc_paused():
        _infer(module, arch, pipeline, report, trace, fuel, arch_policy.strict(strict_arch))
    report.seconds = time.perf_counter() - start
    return report


def _infer(module: ir.Module, arch: tuple[int, int], pipeline: Pipeline,
           report: InferenceReport, trace: bool, fuel: int | None, strict_arch: bool) -> None:
    with module.context, ir.Location.unknown(module.context):
        collected = collect(module, arch, pipeline, report, trace=trace, strict_arch=strict_arch)
        system, annotated = collected.system, collected.annotated
        try:
            solver = Solver(system, arch, fuel=fuel)
            solution = solver.solve_in_order()
        except Unsolvable as e:
            first = e.variables[0].site.op if e.variables else None
            raise UnsatisfiableLayoutsError(
                "Failed to infer a possible set of layouts. This should only happen if "
                "user-provided layout casts are unsatisfiable: " + e.summary,
                conflict=e.lines,
                op=first,
                values={"conflict": "\n    " + "\n    ".join(e.lines)},
                fix=["insert a mosaic_gpu.layout_cast to a layout all the ops above accept",
                     "or remove the layout cast that asks for an impossible layout"],
            ) from None
        except ConstraintFault as e:
            plugin = e.origin.plugin or "?"
            raise PluginError(
                "SM005",
                f"constraint {type(e.constraint).__name__} stated by rule {e.origin.rule} of "
                f"plugin {plugin!r} raised {e}",
                values={"stated by": str(e.origin), "constraint": _safe_repr(e.constraint)},
                fix=[f"report this to the authors of {plugin!r}",
                     f"or block the plugin: SMALTI_BLOCK_PLUGINS={plugin}"],
            ) from e.error
        except BudgetExhausted as e:
            budget = f"the fuel given ({fuel})" if fuel is not None else "its search budget"
            raise SmaltiValueError(
                "SM104",
                # jax's words, then what was exhausted
                "Layout inference failed to find a solution. Consider adding layout "
                f"annotations to your program to guide the search (it exhausted {budget})",
                op=e.variables[0].site.op if e.variables else None,
                values={"ambiguous values": ", ".join(v.site.describe() for v in e.variables[:5])},
                fix=["add mosaic_gpu.layout_cast ops on these values to pin their layouts",
                     "or pass a larger fuel="],
            ) from None
        # Transactional: nothing was written until here. Like jax, the module
        # also gets its dump options (a module attribute).
        mgpu.get_or_set_dump_options(module)
        _write_attributes(collected, solution)
    report.ops = len(annotated) + len(collected.shared)
    report.variables = len(system.variables)
    report.constraints = len(system.constraints) + len(system.uses)
    for entry, (op, rows, variables, _) in zip(report.trace, annotated):
        for row, var in zip(rows, variables):
            entry.why.setdefault(_attribute_name(row), []).append(solver.why_assigned(var))
        groups = _grouped(rows, [solution[var.id] for var in variables])
        entry.layouts = {name: str(op.attributes[name]) for name in groups}
        entry.summary = {name: "[" + ", ".join(map(str, values)) + "]"
                         for name, values in groups.items()}
