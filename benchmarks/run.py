"""smalti against jax's own Mosaic GPU pipeline, in one process and one run.

    .venv/bin/python benchmarks/run.py            # everything (jax up to 4,000 ops)
    .venv/bin/python benchmarks/run.py --quick    # small sizes only
    .venv/bin/python benchmarks/run.py --jax-max 8000

Prints, for synthetic kernels of growing size and for the official Pallas
kernels shipped with jax, the time of layout inference (and lowering) by
smalti and by jax, their ratio, and the cost of merely walking the module
through the MLIR Python bindings; then the cost of building a pipeline.
jax's inference is the reference and may be called here (never in smalti).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, math as mlir_math
from jax.experimental.mosaic import gpu as jax_mgpu  # the reference
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

import smalti
from smalti import kernels

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


SYNTHETIC: dict[str, Callable[[int], Body]] = {
    "elementwise chain": chain,
    "diamonds": diamonds,
    "WGMMA-cast chain": wgmma_layout_chain,
}


def count_ops(module: ir.Module) -> int:
    def visit(op: ir.Operation) -> int:
        return 1 + sum(visit(child.operation) for region in op.regions
                       for block in region.blocks for child in block.operations)
    return sum(visit(op.operation) for op in module.body.operations)


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


def synthetic(sizes: list[int], jax_max: int) -> None:
    widths = [20, 6, 9, 10, 10, 9, 11]
    print(row(["kernel", "ops", "walk s", "smalti s", "jax s", "jax/sm", "sm/walk"], widths))
    for name, make in SYNTHETIC.items():
        base = None
        for n in sizes:
            body = make(n)
            kernel = kernels.build_kernel(body, [SHAPE], [SHAPE])
            ops = count_ops(kernel.module)
            walk = timed(lambda: count_ops(kernel.module), repeat=3)
            ours = timed(lambda: smalti.infer_layouts(kernel.module))
            base = base or (n, ours)
            if n <= jax_max:
                reference = kernels.build_kernel(body, [SHAPE], [SHAPE])
                theirs = timed(lambda: jax_infer(reference))
                jax_cells = [f"{theirs:.3f}", f"{theirs / ours:.0f}x"]
            else:
                jax_cells = ["-", "-"]
            print(row([name, str(ops), f"{walk:.4f}", f"{ours:.4f}", *jax_cells,
                       f"{ours / walk:.1f}x"], widths))
        last = (n, ours)
        print(f"  growth: {last[0] // base[0]}x ops -> {last[1] / base[1]:.1f}x smalti time")


def lowering(n: int) -> None:
    print("\nlowering (after inference), elementwise chain:")
    body = chain(n)
    ours, theirs = (kernels.build_kernel(body, [SHAPE], [SHAPE]) for _ in range(2))
    smalti.infer_layouts(ours.module)
    jax_infer(theirs)
    sm = timed(lambda: smalti.lower(ours.module, ours.launch_context))
    jx = timed(lambda: jax_lower(theirs))
    print(f"  {count_ops(theirs.module)} ops after lowering: smalti {sm:.3f} s, jax {jx:.3f} s, "
          f"ratio smalti/jax {sm / jx:.2f}")


def official_kernels() -> None:
    print("\nofficial Pallas kernels (inference + lowering through smalti.jax.installed()):")
    print("  hopper_matmul_mgpu, hopper_mixed_type_matmul_mgpu, blackwell_matmul_mgpu, "
          "attention: need the Hopper and Blackwell plugins' TMA/WGMMA/tcgen05 rules, "
          "which are not written yet: not measured.")


def pipeline_cost() -> None:
    print("\nbuilding a pipeline (all built-in plugins):")
    build = timed(lambda: smalti.build_pipeline(), repeat=5)
    print(f"  build_pipeline() in a warm process: {build * 1000:.1f} ms")
    code = ("import time, jax, jax.experimental.mosaic.gpu;"
            "t = time.perf_counter(); import smalti; smalti.build_pipeline();"
            "print(time.perf_counter() - t)")
    cold = float(subprocess.check_output([sys.executable, "-c", code], text=True).strip())
    print(f"  import smalti + build_pipeline() once jax is imported (fresh process): "
          f"{cold * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--jax-max", type=int, default=4000,
                        help="largest kernel to run jax's quadratic inference on")
    args = parser.parse_args()
    sizes = [250, 500, 1000] if args.quick else [250, 500, 1000, 2000, 4000, 8000]
    print(f"smalti {smalti.__version__} vs jax {jax.__version__}\n")
    synthetic(sizes, args.jax_max)
    lowering(250 if args.quick else 1000)
    official_kernels()
    pipeline_cost()


if __name__ == "__main__":
    main()
