"""Runs jax's official Pallas Hopper kernels compiled by jax and by smalti on a
real GPU, and compares their results and run times. Not part of the test
suite (it needs a Hopper GPU):

    .venv/bin/python scripts/gpu_check.py [--iterations 20]

For each kernel and configuration it prints the largest difference between
the two results (they should be bit-identical: smalti emits the same module)
and the median run time of each.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as matmul
from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mixed

import smalti.jax

Dim = matmul.MatmulDimension


def cases(size: int = 4096) -> list[tuple[str, Callable, tuple]]:
    """(name, function, inputs) for each kernel configuration checked."""
    key_a, key_b = jax.random.split(jax.random.key(0))
    m, k, n = size, size, 2 * size
    a16 = jax.random.uniform(key_a, (m, k), jnp.float16)
    b16 = jax.random.uniform(key_b, (k, n), jnp.float16)
    a8 = jax.random.randint(key_a, (m, k), -128, 127, jnp.int8)
    bbf = jax.random.uniform(key_b, (k, n), jnp.bfloat16)
    found = []
    for tile_m, tile_n, wg, cluster in [(128, 128, Dim.N, None), (256, 128, Dim.M, None),
                                        (128, 256, Dim.N, Dim.M), (128, 128, Dim.N, Dim.N)]:
        config = matmul.TuningConfig(tile_m=tile_m, tile_n=tile_n, tile_k=64,
                                     max_concurrent_steps=2 if tile_m * tile_n > 128 * 128 else 4,
                                     grid_tile_width=8,
                                     wg_dimension=wg, cluster_dimension=cluster)
        name = f"hopper_matmul f16 {tile_m}x{tile_n} wg={wg} cluster={cluster}"
        found.append((name, lambda a, b, c=config: matmul.matmul(a, b, None, c), (a16, b16)))
    config = mixed.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4)
    found.append(("hopper_mixed_type_matmul s8 x bf16 128x128",
                  lambda a, b: mixed.mixed_matmul_kernel(a, b, out_dtype=jnp.bfloat16,
                                                         config=config), (a8, bbf)))
    return found


def run(fn: Callable, args: tuple, iterations: int) -> tuple[np.ndarray, float]:
    jax.clear_caches()
    compiled = jax.jit(fn).lower(*args).compile()
    out = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return np.asarray(out.astype(jnp.float32)), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--size", type=int, default=4096, help="M = K = size, N = 2 * size")
    args = parser.parse_args()
    print(f"device: {jax.devices()[0].device_kind}")
    print(f"{'kernel':58} {'max |diff|':>10} {'jax ms':>8} {'smalti ms':>10}")
    for name, fn, inputs in cases(args.size):
        by_jax, jax_time = run(fn, inputs, args.iterations)
        with smalti.jax.installed():
            by_smalti, smalti_time = run(fn, inputs, args.iterations)
        diff = float(np.max(np.abs(by_jax - by_smalti)))
        print(f"{name:58} {diff:10.3g} {jax_time * 1e3:8.3f} {smalti_time * 1e3:10.3f}")


if __name__ == "__main__":
    main()
