"""The lowering driver: Warpgroup-semantics ops to Lane-semantics IR.

``lower`` first checks the whole module — a rule for every op that needs one
on this architecture, and the layout attributes each such op must carry —
and only then rewrites it, op by op in program order, replacing each op's
results with what its rule returns.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterator
from typing import Final, cast

from jax._src.interpreters import mlir as mlir_interpreter
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, gpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import launch_context as lc
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti import arch_policy
from smalti.caching import per_context
from smalti.diagnostics import (
    PluginError,
    SmaltiError,
    SmaltiNotImplementedError,
    SmaltiValueError,
    describe_op,
    format_location,
)
from smalti.layouts import ATTRIBUTE_NAMES, MemorySpace, register_layout_fits
from smalti.pipeline import Pipeline, default_pipeline
from smalti.records import Fields
from smalti.registry import Arch, RuleKind, RuleRecord
from smalti.rules import RECURSED, LoweringContext, invalid_op, verifier_failure
from smalti.sites import LayoutValues, layout_values

_CODEGEN_REJECTIONS = (
    ValueError,
    NotImplementedError,
    fa.UnsupportedTransferError,
    fa.TransferPlanDerivationError,
)

class _Skip(enum.Enum):
    SKIP = enum.auto()


_SKIP: Final = _Skip.SKIP  # the op needs no lowering


class LoweringReport(Fields):
    """What :func:`lower` did."""

    __slots__ = ("ops", "seconds", "ops_per_plugin", "arch_fallbacks")

    def __init__(self, ops: int = 0, seconds: float = 0.0,
                 ops_per_plugin: dict[str, int] | None = None,
                 arch_fallbacks: list[str] | None = None) -> None:
        self.ops = ops
        self.seconds = seconds
        self.ops_per_plugin = {} if ops_per_plugin is None else ops_per_plugin
        #: SM002's text for each op name lowered by a rule for another
        #: architecture (the lenient policy of :mod:`smalti.arch_policy`)
        self.arch_fallbacks = [] if arch_fallbacks is None else arch_fallbacks


def recorded_arch(module: ir.Module) -> tuple[int, int] | None:
    """The architecture recorded in the module's ``mosaic_gpu.arch_*`` attributes."""
    attributes = module.operation.attributes
    if "mosaic_gpu.arch_major" not in attributes or "mosaic_gpu.arch_minor" not in attributes:
        return None
    return (ir.IntegerAttr(attributes["mosaic_gpu.arch_major"]).value,
            ir.IntegerAttr(attributes["mosaic_gpu.arch_minor"]).value)


def module_arch(module: ir.Module) -> tuple[int, int]:
    """The architecture a module was built for (its ``mosaic_gpu.arch_*``
    attributes), else the one jax infers for the current device."""
    return recorded_arch(module) or tuple(mgpu_utils._infer_arch())  # type: ignore[return-value]


class _Lowerer:
    def __init__(self, module: ir.Module, pipeline: Pipeline, arch: tuple[int, int],
                 strict_arch: bool) -> None:
        self.module = module
        self.pipeline = pipeline
        self.arch = arch
        if strict_arch:
            self.fallbacks: frozenset[str] = frozenset()
            self.table = pipeline.table(RuleKind.LOWERING, arch)
        else:
            self.table, self.fallbacks = pipeline.table_with_fallbacks(RuleKind.LOWERING, arch)
        #: the first op of each name lowered by a rule for another architecture
        self.fallbacks_used: dict[str, ir.Operation] = {}
        self.required = pipeline.required_prefixes
        self.report = LoweringReport()
        self.ctx: LoweringContext | None = None

    def _decision(self, op: ir.Operation, operands: LayoutValues, results: LayoutValues
                  ) -> RuleRecord | None | _Skip:
        """The rule lowering ``op``; ``None`` if it is only traversed,
        :data:`_SKIP` if it needs nothing (``operands`` and ``results``: its
        ``layout_values``)."""
        name = op.name
        required = name.startswith(self.required)
        if not (required or operands or results):
            for region in op.regions:
                if len(region.blocks):
                    break
            else:
                return _SKIP
        record = self.table.get(name)
        if record is not None:
            if self.fallbacks and name in self.fallbacks:
                self.fallbacks_used.setdefault(name, op)
            return record
        if operands or results or required:
            elsewhere = self.pipeline.unsupported_on(RuleKind.LOWERING, name)
            if elsewhere:
                raise arch_policy.unsupported(op, self.arch, RuleKind.LOWERING, elsewhere)
            raise (
                SmaltiNotImplementedError(
                    "SM004",
                    f"Missing lowering rule for {name}",
                    op=op,
                    values={"op": describe_op(op)},
                    fix=[f"install a plugin that registers a lowering rule for {name}",
                         "check `smalti plugins` for a blocked plugin that provides it"],
                ))
        return None

    # --- validation ---------------------------------------------------------------

    def ops_to_check(self) -> Iterator[tuple[ir.Operation, bool]]:
        """Every op in pre-order with whether it runs under warp semantics,
        not entering the regions of ops whose rule declares them opaque
        (Lane level)."""
        stack = [(view.operation, False) for view in self.module.body.operations]
        stack.reverse()
        while stack:
            op, warp = stack.pop()
            yield op, warp
            if not len(op.regions):
                continue
            record = self.table.get(op.name)
            if record is not None and record.opaque_regions:
                continue
            warp = warp or (record is not None and record.warp_regions)
            children = [(child.operation, warp) for region in op.regions
                        for block in region.blocks for child in block.operations]
            children.reverse()
            stack += children

    def decide(self, op: ir.Operation) -> RuleRecord | None | _Skip:
        # Decided again rather than remembered from validation: an
        # ir.Operation hashes by its contents (attributes, operands), which
        # rewriting changes, and an op erased by a rewrite is invalidated,
        # so a dict keyed by ops both misses and raises "the operation has
        # been invalidated" (profiler kernels: issue 28).
        return self._decision(op, layout_values(op.operands), layout_values(op.results))

    def validate(self) -> None:
        for op, warp in self.ops_to_check():
            # Each op's layout values read once, for its decision and its check.
            operands, results = layout_values(op.operands), layout_values(op.results)
            record = self._decision(op, operands, results)
            if record is None or record is _SKIP:
                continue
            if warp and not record.warp_semantics:
                raise _no_warp_semantics(record, op)
            _check_layout_attributes(op, operands, results)
            if record.check is not None:  # the rule's own check (registered with check=)
                _run_check(record, op)
        if self.fallbacks_used:
            self.report.arch_fallbacks += arch_policy.warn_fallbacks(
                self.fallbacks_used, self.table, self.pipeline.rules[RuleKind.LOWERING],
                self.arch, RuleKind.LOWERING, stacklevel=4)

    # --- rewriting ----------------------------------------------------------------

    def lower_op(self, op: ir.OpView) -> None:
        operation = op.operation
        record = self.decide(operation)
        if record is _SKIP:
            return
        if record is None:
            self.traverse(operation)
            return
        ctx = self.ctx
        assert ctx is not None  # made by lower() before the walk
        if (ctx.thread_semantics == mgpu_utils.ThreadSubset.WARP
                and not record.warp_semantics):
            raise _no_warp_semantics(record, operation)
        with operation.location:
            try:
                results = record.function(ctx, op.operation.opview)
            except SmaltiError as e:
                if e.op is None:  # raised by a helper that did not know the op
                    _blame(e, operation)
                raise
            except Exception as e:
                # Validation did not verify the ops (a walk too many): an
                # invalid op is said in the verifier's words.
                problem = verifier_failure(operation)
                if problem is not None:
                    raise invalid_op(operation, problem, lowering=True) from e
                if isinstance(e, _CODEGEN_REJECTIONS):
                    # Mosaic GPU's code generators reject unsupported cases with these.
                    raise _rule_failure(type(e), record, operation, e) from e
                raise PluginError(
                    "SM005",
                    f"lowering rule {record.name} of plugin {record.plugin!r} raised "
                    f"{type(e).__name__}: {e}",
                    op=operation,
                    fix=[f"report this to the authors of {record.plugin!r}",
                         f"or block the plugin: SMALTI_BLOCK_PLUGINS={record.plugin}"],
                ) from e
        self.report.ops += 1
        per_plugin = self.report.ops_per_plugin
        per_plugin[record.plugin] = per_plugin.get(record.plugin, 0) + 1
        if results is RECURSED:
            return
        results = _checked_results(results, record, operation)
        for old, new in zip(operation.results, results):
            old.replace_all_uses_with(new)
        operation.erase()

    def traverse(self, op: ir.Operation) -> None:
        for region in op.regions:
            for block in region.blocks:
                for child in list(block.operations):
                    with ir.InsertionPoint(child):
                        self.lower_op(child)

    def run(self, launch_context: lc.LaunchContext, auto_barriers: bool) -> None:
        self.validate()
        # What only rewriting can find (a code generator's refusal, a body op
        # that cannot take a rebound value) must not leave the module
        # half-lowered either: it is put back as validation left it.
        snapshot = _Snapshot(self.module)
        try:
            self.ctx = _make_context(self.module, launch_context, auto_barriers, self.arch,
                                     self.lower_op)
            with ir.InsertionPoint(self.module.body):
                for op in list(self.module.body.operations):
                    self.lower_op(op)
        except SmaltiError:
            snapshot.restore(self.module)
            raise
        finally:
            snapshot.discard()


class _Snapshot:
    """A copy of a module (a clone costs about a millisecond for thousands of
    ops, next to seconds of lowering), to put back in place of what a failed
    rewrite left."""

    def __init__(self, module: ir.Module) -> None:
        self.copy: ir.Operation | None = module.operation.clone()
        try:
            _ = self.copy.parent  # the bindings clone at the caller's insertion point, if any
        except ValueError:  # "Detached operations have no parent": nowhere, as wanted
            pass
        else:
            self.copy.detach_from_parent()

    def discard(self) -> None:
        if self.copy is not None:
            self.copy.erase()
            self.copy = None

    def restore(self, module: ir.Module) -> None:
        assert self.copy is not None  # restored at most once, before discard()
        operation = module.operation
        for op in reversed(list(module.body.operations)):
            op.erase()  # top-level ops (functions, globals) use no value of another
        here = ir.InsertionPoint(module.body)
        for op in list(self.copy.regions[0].blocks[0].operations):
            op.detach_from_parent()
            here.insert(op)
        saved = self.copy.attributes
        kept = {saved[i].name: saved[i].attr for i in range(len(saved))}
        attributes = operation.attributes
        for name in [attributes[i].name for i in range(len(attributes))]:
            if name not in kept:
                del attributes[name]
        for name, value in kept.items():
            attributes[name] = value


def _checked_results(results: object, record: RuleRecord,
                     operation: ir.Operation) -> list[ir.Value]:
    """A rule's return value as one IR value per result of its op, or SM006."""
    problem = None
    try:
        values = list(results)  # type: ignore[call-overload]
    except TypeError:
        values, problem = [], f"returned {results!r}, not a sequence of values or RECURSED"
    if problem is None and len(values) != len(operation.results):
        problem = f"returned {len(values)} values for {len(operation.results)} results"
    if problem is None:
        wrong = [f"#{i}: {v!r}" for i, v in enumerate(values) if not isinstance(v, ir.Value)]
        if wrong:
            problem = "returned something that is not an IR value: " + ", ".join(wrong)
    if problem is not None:
        raise PluginError(
            "SM006", f"lowering rule {record.name} of plugin {record.plugin!r} {problem}",
            op=operation, fix=f"fix the plugin {record.plugin!r}: return one ir.Value per "
            "result of the op (a list), or RECURSED")
    return values


def _blame(error: SmaltiError, op: ir.Operation) -> None:
    """Names ``op`` (being lowered) in ``error``."""
    error.op = describe_op(op)
    error.location = format_location(op.location)
    error.args = (error.render(),)


def _run_check(record: RuleRecord, op: ir.Operation) -> None:
    try:
        record.check(op.opview)  # type: ignore[misc]
    except SmaltiError:
        raise
    except Exception as e:
        problem = verifier_failure(op)
        if problem is not None:
            raise invalid_op(op, problem, lowering=True) from e
        raise PluginError(
            "SM005", f"the check of lowering rule {record.name} of plugin {record.plugin!r} "
            f"raised {type(e).__name__}: {e}", op=op,
            fix=[f"report this to the authors of {record.plugin!r}",
                 f"or block the plugin: SMALTI_BLOCK_PLUGINS={record.plugin}"]) from e


def _no_warp_semantics(record: RuleRecord, op: ir.Operation) -> SmaltiError:
    return SmaltiNotImplementedError(
        "SM204",
        f"Op {op.name} does not support warp semantics",
        op=op,
        values={"rule": f"{record.name} ({record.plugin})"},
        fix=[f"move the {op.name} out of the mosaic_gpu.warp_map body",
             f"or have {record.plugin!r} register its lowering rule with "
             "warp_semantics=True if it handles ctx.thread_semantics == WARP"],
    )


def _rule_failure(kind: type, record: RuleRecord, op: ir.Operation,
                  error: Exception) -> SmaltiError:
    cls = SmaltiValueError if issubclass(kind, ValueError) else SmaltiNotImplementedError
    attributes = op.attributes
    layouts = {name: str(attributes[name]) for name in
               ("in_layouts", "out_layouts", "in_transforms", "out_transforms")
               if name in attributes}
    return cls(
        "SM203",
        f"{op.name} cannot be lowered with its layouts: {error}",
        op=op,
        values={**layouts, "rule": f"{record.name} ({record.plugin})"},
        fix=["let layout inference choose the layouts, or change them with a "
             "mosaic_gpu.layout_cast"],
    )


def _check_layout_attributes(op: ir.Operation, operands: LayoutValues,
                             results: LayoutValues) -> None:
    """``op`` has an attribute entry for each of its layout values
    (``operands`` and ``results``: their ``layout_values``), fitting it."""
    attributes = op.attributes
    for side, found_values in ((0, operands), (1, results)):
        by_space: dict[MemorySpace, list[ir.Value]] = {}
        for _, value, _, space in found_values:
            by_space.setdefault(space, []).append(value)
        for space, spaced in by_space.items():
            name = ATTRIBUTE_NAMES[space][side]
            present = name in attributes
            found = len(ir.ArrayAttr(attributes[name])) if present else 0
            if found != len(spaced):
                what = "is missing" if not present else f"has {found} entries"
                raise SmaltiValueError(
                    "SM201",
                    f"{op.name} {what} {name}: it needs one entry per "
                    f"{space.value} {'result' if side else 'operand'} ({len(spaced)})",
                    op=op,
                    fix=["run smalti.infer_layouts(module) before lowering",
                         f"or set {name} by hand with {len(spaced)} entries"],
                )
            if space is MemorySpace.REG:
                _check_layouts_fit(op, name, spaced)


def _check_layouts_fit(op: ir.Operation, name: str, values: list[ir.Value]) -> None:
    """A register layout made for another shape would fail mid-rewrite: refuse it now."""
    for index, (value, attr) in enumerate(zip(values, ir.ArrayAttr(op.attributes[name]))):
        shape = tuple(ir.VectorType(value.type).shape)
        if not _fits(attr, shape):
            raise SmaltiValueError(
                "SM201",
                f"{op.name} has {name}[{index}] = {attr}, which cannot hold a "
                f"vector of shape {shape}",
                op=op, values={name: str(op.attributes[name])},
                fix=["run smalti.infer_layouts(module) before lowering",
                     f"or set {name}[{index}] to a layout for shape {shape}"],
            )


@per_context  # a kernel repeats a few layouts, and parsing one is slow
def _fits(attr: ir.Attribute, shape: tuple[int, ...]) -> bool:
    """Whether ``attr`` is a register layout for vectors of ``shape``."""
    try:
        layout = mgpu_layouts.from_layout_attr(attr)
    except Exception:  # not a register layout at all
        return False
    return layout is not None and register_layout_fits(shape, layout)


def _launch_op(module: ir.Module) -> gpu.LaunchOp:
    for op in module.body.operations:
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if isinstance(inner.opview, gpu.LaunchOp):
                        return inner.opview
    raise SmaltiValueError(
        "SM202", "gpu.launch op not found: this is not a Mosaic GPU kernel module",
        fix="build the module with jax.experimental.mosaic.gpu or Pallas")


def _make_context(module: ir.Module, launch_context: lc.LaunchContext, auto_barriers: bool,
                  arch: tuple[int, int], lower_op) -> LoweringContext:
    launch = _launch_op(module)
    smem_size = launch.dynamicSharedMemorySize
    if smem_size is None or not isinstance(smem_size.owner.opview, arith.ConstantOp):
        raise SmaltiValueError(
            "SM202", "the kernel's dynamic shared memory size is not a constant",
            op=launch, fix="build the module with jax.experimental.mosaic.gpu or Pallas")
    with ir.InsertionPoint.at_block_begin(launch.regions[0].blocks[0]):
        # The order of these ops is part of the output: keep it.
        i32 = ir.IntegerType.get_signless(32)
        single_warp = arith.cmpi(
            arith.CmpIPredicate.eq, mgpu_utils.warp_idx(sync=False), mgpu_utils.c(0, i32)
        )
        per_warp = mgpu_utils.single_thread_predicate(scope=mgpu_utils.ThreadSubset.WARP)
        per_warpgroup = mgpu_utils.single_thread_predicate(
            scope=mgpu_utils.ThreadSubset.WARPGROUP)
        per_block = mgpu_utils.single_thread_predicate(scope=mgpu_utils.ThreadSubset.BLOCK)
    return LoweringContext(
        launch_context,
        single_thread_per_warp_predicate=per_warp,
        single_thread_per_warpgroup_predicate=per_warpgroup,
        single_thread_per_block_predicate=per_block,
        single_warp_per_block_predicate=single_warp,
        auto_barriers=auto_barriers,
        smem_requested_bytes=ir.IntegerAttr(smem_size.owner.opview.value).value,
        arch=arch,
        lower_op=lower_op,
    )


def lower(module: ir.Module, launch_context: lc.LaunchContext, *, auto_barriers: bool = True,
          arch: tuple[int, int] | None = None, pipeline: Pipeline | None = None,
          strict_arch: bool | None = None) -> LoweringReport:
    """Lowers ``module`` in place, like ``mgpu.lower_mgpu_dialect``.

    Everything that can be checked is checked before the first op is
    rewritten: a rule for every op, and the layout attributes of every op
    that needs them. An op none of whose rules supports ``arch`` is lowered
    by the nearest rule with a warning, like jax, which does not check the
    architecture; ``strict_arch`` (default: the ``SMALTI_STRICT_ARCH``
    environment variable) makes it an error, SM002 (see
    :mod:`smalti.arch_policy`).
    """
    start = time.perf_counter()
    pipeline = pipeline or default_pipeline()
    target = cast(Arch, tuple(arch)) if arch is not None else module_arch(module)
    module.context.append_dialect_registry(mlir_interpreter.upstream_dialects)
    module.context.load_all_available_dialects()
    lowerer = _Lowerer(module, pipeline, target, arch_policy.strict(strict_arch))
    with module.context, ir.Location.unknown(module.context):
        try:
            lowerer.run(launch_context, auto_barriers)
        finally:
            # The context refers back to the lowerer (ctx.lower_op): leave no
            # cycle holding the lowerer until a collection.
            lowerer.ctx = None
    lowerer.report.seconds = time.perf_counter() - start
    return lowerer.report
