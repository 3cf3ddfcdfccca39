"""smalti against jax's own Mosaic GPU pipeline, in one process and one run.

    .venv/bin/python benchmarks/run.py            # everything (jax up to 4,000 vector ops)
    .venv/bin/python benchmarks/run.py --quick    # small sizes only
    .venv/bin/python benchmarks/run.py --jax-max 8000

Prints, for synthetic kernels of growing size (250 to 8,000 vector ops: the
unrolled WGMMA pipeline, whose vector ops are its WGMMAs, has about three
times as many ops in all) and for the official Pallas
kernels shipped with jax, the time of layout inference (and lowering) by
smalti and by jax, their ratio, and the cost of merely walking the module
through the MLIR Python bindings; for the unrolled WGMMA pipeline also a
floor (walking it, reading what inference reads and writing what it writes);
then the cost of building a pipeline. jax's inference is the reference and
may be called here (never in smalti).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, scf, vector
from jax._src.lib.mlir.dialects import math as mlir_math
from jax.experimental.mosaic import gpu as jax_mgpu  # the reference
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

import smalti
from smalti import kernels
from smalti.layouts import ATTRIBUTE_NAMES

Body = Callable[..., None]
SHAPE = jax.ShapeDtypeStruct((128, 128), jnp.float32)


def _splat(like: ir.Value, value: float) -> ir.Value:
    ty = ir.VectorType(like.type)
    return arith.constant(ty, ir.DenseElementsAttr.get_splat(
        ty, ir.FloatAttr.get(ty.element_type, value)))


def chain(n: int) -> Body:
    """exp / add-a-constant, alternating: one long dependency chain."""
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        two = _splat(x, 2.0)
        for i in range(n):
            x = arith.addf(x, two) if i % 2 else mlir_math.exp(x)
        mgpu.vector_store(x, out_ref)
    return body


def diamonds(n: int) -> Body:
    """Repeated fork/join: a -> (exp a, tanh a) -> max -> ... (4 ops per diamond)."""
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        for _ in range(max(1, n // 4)):
            left, right = mlir_math.exp(x), mlir_math.tanh(x)
            x = arith.mulf(arith.maximumf(left, right), left)
        mgpu.vector_store(x, out_ref)
    return body


def wgmma_layout_chain(n: int) -> Body:
    """A chain pinned to the WGMMA layout by a cast, with splat constants."""
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.layout_cast(mgpu.vector_load(x_ref), mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT))
        for i in range(n):
            x = arith.mulf(x, _splat(x, 1.0 + i % 3)) if i % 2 else arith.negf(x)
        mgpu.vector_store(x, out_ref)
    return body


def _wgmma(x: ir.Value) -> ir.Value:
    return mgpu.layout_cast(x, mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT))


def reductions(n: int) -> Body:
    """Row sums broadcast back and subtracted, WGMMA layout: ``n // 5`` steps of
    three ops (the zero accumulator folds into one splat constant that every
    step shares), so about ``0.6 n`` ops in all (4,000 -> 2,439)."""
    def body(ctx, x_ref, out_ref, smem):
        x = _wgmma(mgpu.vector_load(x_ref))
        f32 = ir.F32Type.get()
        rows = ir.VectorType.get([128], f32)
        for _ in range(max(1, n // 5)):
            zero = vector.broadcast(rows, arith.constant(f32, 0.0))
            total = vector.MultiDimReductionOp(vector.CombiningKind.ADD, x, zero, [1]).result
            back = mgpu.broadcast_in_dim(x.type, total, [0])
            x = arith.subf(x, back)
        mgpu.vector_store(x, out_ref)
    return body


def loops(n: int) -> Body:
    """scf.for loops carrying a vector, 8 elementwise ops per loop body."""
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        index = ir.IndexType.get()
        for _ in range(max(1, n // 10)):
            loop = scf.ForOp(arith.constant(index, 0), arith.constant(index, 4),
                             arith.constant(index, 1), [x])
            with ir.InsertionPoint(loop.body):
                [y] = loop.inner_iter_args
                for i in range(8):
                    y = arith.addf(y, _splat(y, 1.0)) if i % 2 else mlir_math.exp(y)
                scf.yield_([y])
            x = loop.results[0]
        mgpu.vector_store(x, out_ref)
    return body


SYNTHETIC: dict[str, Callable[[int], Body]] = {
    "elementwise chain": chain,
    "diamonds": diamonds,
    "WGMMA-cast chain": wgmma_layout_chain,
    "reductions+broadcast": reductions,
    "scf.for loops": loops,
}


def count_ops(module: ir.Module) -> int:
    def visit(op: ir.Operation) -> int:
        return 1 + sum(visit(child.operation) for region in op.regions
                       for block in region.blocks for child in block.operations)
    return sum(visit(op.operation) for op in module.body.operations)


def read_ops(module: ir.Module) -> int:
    """Walks the module reading what inference must read of every op: its
    name and the types of its operands and results."""
    count = 0
    stack = [op.operation for op in module.body.operations]
    while stack:
        op = stack.pop()
        count += 1
        _ = op.name
        for value in op.operands:
            _ = value.type
        for value in op.results:
            _ = value.type
        for region in op.regions:
            for block in region.blocks:
                stack.extend(child.operation for child in block.operations)
    return count


def read_and_infer_times(make_module: Callable[[], ir.Module], repeat: int
                         ) -> tuple[float, float, float]:
    """The fastest of ``repeat`` read walks and of ``repeat`` inferences by
    smalti, each on a fresh copy of the kernel, taken in turns so that both
    see the same (shared, noisy) machine; and smalti's time over the read
    walk's, turn by turn (see :func:`ratio_by_turns`)."""
    reads, infers = [], []
    for _ in range(repeat):
        module = make_module()
        start = time.perf_counter()
        read_ops(module)
        reads.append(time.perf_counter() - start)
        module = make_module()
        start = time.perf_counter()
        smalti.infer_layouts(module)
        infers.append(time.perf_counter() - start)
    return min(reads), min(infers), ratio_by_turns(infers, reads)


def in_order_of_turn[T](turn: int, first: T, second: T) -> tuple[T, T]:
    """Two runs of a turn, each first in every other turn: neither always
    runs right after the other's garbage."""
    return (first, second) if turn % 2 == 0 else (second, first)


def ratio_by_turns(numerators: list[float], denominators: list[float]) -> float:
    """The median, over turns, of one turn's time over the other's.

    The fastest of each (``min(numerators) / min(denominators)``) pairs
    times taken at different moments: where the machine's speed drifts
    within a run (this one's does, by tens of percent over seconds), a
    lucky read walk in a fast moment and an inference in a slower one set
    the ratio. Two runs of one turn are taken a few milliseconds apart, at
    one speed; the median leaves out the turns one of whose runs was hit."""
    return statistics.median(n / d for n, d in zip(numerators, denominators, strict=True))


def timed(fn: Callable[[], object], repeat: int = 1) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def jax_infer(kernel: kernels.Kernel) -> None:
    with kernel.context, ir.Location.unknown(kernel.context):
        jax_mgpu.infer_layout(kernel.module)


def jax_lower(kernel: kernels.Kernel) -> None:
    with kernel.context, ir.Location.unknown(kernel.context):
        jax_mgpu.lower_mgpu_dialect(kernel.module, kernel.launch_context)


def row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))


WIDTHS = [20, 6, 8, 8, 9, 9, 8, 8, 8, 9]
HEADER = ["kernel", "ops", "walk s", "read s", "smalti s", "jax s", "jax/sm", "sm/walk",
          "sm/read", "by turns"]


def synthetic(sizes: list[int], jax_max: int, repeat: int) -> None:
    print(row(HEADER, WIDTHS))
    for name, make in SYNTHETIC.items():
        for n in sizes:
            body = make(n)
            kernel = kernels.build_kernel(body, [SHAPE], [SHAPE])
            ops = count_ops(kernel.module)
            walk = min(timed(lambda: count_ops(kernel.module)) for _ in range(3))
            read, ours, by_turns = read_and_infer_times(
                lambda: kernels.build_kernel(body, [SHAPE], [SHAPE]).module, repeat)
            if n <= jax_max:
                reference = kernels.build_kernel(body, [SHAPE], [SHAPE])
                theirs = timed(lambda: jax_infer(reference))
                jax_cells = [f"{theirs:.3f}", f"{theirs / ours:.0f}x"]
            else:
                jax_cells = ["-", "-"]
            print(row([name, str(ops), f"{walk:.4f}", f"{read:.4f}", f"{ours:.4f}", *jax_cells,
                       f"{ours / walk:.1f}x", f"{ours / read:.1f}x", f"{by_turns:.1f}x"],
                      WIDTHS))
        growth(lambda n: kernels.build_kernel(make(n), [SHAPE], [SHAPE]).module, sizes, repeat)


def growth(make_module: Callable[[int], ir.Module], sizes: list[int], repeat: int) -> None:
    """smalti's time on the largest kernel over its time on the one nearest
    1,000, the fastest of ``repeat`` runs of each, taken in turns (two rows
    of the table may come from faster or slower moments of a shared
    machine)."""
    small, large = min(sizes, key=lambda n: abs(n - 1000)), max(sizes)
    if large <= small:
        return
    times: dict[int, list[float]] = {small: [], large: []}
    ops = {}
    for _ in range(repeat):
        for n in (small, large):
            module = make_module(n)
            ops[n] = count_ops(module)
            start = time.perf_counter()
            smalti.infer_layouts(module)
            times[n].append(time.perf_counter() - start)
    ratio = min(times[large]) / min(times[small])
    by_turns = ratio_by_turns(times[large], times[small])
    print(f"  growth: {ops[large] / ops[small]:.1f}x ops ({ops[small]} -> {ops[large]}) -> "
          f"{ratio:.1f}x smalti time (fastest of {repeat} each, in turns; {by_turns:.1f}x "
          "by turns)")


def _unrolled_wgmma_text(steps: int) -> str:
    """A Pallas kernel issuing ``steps`` WGMMAs on double-buffered SMEM, as
    the module smalti receives before inference (textual)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    import smalti.jax

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, barrier):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, barrier)
        plgpu.barrier_wait(barrier)
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, barrier)
        plgpu.barrier_wait(barrier)

        def scope(acc):
            for i in range(steps):
                plgpu.wgmma(acc, a_smem.at[i % 2], b_smem.at[i % 2])
                plgpu.wgmma_wait(1)
            plgpu.wgmma_wait(0)
            return acc[...]

        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((64, 128), jnp.float32))

    f16 = jnp.float16
    call = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((64, 128), jnp.float32),
        scratch_types=[plgpu.SMEM((2, 64, 64), f16), plgpu.SMEM((2, 64, 128), f16),
                       plgpu.Barrier()],
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup))
    texts: list[str] = []
    original = smalti.jax.infer_layouts

    def grab(module, **kw):
        texts.append(module.operation.get_asm(enable_debug_info=False))
        return original(module, **kw)

    smalti.jax.infer_layouts = grab
    try:
        with smalti.jax.installed():
            jax.clear_caches()
            jax.jit(call).trace(jax.ShapeDtypeStruct((2, 64, 64), f16),
                                jax.ShapeDtypeStruct((2, 64, 128), f16)
                                ).lower(lowering_platforms=("cuda",))
    finally:
        smalti.jax.infer_layouts = original
    return texts[0]


def unrolled_wgmma(sizes: list[int], jax_max: int, repeat: int) -> None:
    """Inference only, on the text of an unrolled WGMMA pipeline of ``n``
    WGMMAs for each size ``n``: sized by its vector ops like the kernels
    above (each WGMMA comes with two inline-asm ops, which hold none)."""
    print(f"unrolled WGMMA: n WGMMAs (its vector ops) for n in {sizes}, about 3n ops in all")
    texts: dict[int, str] = {}
    floor_size = max((n for n in sizes if n <= jax_max), default=None)
    for n in sizes:
        text = texts[n] = _unrolled_wgmma_text(n)
        ours_module = ir.Module.parse(text, kernels.make_context())
        ops = count_ops(ours_module)
        walk = min(timed(lambda: count_ops(ours_module)) for _ in range(3))
        read, ours, by_turns = read_and_infer_times(
            lambda: ir.Module.parse(text, kernels.make_context()), repeat)
        jax_cells = ["-", "-"]
        if n <= jax_max:
            context = kernels.make_context()
            theirs_module = ir.Module.parse(text, context)
            with context, ir.Location.unknown(context):
                theirs = timed(lambda: jax_mgpu.infer_layout(theirs_module))
            jax_cells = [f"{theirs:.3f}", f"{theirs / ours:.0f}x"]
        print(row(["unrolled WGMMA", str(ops), f"{walk:.4f}", f"{read:.4f}", f"{ours:.4f}",
                   *jax_cells, f"{ours / walk:.1f}x", f"{ours / read:.1f}x",
                   f"{by_turns:.1f}x"], WIDTHS))
        if n == floor_size:
            floor = min(floor_times(text, repeat))
            print(f"  floor at {ops} ops (MLIR's walk, every op's name and operand and result "
                  f"types read, the inferred attributes written): {floor:.4f} s; "
                  f"100x jax: {theirs / 100:.4f} s")
    growth(lambda n: ir.Module.parse(texts[n], kernels.make_context()), sizes, repeat)


ATTRIBUTES = [name for pair in ATTRIBUTE_NAMES.values() for name in pair]


def floor_times(text: str, repeat: int) -> list[float]:
    """What any inference of the module in ``text`` must at least do through
    the bindings, timed ``repeat`` times on fresh copies: walk it with MLIR's
    own walk, read each op's name and operand and result types, and write
    the attributes smalti's inference gives it (recorded once, beforehand,
    and made anew in each copy's context before the clock starts)."""
    inferred = ir.Module.parse(text, kernels.make_context())
    smalti.infer_layouts(inferred)
    written: list[list[tuple[str, str]]] = []

    def record(op: ir.Operation) -> ir.WalkResult:
        attributes = op.attributes
        written.append([(name, str(attributes[name])) for name in ATTRIBUTES
                        if name in attributes])
        return ir.WalkResult.ADVANCE

    for top in inferred.body.operations:
        top.operation.walk(record, ir.WalkOrder.PRE_ORDER)

    def read_and_write(module: ir.Module, plan: list[list[tuple[str, ir.Attribute]]]) -> None:
        writes = iter(plan)

        def visit(op: ir.Operation) -> ir.WalkResult:
            _ = op.name
            operands, results = op.operands, op.results
            for index in range(len(operands)):
                _ = operands[index].type
            for index in range(len(results)):
                _ = results[index].type
            attributes = op.attributes
            for name, attribute in next(writes):
                attributes[name] = attribute
            return ir.WalkResult.ADVANCE

        for top in module.body.operations:
            top.operation.walk(visit, ir.WalkOrder.PRE_ORDER)

    times = []
    for _ in range(repeat):
        context = kernels.make_context()
        module = ir.Module.parse(text, context)
        made = {printed: ir.Attribute.parse(printed, context)
                for writes in written for _, printed in writes}
        plan = [[(name, made[printed]) for name, printed in writes] for writes in written]
        start = time.perf_counter()
        read_and_write(module, plan)
        times.append(time.perf_counter() - start)
    return times


def lowering(n: int, repeat: int = 4) -> None:
    """Lowering after inference, smalti's and jax's in turns on fresh kernels,
    each first in every other turn (the fastest of ``repeat`` each)."""
    print("\nlowering (after inference), elementwise chain:")
    body = chain(n)
    ours_times: list[float] = []
    jax_times: list[float] = []
    for turn in range(repeat):
        ours, theirs = (kernels.build_kernel(body, [SHAPE], [SHAPE]) for _ in range(2))
        smalti.infer_layouts(ours.module)
        jax_infer(theirs)
        for times, run in in_order_of_turn(
                turn, (ours_times, lambda: smalti.lower(ours.module, ours.launch_context)),
                (jax_times, lambda: jax_lower(theirs))):
            times.append(timed(run))
    sm, jx = min(ours_times), min(jax_times)
    print(f"  {count_ops(theirs.module)} ops after lowering: smalti {sm:.3f} s, jax {jx:.3f} s, "
          f"ratio smalti/jax {sm / jx:.2f} (fastest of {repeat} each, in turns, each first in "
          f"every other turn; {ratio_by_turns(ours_times, jax_times):.2f} by turns)")


@contextlib.contextmanager
def wrapped_calls(module: object, names: tuple[str, ...],
                  around: Callable[[str, Callable], Callable]) -> Iterator[None]:
    """Replaces the functions ``names`` of ``module`` by ``around(name,
    function)`` for the duration (the compilers call them through their
    modules' attributes)."""
    originals = {name: getattr(module, name) for name in names}
    for name, fn in originals.items():
        setattr(module, name, around(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)


def _timing(module: object, names: tuple[str, ...], times: dict[str, list[float]]
            ) -> contextlib.AbstractContextManager[None]:
    """Records the run times of the functions ``names`` of ``module``."""
    def around(name: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times.setdefault(name, []).append(time.perf_counter() - start)
        return call

    return wrapped_calls(module, names, around)


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic garbage collection during the run, as ``timeit`` times (the
    collector's previous state restored after)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def collector_kept_out() -> Iterator[None]:
    """The garbage left by earlier runs collected first, and no collection
    during the run: where one falls decides a run's time more than either
    compiler's work does (measured on attention's lowering: jax's fastest
    runs were those that no collection hit)."""
    gc.collect()
    with collection_paused():
        yield


@contextlib.contextmanager
def targeting(arch: tuple[int, int]) -> Iterator[None]:
    """Pallas lowers for a GPU of compute capability ``arch`` on this
    machine, which has none: the device's core count and arch are stubbed."""
    import types

    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jax.extend import backend

    saved = (backend.get_default_device, mgpu_utils._infer_arch)
    device = types.SimpleNamespace(core_count=132)
    backend.get_default_device = lambda: device
    mgpu_utils._infer_arch = lambda: arch
    try:
        yield
    finally:
        backend.get_default_device, mgpu_utils._infer_arch = saved


def lower_for_cuda(fn: Callable, args: tuple) -> None:
    """Compiles ``fn`` for CUDA, up to the lowered module (from scratch
    after ``jax.clear_caches()``)."""
    jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))


def official_cases() -> list[tuple[str, Callable, tuple, tuple[int, int]]]:
    from jax.experimental.pallas.ops.gpu import attention_mgpu as attention
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as matmul
    from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mixed

    f16, s8, bf16 = jnp.float16, jnp.int8, jnp.bfloat16
    mm = matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4)
    mx = mixed.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4)
    at = attention.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2)
    q = jax.ShapeDtypeStruct((1, 1024, 4, 128), f16)
    cases = [
        ("hopper_matmul_mgpu", lambda a, b: matmul.matmul(a, b, None, mm),
         (jax.ShapeDtypeStruct((1024, 1024), f16),) * 2, (9, 0)),
        ("hopper_mixed_type_matmul_mgpu",
         lambda a, b: mixed.mixed_matmul_kernel(a, b, out_dtype=bf16, config=mx),
         (jax.ShapeDtypeStruct((1024, 1024), s8), jax.ShapeDtypeStruct((1024, 1024), bf16)),
         (9, 0)),
        ("attention_mgpu (pipeline emitter)",
         lambda q, k, v: attention.attention_with_pipeline_emitter(q, k, v, at), (q, q, q),
         (9, 0)),
    ]
    try:
        from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu as bw
        config = bw.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2,
                                 collective=False)
        cases.append(("blackwell_matmul_mgpu", lambda a, b: bw.matmul_kernel(a, b, config),
                      (jax.ShapeDtypeStruct((1024, 1024), f16),) * 2, (10, 0)))
    except (ImportError, AttributeError, TypeError):
        pass
    return cases


def official_kernels(repeat: int) -> None:
    from jax.experimental.mosaic.gpu import dialect_lowering as jax_lowering  # reference
    from jax.experimental.mosaic.gpu import layout_inference as jax_inference  # reference

    import smalti.jax

    print(f"\nofficial Pallas kernels (fastest of {repeat} lowerings each, smalti's and jax's "
          "in turns, each first\nin every other turn, the garbage collector kept out of both; "
          "by turns: the median of\nsmalti's lowering over jax's in each turn; ops = "
          "Warpgroup ops before inference):")
    widths = [34, 6, 10, 10, 8, 10, 10, 8, 9]
    print(row(["kernel", "ops", "sm infer", "jax infer", "jax/sm", "sm lower", "jax lower",
               "sm/jax", "by turns"], widths))
    for name, fn, args, arch in official_cases():
        with targeting(arch):
            ours: dict[str, list[float]] = {}
            theirs: dict[str, list[float]] = {}
            sizes: list[int] = []
            original_infer = smalti.jax.infer_layouts

            def counting(module, **kw):
                sizes.append(count_ops(module))
                return original_infer(module, **kw)

            def run_jax() -> None:
                jax.clear_caches()
                with collector_kept_out(), \
                        _timing(jax_inference, ("infer_layout",), theirs), \
                        _timing(jax_lowering, ("lower_mgpu_dialect",), theirs):
                    lower_for_cuda(fn, args)

            def run_smalti() -> None:
                jax.clear_caches()
                smalti.jax.infer_layouts = counting
                try:
                    with collector_kept_out(), smalti.jax.installed(), \
                            _timing(smalti.jax, ("infer_layouts", "lower"), ours):
                        lower_for_cuda(fn, args)
                finally:
                    smalti.jax.infer_layouts = original_infer

            try:
                for turn in range(repeat):
                    for run_one in in_order_of_turn(turn, run_smalti, run_jax):
                        run_one()
            except Exception as e:  # a kernel smalti cannot compile yet
                print(f"  {name}: not measured ({type(e).__name__}: {str(e).splitlines()[0]})")
                continue
            # The fastest run of each: the least disturbed by other jobs.
            best = {k: min(v) for k, v in (ours | theirs).items()}
            si, ji = best["infer_layouts"], best["infer_layout"]
            sl, jl = best["lower"], best["lower_mgpu_dialect"]
            lowering_by_turns = ratio_by_turns(ours["lower"], theirs["lower_mgpu_dialect"])
            print(row([name, str(sizes[0]), f"{si * 1e3:.1f} ms", f"{ji * 1e3:.1f} ms",
                       f"{ji / si:.1f}x", f"{sl * 1e3:.1f} ms", f"{jl * 1e3:.1f} ms",
                       f"{sl / jl:.2f}", f"{lowering_by_turns:.2f}"], widths))


def pipeline_cost() -> None:
    from importlib.metadata import entry_points

    from smalti.pipeline import BLOCK_ENV

    # Plugins of other distributions (the example plugin, in a test
    # environment) are blocked: the figure is that of the built-in ones.
    others = sorted(ep.name for ep in entry_points(group="smalti")
                    if ep.dist is None or ep.dist.name != "smalti")
    left_out = f"; left out: {', '.join(others)}" if others else ""
    print(f"\nbuilding a pipeline (all built-in plugins{left_out}):")
    build = timed(lambda: smalti.build_pipeline(block=others), repeat=5)
    print(f"  build_pipeline() in a warm process: {build * 1000:.1f} ms")
    code = ("import time, jax, jax.experimental.mosaic.gpu;"
            "t = time.perf_counter(); import smalti; i = time.perf_counter();"
            "smalti.build_pipeline(); print(i - t, time.perf_counter() - i)")
    # As a user's process does: with bytecode caches. The first run writes
    # them; of the others, the fastest.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env[BLOCK_ENV] = ",".join(others)
    runs = [subprocess.check_output([sys.executable, "-c", code], text=True, env=env)
            for _ in range(6)][1:]
    importing, building = min((tuple(map(float, run.split())) for run in runs), key=sum)
    print(f"  fresh process, jax already imported (fastest of {len(runs)}): import smalti "
          f"{importing * 1000:.1f} ms + build_pipeline() {building * 1000:.1f} ms = "
          f"{(importing + building) * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--jax-max", type=int, default=4000,
                        help="largest kernel (in vector ops) to run jax's quadratic inference on")
    parser.add_argument("--repeat", type=int, default=9,
                        help="read walks and smalti runs per synthetic kernel, in turns "
                        "(the fastest of each is shown)")
    args = parser.parse_args()
    sizes = [250, 500, 1000] if args.quick else [250, 500, 1000, 2000, 4000, 8000]
    print(f"smalti {smalti.__version__} vs jax {jax.__version__}\n")
    print("walk: visiting every op through the bindings; read: also reading its name and\n"
          "operand and result types (what any inference must read); read and smalti:\n"
          f"fastest of {args.repeat} runs each, in turns, on fresh copies of the kernel\n"
          "(sm/read: the fastest over the fastest; by turns: the median of smalti over\n"
          "the read walk in each turn, which the machine's drifts within a run move less);\n"
          "jax: one run\n")
    synthetic(sizes, args.jax_max, args.repeat)
    unrolled_wgmma(sizes, args.jax_max, args.repeat)
    lowering(250 if args.quick else 1000)
    official_kernels(3 if args.quick else 7)
    pipeline_cost()


if __name__ == "__main__":
    main()
