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

import attrs
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti import layouts
from smalti.constraints import Equal, Relayout, Variable
from smalti.diagnostics import (
    PluginError,
    SmaltiError,
    SmaltiNotImplementedError,
    SmaltiValueError,
    UnsatisfiableLayoutsError,
    describe_op,
    format_location,
)
from smalti.layouts import Constant, MemorySpace
from smalti.pipeline import Pipeline, default_pipeline
from smalti.registry import RuleKind, RuleRecord
from smalti.rules import ConstraintBuilder
from smalti.sites import SiteKind, ValueSite, layout_sites, producer_site
from smalti.solver import (
    BudgetExhausted,
    ConstraintFault,
    ConstraintSystem,
    Origin,
    Solver,
    Unsolvable,
)


TRACE_ENV = "SMALTI_TRACE"


@attrs.define
class TraceEntry:
    """Which rule described an op, and what was chosen for it."""

    op: str
    location: str | None
    plugin: str
    rule: str
    #: attribute name -> the attribute as written in the module
    layouts: dict[str, str] = attrs.Factory(dict)
    #: attribute name -> short names of the layouts (``[WGMMA, splat[128]]``)
    summary: dict[str, str] = attrs.Factory(dict)
    #: attribute name -> per entry, why it was chosen ("forced by ...",
    #: "implied by ...", "chosen by the search")
    why: dict[str, list[str]] = attrs.Factory(dict)


@attrs.define
class InferenceReport:
    """What :func:`infer_layouts` did (returned; printed by ``smalti infer --explain``)."""

    ops: int = 0
    variables: int = 0
    constraints: int = 0
    seconds: float = 0.0
    ops_per_plugin: dict[str, int] = attrs.Factory(dict)
    trace: list[TraceEntry] = attrs.Factory(list)


def walk(op: ir.Operation, skip_regions_of: set[ir.Operation]) -> Iterator[ir.Operation]:
    """Pre-order walk, not entering the regions of ops in ``skip_regions_of``
    (the set may grow during the walk)."""
    yield op
    if op in skip_regions_of:
        return
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield from walk(child.operation, skip_regions_of)


def _origin(op: ir.Operation, record: RuleRecord) -> Origin:
    def what() -> str:
        where = format_location(op.location)
        return op.name + (f" at {where}" if where else "")

    return Origin(what, record.plugin, record.function.__qualname__)


def _unsupported_arch(pipeline: Pipeline, op: ir.Operation, arch: tuple[int, int],
                      kind: RuleKind) -> SmaltiError | None:
    elsewhere = pipeline.unsupported_on(kind, op.name)
    if not elsewhere:
        return None
    owners = ", ".join(f"{r.plugin} (archs {r.archs})" for r in elsewhere)
    return SmaltiNotImplementedError(
        "SM002",
        f"{op.name} is not supported on sm_{arch[0]}{arch[1]}",
        op=op,
        values={"architecture": f"{arch}", "handled by": owners},
        fix=f"compile for an architecture {owners} supports, or install a plugin that "
        f"provides {op.name} for sm_{arch[0]}{arch[1]}",
    )


Annotated = list[tuple[ir.Operation, list[ValueSite]]]


def collect(module: ir.Module, arch: tuple[int, int], pipeline: Pipeline,
            report: InferenceReport | None = None, *, trace: bool = False
            ) -> tuple[ConstraintSystem, dict[ValueSite, Variable], Annotated]:
    """Asks every op's rule to describe it; returns the system, the variable
    of each site, and the ops that carry layouts with their sites (in walk
    order)."""
    table = pipeline.table(RuleKind.CONSTRAINT, arch)
    system = ConstraintSystem()
    site_vars: dict[ValueSite, Variable] = {}
    annotated: Annotated = []
    described_by_parent: Annotated = []
    opaque: set[ir.Operation] = set()
    for top in module.body.operations:
        for op in walk(top.operation, opaque):
            sites = layout_sites(op)
            if not sites:
                # Lane-level regions stay unseen even when the op itself
                # carries no layouts (a rule registered opaque_regions=True).
                record = table.get(op.name) if len(op.regions) else None
                if record is not None and record.opaque_regions:
                    opaque.add(op)
                continue
            if all(s in site_vars for s in sites):
                # A terminator (scf.yield...): its parent's rule described it.
                # Like jax, it still gets its attributes.
                described_by_parent.append((op, sites))
                continue
            record = table.get(op.name)
            if record is None:
                raise _unsupported_arch(pipeline, op, arch, RuleKind.CONSTRAINT) or (
                    SmaltiNotImplementedError(
                        "SM003",
                        f"no layout inference rule defined for {op.name}",
                        op=op,
                        values={"op": describe_op(op)},
                        fix=[
                            "install a plugin that registers a constraint rule for "
                            f"{op.name} (see docs/writing-plugins.md)",
                            "check `smalti plugins` for a blocked plugin that provides it",
                        ],
                    ))
            origin = _origin(op, record)
            builder = ConstraintBuilder(system, site_vars, op.opview, arch, origin, sites)
            try:
                record.function(op.opview, builder)
            except SmaltiError:
                raise
            except Exception as e:
                raise PluginError(
                    "SM005",
                    f"constraint rule {record.name} of plugin {record.plugin!r} raised "
                    f"{type(e).__name__}: {e}",
                    op=op,
                    fix=[f"report this to the authors of {record.plugin!r}",
                         f"or block the plugin: SMALTI_BLOCK_PLUGINS={record.plugin}"],
                ) from e
            if builder.opaque or record.opaque_regions:
                opaque.add(op)
            missing = [s for s in sites if s not in site_vars]
            if missing:
                builder._malformed(
                    "left these sites without a variable: "
                    + ", ".join(s.describe() for s in missing))
            annotated.append((op, sites))
            if report is not None:
                report.ops_per_plugin[record.plugin] = report.ops_per_plugin.get(record.plugin, 0) + 1
                if trace:
                    report.trace.append(TraceEntry(op.name, format_location(op.location),
                                                   record.plugin, record.function.__qualname__))
    _connect_uses(system, site_vars)
    # After the ops whose rules ran, so that they line up with report.trace.
    annotated.extend(described_by_parent)
    return system, site_vars, annotated


class _UseOrigin:
    """The origin of an edge between a value's producer and a consumer
    (a cheap stand-in for :class:`Origin`: there is one per use)."""

    __slots__ = ("producer", "consumer")
    plugin = None
    rule = None

    def __init__(self, producer: Variable, consumer: Variable) -> None:
        self.producer, self.consumer = producer, consumer

    def __str__(self) -> str:
        return (f"the use of {self.producer.site.describe()} by "
                f"{self.consumer.site.describe()}")


def _connect_uses(system: ConstraintSystem, site_vars: dict[ValueSite, Variable]) -> None:
    """Links each operand's variable to its producer's: registers may be
    relaid out on the way (strictly: only splat values change layout), refs
    keep their layout. Each edge is stated once, when the first of its two
    variables is visited, in variable order."""
    sites_of: dict[Variable, list[ValueSite]] = {}
    produced_by: dict[ir.Value, Variable] = {}  # result or argument -> its variable
    for site, var in site_vars.items():
        sites_of.setdefault(var, []).append(site)
        if site.kind is not SiteKind.OPERAND:
            produced_by[site.value] = var
    visited: set[Variable] = set()
    bitwidths: dict[ir.Type, int] = {}

    def link(producer: Variable, consumer: Variable, value: ir.Value) -> None:
        origin = _UseOrigin(producer, consumer)
        if consumer.memory_space is MemorySpace.REG:
            element = value.type.element_type
            bitwidth = bitwidths.get(element)
            if bitwidth is None:
                bitwidth = bitwidths[element] = mgpu_utils.bitwidth(element)
            system.require(Relayout(producer, consumer, bitwidth, strict=True), origin)
        else:
            system.require(Equal(producer, consumer), origin)

    for var in system.variables:
        for site in sites_of.get(var, ()):
            value = site.value
            if site.kind is SiteKind.OPERAND:
                producer = produced_by.get(value)
                if producer is None:
                    source = producer_site(value)
                    raise SmaltiValueError(
                        "SM103",
                        f"{site.describe()} is produced by {source.describe()}, which has "
                        "no layout",
                        op=site.op,
                        fix="produce the value with an op that has a constraint rule, or "
                        "install a plugin that gives its producer one",
                    )
                if producer not in visited:
                    link(producer, var, value)
            else:
                for use in value.uses:
                    consumer = site_vars.get(ValueSite(use.owner, SiteKind.OPERAND,
                                                       use.operand_number))
                    if consumer is not None and consumer not in visited:
                        link(var, consumer, value)
        visited.add(var)


_ATTRIBUTE_SUFFIX = {MemorySpace.REG: "layouts", MemorySpace.SMEM: "transforms",
                     MemorySpace.TMEM: "tmem_layouts"}


def _grouped(sites: list[ValueSite], site_vars: dict[ValueSite, Variable],
             solution: dict[Variable, Constant]) -> dict[str, tuple[Constant, ...]]:
    """The chosen constants of an op, by attribute name (``in_layouts``...)."""
    grouped: dict[str, list[Constant]] = {}
    for site in sites:
        side = "in" if site.kind is SiteKind.OPERAND else "out"
        name = f"{side}_{_ATTRIBUTE_SUFFIX[site.memory_space]}"
        grouped.setdefault(name, []).append(solution[site_vars[site]])
    return {name: tuple(values) for name, values in grouped.items()}


class _AttributeCache:
    """Array attributes by content: kernels repeat the same few layouts."""

    def __init__(self) -> None:
        self._arrays: dict[tuple[Constant, ...], ir.Attribute] = {}
        self._single: dict[Constant, ir.Attribute] = {}

    def array(self, values: tuple[Constant, ...]) -> ir.Attribute:
        attr = self._arrays.get(values)
        if attr is None:
            attr = ir.ArrayAttr.get([self._one(v) for v in values])
            self._arrays[values] = attr
        return attr

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
                  pipeline: Pipeline | None = None, trace: bool | None = None
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
    """
    start = time.perf_counter()
    pipeline = pipeline or default_pipeline()
    arch = tuple(arch)  # type: ignore[assignment]
    if trace is None:
        trace = os.environ.get(TRACE_ENV, "").strip().lower() not in ("", "0", "false", "no")
    report = InferenceReport()
    # Inference makes many small acyclic objects: collecting them mid-pass is waste.
    with _gc_paused(), module.context, ir.Location.unknown(module.context):
        system, site_vars, annotated = collect(module, arch, pipeline, report, trace=trace)
        try:
            solver = Solver(system, arch)
            solution = solver.solve()
        except Unsolvable as e:
            first = e.variables[0].site.op if e.variables else None
            raise UnsatisfiableLayoutsError(
                "Failed to infer a possible set of layouts: " + e.summary,
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
            raise SmaltiValueError(
                "SM104",
                "Layout inference failed to find a solution within its search budget",
                op=e.variables[0].site.op if e.variables else None,
                values={"ambiguous values": ", ".join(v.site.describe() for v in e.variables[:5])},
                fix="add mosaic_gpu.layout_cast ops on these values to pin their layouts",
            ) from None
        # Transactional: nothing was written until here. Like jax, the module
        # also gets its dump options (a module attribute).
        mgpu.get_or_set_dump_options(module)
        cache = _AttributeCache()
        chosen = [(op, _grouped(sites, site_vars, solution)) for op, sites in annotated]
        for op, groups in chosen:
            for name, values in groups.items():
                op.attributes[name] = cache.array(values)
    report.ops = len(annotated)
    report.variables = len(system.variables)
    report.constraints = len(system.constraints)
    report.seconds = time.perf_counter() - start
    for entry, (op, sites) in zip(report.trace, annotated):
        for site in sites:
            side = "in" if site.kind is SiteKind.OPERAND else "out"
            name = f"{side}_{_ATTRIBUTE_SUFFIX[site.memory_space]}"
            entry.why.setdefault(name, []).append(solver.why_assigned(site_vars[site]))
    for entry, (op, groups) in zip(report.trace, chosen):
        entry.layouts = {name: str(op.attributes[name]) for name in groups}
        entry.summary = {name: "[" + ", ".join(map(str, values)) + "]"
                         for name, values in groups.items()}
    return report
