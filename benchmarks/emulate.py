"""How fast the emulator runs lowered kernels, with and without its
synchronization checker, next to jax's own GPU interpret mode.

One line per kernel: kernels jax lowers (elementwise, TMA + swizzle,
reductions, grids, WGMMA, a warp-specialized pipeline, a TMA gather,
clusters of 2 and 4 blocks), jax's official Pallas Hopper kernels in their
smallest configurations (``hopper_matmul_mgpu``,
``hopper_mixed_type_matmul_mgpu``, ``attention_mgpu``'s forward, backward and
pipeline-emitter kernels, ``ragged_dot_mgpu``), the official Blackwell
matmul (``blackwell_matmul_mgpu``, at arch (10, 0)), and kernels only smalti
lowers. Columns:

* ``ops``, ``lower s``: the lowered module's op count and the time to lower
  it (for jax's kernels: tracing and lowering for CUDA on the CPU);
* ``emulate s``: the first emulation after lowering, with the emulator's
  defaults (as this benchmark always measured it);
* ``(1) emu``: the emulator without its synchronization checker
  (``run_module(..., sanitize=False)``);
* ``(2) +check``: the emulator with it (the default), and ``(2)/(1)``;
* ``(3) jax``: jax's GPU interpret mode
  (``plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams())``);
* ``(4) +races``: the same with ``detect_races=True``, and ``(4)/(2)``;
* ``(5) on_cpu``: the same jitted function as (3) and (4), its kernels run on
  the emulator with the checker (``smalti.emulate.on_cpu``), and ``(4)/(5)``:
  warm calls on both sides -- the first call lowered the kernels and
  compiled them for the emulator once, so a timed call only runs them, as a
  timed call of (4) only interprets;
* ``cold: lower+(2)``, ``(4) 1st call``, ``ratio``: checking a kernel once,
  as a test suite does -- smalti's lowering plus the first checked emulation
  against jax's first call with ``detect_races=True`` (tracing, lowering and
  compiling its interpreter included) -- and jax's over the emulator's.

``emulate s`` includes the emulator's compilation of the module into
closures (the kept programs are dropped first); (1) and (2) are later runs,
which find the program compiled, as a later ``run_module`` of the same
module text does (an emulator without kept programs compiles on every call,
and its (1) and (2) include it); lowering is timed apart. jax's figures are
calls of a ``jax.jit`` function after a first call of the same (in the
same mode), which traced, lowered and compiled it: the timed calls only
interpret the kernel. With ``--repeat N`` each figure
is the fastest of N calls, (1) and (2) taken in turns, each first in every
other turn, and likewise (3) and (4). Every timed run, the lowering
included, runs with Python's cyclic garbage collector off, as ``timeit``
times (a collection of the whole heap, about 0.1 s, would otherwise land
on whichever run crosses its threshold). Where a run fails, its short error
stands in place of the figure (``jax: ...`` for jax's interpret mode,
``emu: ...`` for the emulator); where jax's race detector reports a race, its
figure is marked ``!``. An emulator without the ``sanitize=`` keyword (before
the checker) has no column (2): it prints ``n/a`` there, and (1) is its
plain run. Kernels only smalti lowers have no jax function to interpret.

    .venv/bin/python -m benchmarks.emulate [--quick] [--only TEXT] [--repeat N] [--sample N]
                                           [--workers N]

``--quick`` runs a few of the kernels (a few seconds), for a smoke test;
``--only TEXT`` the kernels whose name contains TEXT; ``--workers N`` sets
how many processes may share a grid's clusters (``SMALTI_EMULATE_WORKERS``;
the checked runs only: see ``smalti.emulate.workers``).

Three more lines run only when ``--only`` names them (``--only "at scale"``):
the official Hopper matmul at the shape of jax's ops tests (4096 x 4096 x
4096, f16), without and with clusters of 2, and with clusters of 2 at the
shape of jax's Pallas ``test_realistic_matmul`` (16896 x 640 x 512; issue
36's stand-in for its clustered variant). The emulator runs the first
``--sample N`` clusters of the grid once without and once with its checker
(default 2; 0: the whole grid), scaled to the whole grid; jax's interpret
mode is not run at that size: its warm ``detect_races`` figure on the same
kernel at its smallest shape, times the ratio of the work (block
tile-steps), stands in as an estimate.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import inspect
import io
import logging
import os
import re
import sys
import time
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as smalti_emulate
from benchmarks.run import collection_paused  # a full collection (~0.1 s) lands on any run
from smalti.emulate import lower, run_module
from smalti.emulate.capture import gpu_facts, lower_for_cuda

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
S = jax.ShapeDtypeStruct

# The emulator's synchronization checker, where this emulator has one.
HAS_CHECKER = "sanitize" in inspect.signature(run_module).parameters
# The execution mode, where this emulator has one.
HAS_ON_CPU = hasattr(smalti_emulate, "on_cpu")


def forget_compiled() -> None:
    """Drops the emulator's kept compiled programs (where it keeps any), so
    the next run compiles its module."""
    try:
        from smalti.emulate.runner import forget_compiled as forget
    except ImportError:  # an emulator that compiles on every call
        return
    forget()


def count_ops(module) -> int:
    n = 0

    def walk(op) -> None:
        nonlocal n
        for region in op.regions:
            for block in region.blocks:
                for o in block.operations:
                    n += 1
                    walk(o.operation)
    walk(module.operation)
    return n


def kernels():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' kernel builders
    from tests.emulate import test_cluster as tc
    from tests.emulate.test_fusion import swizzled_round_trip

    x = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)

    def ew(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = jnp.exp(v) * 2 + jnp.tanh(v) - v * v
    yield "elementwise f32 (128, 128)", plgpu.kernel(ew, out_type=S((128, 128), jnp.float32),
                                                     compiler_params=WG), [x]

    yield "TMA + swizzled SMEM f16 (128, 128)", swizzled_round_trip(), [x.astype(np.float16)]

    def red(x_ref, o_ref):
        o_ref[...] = jnp.sum(plgpu.load(x_ref, layout=plgpu.Layout.WGMMA, optimized=False), axis=1)
    yield "row reduction f32 (128, 128)", plgpu.kernel(red, out_type=S((128,), jnp.float32),
                                                       compiler_params=WG), [x]

    def grid(x_ref, o_ref):
        i = jax.lax.axis_index("i")
        o_ref[pl.ds(i * 128, 128)] = x_ref[pl.ds(i * 128, 128)] * 3 + 1
    big = np.random.default_rng(1).standard_normal((1024, 128)).astype(np.float32)
    yield "8 blocks of (128, 128), f32", plgpu.kernel(
        grid, out_type=S((1024, 128), jnp.float32), compiler_params=WG, grid=(8,),
        grid_names=("i",)), [big]

    t16 = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def mm(a_gmem, b_gmem, o_gmem, a_smem, b_smem, bar):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, bar.at[0])
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, b_smem)
            plgpu.wgmma_wait(0)
            return acc_ref[...]
        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((64, 128), jnp.float32))
    a16 = x[:64].astype(np.float16)
    yield "WGMMA (64, 128) x (128, 128) f16", plgpu.kernel(
        mm, out_type=S((64, 128), jnp.float32), compiler_params=WG,
        scratch_types=[plgpu.SMEM((64, 128), jnp.float16, transforms=t16),
                       plgpu.SMEM((128, 128), jnp.float16, transforms=t16),
                       plgpu.Barrier(num_barriers=2)]), [a16, x.astype(np.float16)]

    def ws(x_gmem, o_gmem):
        def step(_, x_smem, o_smem):
            o_smem[...] = x_smem[...] * 2 + 1
        plgpu.emit_pipeline_warp_specialized(
            step, grid=(8,), memory_registers=40, max_concurrent_steps=2, num_compute_wgs=1,
            wg_axis="wg", in_specs=[pl.BlockSpec((128, 64), lambda i: (0, i))],
            out_specs=[pl.BlockSpec((128, 64), lambda i: (0, i))])(x_gmem, o_gmem)
    wide = np.random.default_rng(2).standard_normal((128, 512)).astype(np.float32)
    yield "warp-specialized pipeline, 8 x (128, 64)", plgpu.kernel(
        ws, out_type=S((128, 512), jnp.float32), compiler_params=WG, num_threads=2,
        thread_name="wg"), [wide]

    def gather(x_gmem, idx_gmem, o_gmem, smem, bar):
        idx = plgpu.load(idx_gmem, layout=plgpu.Layout.TMA_INDICES, optimized=False)
        plgpu.copy_gmem_to_smem(x_gmem.at[idx], smem, bar)
        plgpu.barrier_wait(bar)
        plgpu.copy_smem_to_gmem(smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)
    yield "TMA gather4 of 64 rows, f16", plgpu.kernel(
        gather, out_type=S((64, 128), jnp.float16), compiler_params=WG,
        scratch_types=[plgpu.SMEM((64, 128), jnp.float16), plgpu.Barrier()]), \
        [x.astype(np.float16), np.arange(64, dtype=np.int32)[::-1] * 2]

    x4 = np.random.default_rng(4).standard_normal((3, 2, 64, 64)).astype(np.float16)
    yield "3 clusters of 2: st.async exchange (64, 64)", tc.exchange_kernel(), [x4]
    yield "cluster of 4: multicast TMA (64, 64) f16", tc.multicast_kernel(4), [x4[0, 0]]


@contextlib.contextmanager
def cuda_runtime_known(module: types.ModuleType) -> Iterator[None]:
    """``attention_mgpu.attention`` asks the CUDA runtime for its version (only
    its causal variant depends on it): on a machine without CUDA, answer for
    it (13.0) while it traces."""
    saved = module.cuda_versions
    if saved is None:
        module.cuda_versions = types.SimpleNamespace(cuda_runtime_get_version=lambda: 13000)
    try:
        yield
    finally:
        module.cuda_versions = saved


def official_kernels():
    """jax's official Pallas Hopper kernels: the matmuls and the pipeline-emitter
    attention in the smallest configurations the official-kernel tests build
    (``tests/hopper/test_official_kernels.py``; those tests lower no forward or
    backward ``attention`` and no ``ragged_dot``: these take the smallest
    blocks the kernels accept), each on the smallest shapes that give one
    output tile (one block of work; the matmuls' persistent grids still launch
    132 blocks) and more than one pipeline step. Yields (name, jax function,
    its arguments, the inputs of each kernel the function launches, or None
    for a function of one kernel whose inputs are its arguments)."""
    from jax.experimental.pallas.ops.gpu import attention_mgpu as attention
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as matmul
    from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mixed
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu as ragged

    rng = np.random.default_rng(5)

    def normal(shape, dtype=np.float16):
        return rng.standard_normal(shape).astype(dtype)

    # Two consumer warpgroups side by side along N: one (128, 256) output tile.
    mm = matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    a, b = normal((128, 128)), normal((128, 256))
    yield ("hopper_matmul (128, 128) x (128, 256) f16",
           lambda a, b: matmul.matmul(a, b, None, mm), [a, b], None)

    # s8 x f16 (s8 x bf16, with its prmt + sub.bf16x2 dequantizing PTX, is
    # tests/emulate/test_ptx_convert.py's)
    mx = mixed.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    a8 = rng.integers(-8, 8, (128, 128)).astype(np.int8)
    yield ("hopper_mixed_type_matmul s8 x f16",
           lambda a, b: mixed.mixed_matmul_kernel(a, b, out_dtype=jnp.float16, config=mx),
           [a8, b], None)

    # block_q 64 per consumer warpgroup (two of them), two kv steps of 64.
    at = attention.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)
    q, k, v = normal((1, 128, 1, 64)), normal((1, 128, 1, 64)), normal((1, 128, 1, 64))

    def forward(q, k, v):
        with cuda_runtime_known(attention):
            return attention.attention(q, k, v, at)
    yield "attention_mgpu forward (1, 128, 1, 64) f16", forward, [q, k, v], None

    # The backward pass: two kernels (dq, then dk and dv) on q, k, v, do and the
    # forward's residuals (out, lse: the reference's), with delta (rowsum of
    # out * do) computed between, outside the kernels.
    bw = dataclasses.replace(at, block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
    ref_out, (lse,) = attention.attention_reference(q, k, v, save_residuals=True)
    out, lse, do = np.asarray(ref_out).astype(np.float16), np.asarray(lse), normal(q.shape)
    delta = np.einsum("bqhd,bqhd->bhq", out.astype(np.float32), do.astype(np.float32))

    def backward(q, k, v, out, lse, do):
        return attention._attention_bwd(bw, False, (q, k, v, out, lse), do)
    yield ("attention_mgpu backward (1, 128, 1, 64) f16", backward, [q, k, v, out, lse, do],
           [[q, k, v, do, lse, delta]] * 2)

    def pipelined(q, k, v):
        return attention.attention_with_pipeline_emitter(q, k, v, at)
    yield "attention_mgpu pipeline emitter (1, 128, 1, 64)", pipelined, [q, k, v], None

    # Two groups of rows (48 and 80: neither on a block boundary), (64, 64) blocks.
    sizes = np.array([48, 80], np.int32)

    def ragged_dot(group_sizes, lhs, rhs):  # the kernel's order of arguments
        return ragged.ragged_dot(lhs, rhs, group_sizes=group_sizes, block_m=64, block_n=64,
                                 block_k=64, max_concurrent_steps=2, grid_block_n=1)
    yield ("ragged_dot (128, 128) x 2 groups (128, 128) f16", ragged_dot,
           [sizes, normal((128, 128)), normal((2, 128, 128))], None)


def blackwell_kernels():
    """jax's official Pallas Blackwell kernels (arch (10, 0)), smallest
    configuration: ``blackwell_matmul_mgpu`` (tiles (128, 128, 64), two
    pipeline slots, collective=False) on one (128, 128) output tile with two
    k steps -- a TMA warp, an MMA warp issuing tcgen05.mma into TMEM, a store
    warpgroup loading TMEM, cluster launch control finding nothing to cancel."""
    from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu as matmul

    rng = np.random.default_rng(10)
    cfg = matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2,
                              collective=False)
    a, b = (rng.standard_normal((128, 128)).astype(np.float16) for _ in range(2))
    yield ("blackwell_matmul (128, 128) x (128, 128) f16",
           lambda a, b: matmul.matmul_kernel(a, b, cfg), [a, b], None)


def smalti_kernels():
    """Kernels only smalti lowers (jax refuses them), built at the dialect level."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' kernel builders
    from smalti import kernels as smalti_kernels_
    from tests.plugins import test_vector_ops as tv

    x = np.random.default_rng(3).standard_normal((256, 128)).astype(np.float32)
    yield ("smalti: rank-3 softmax (2, 128, 128)", tv.softmax_rows(tv.TILED[0], rank3=True),
           [tv.sds((256, 128))], [tv.sds((256, 128))], (), [x])
    yield ("smalti: keep_dims mean (128, 128)",
           tv.mean_centered(tv.TILED[0], (128, 128), 1, keep_dims=True),
           [tv.sds((128, 128))], [tv.sds((128, 128))], tv.SCRATCH, [x[:128]])
    del smalti_kernels_


AT_SCALE = "at scale"  # in the names of the opt-in lines (--only must name them)


@dataclasses.dataclass(frozen=True)
class AtScale:
    """An opt-in line: the official Hopper matmul at one shape (f16)."""

    name: str
    m: int
    k: int
    n: int
    cluster: str | None  # the cluster dimension (clusters of 2), or None


AT_SCALE_LINES = (
    # the shape of jax's ops tests (mgpu_matmul_test.py)
    AtScale(f"hopper_matmul 4096^3 f16 {AT_SCALE}", 4096, 4096, 4096, None),
    AtScale(f"hopper_matmul 4096^3 f16 {AT_SCALE}, cluster (2,1)", 4096, 4096, 4096, "M"),
    # the shape of jax's Pallas test_realistic_matmul (tests/pallas/mosaic_gpu_test.py:
    # a grid of 132 x 4 output tiles of 128 x 128, 10 k steps of 64), which
    # its clustered variant, test_realistic_matmul_with_cluster (issue 36's
    # 60 s target; in neither copy of jax's tests here), shares
    AtScale(f"hopper_matmul 16896x640x512 f16 {AT_SCALE}, cluster (2,1)", 16896, 640, 512, "M"),
)


def at_scale_kernels():
    """The official Hopper matmul at the shapes of ``AT_SCALE_LINES``; tiles
    (128, 128, 64), 4 pipeline slots, epilogue tiles (64, 64), two consumer
    warpgroups along N, clusters of 2 along M where asked
    (``test_hopper_matmul_cluster``'s configuration). Yields (name, jax
    function, arguments, the same function on its smallest shape -- one
    output tile per block of a cluster, 4 k steps -- with its arguments, and
    how many block tile-steps (output tiles x k steps, per block) the full
    shape has per one of the small)."""
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as matmul

    rng = np.random.default_rng(6)
    operands: dict[tuple[int, int, int], list[np.ndarray]] = {}
    for line in AT_SCALE_LINES:
        shape = (line.m, line.k, line.n)
        if shape not in operands:
            operands[shape] = [rng.standard_normal(s).astype(np.float16)
                               for s in ((line.m, line.k), (line.k, line.n))]
        cluster = None if line.cluster is None else matmul.MatmulDimension[line.cluster]
        cfg = matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                                  epi_tile_m=64, epi_tile_n=64, cluster_dimension=cluster)
        m = 128 if cluster is None else 256  # one (128, 256) tile per block
        small = [rng.standard_normal(s).astype(np.float16) for s in ((m, 256), (256, 256))]
        # full: (M / m) * (N / 256) cluster tiles of K / 64 k steps; small: 1 of 4
        ratio = (line.m // m) * (line.n // 256) * (line.k // 64) // 4
        yield (line.name, functools.partial(_matmul, matmul, cfg), operands[shape],
               (functools.partial(_matmul, matmul, cfg), small), ratio)


def _matmul(matmul: types.ModuleType, cfg: Any, a: np.ndarray, b: np.ndarray):
    return matmul.matmul(a, b, None, cfg)


@contextlib.contextmanager
def first_clusters(n: int) -> Iterator[list[int]]:
    """Inside, the emulator launches only the first ``n`` clusters of every
    grid (0: all) -- for timing a sample of a long grid; the outputs are
    partial. Yields the list the grids' cluster counts are appended to. (The
    launch rule queues a grid's clusters as ``gpu.cluster_order`` gives
    them: the sample is that queue cut short.)"""
    from collections import deque

    from smalti.emulate.ops import gpu

    order = gpu.cluster_order
    counts: list[int] = []

    def sampled(nclusters, cdim):
        every = list(order(nclusters, cdim))
        counts.append(len(every))
        return deque(every[:n] if n else every)
    gpu.cluster_order = sampled
    try:
        yield counts
    finally:
        gpu.cluster_order = order


# --- what is timed -------------------------------------------------------------------------

# One kernel launch for the emulator: (module, inputs, outputs or None for the IR's).
Launch = tuple[Any, Sequence[np.ndarray], Any]


@dataclasses.dataclass
class Case:
    name: str
    lower: Callable[[], list[Launch]]  # lowers (timed as "lower s")
    jax_fn: Callable | None = None  # what jax's interpret mode runs; None: nothing
    jax_args: Sequence[np.ndarray] = ()
    arch: tuple[int, int] = (9, 0)
    # at scale: jax's interpret mode runs this smaller case instead, scaled by
    # ``ratio`` (see at_scale_kernels)
    twin: Case | None = None
    ratio: int = 1


def _outputs(avals) -> list[tuple[tuple[int, ...], np.dtype]]:
    return [(tuple(a.shape), np.dtype(a.dtype)) for a in avals]


def pallas_case(name: str, fn: Callable, args: list, kernel_inputs=None,
                arch: tuple[int, int] = (9, 0)) -> Case:
    if kernel_inputs is None:
        def lower_it() -> list[Launch]:
            module, avals = lower(fn, *args, arch=arch)
            return [(module, args, _outputs(avals))]
    else:
        def lower_it() -> list[Launch]:
            modules, _ = lower_for_cuda(fn, args)
            if len(modules) != len(kernel_inputs):
                raise RuntimeError(f"{len(modules)} kernels, {len(kernel_inputs)} expected")
            return [(m, ins, None) for m, ins in zip(modules, kernel_inputs)]
    return Case(name, lower_it, fn, args, arch)


def smalti_case(name: str, body, ins, outs, scratch, args) -> Case:
    import smalti
    from smalti import kernels as smalti_kernels_

    def lower_it() -> list[Launch]:
        k = smalti_kernels_.build_kernel(body, ins, outs, smem_scratch=scratch)
        smalti.infer_layouts(k.module)
        smalti.lower(k.module, k.launch_context)
        return [(k.module, args, _outputs(outs))]
    return Case(name, lower_it)


QUICK = ("elementwise f32 (128, 128)", "warp-specialized pipeline, 8 x (128, 64)",
         "cluster of 4: multicast TMA (64, 64) f16", "smalti: keep_dims mean (128, 128)")


def cases(quick: bool = False, at_scale: bool = False) -> Iterator[Case]:
    def keep(name: str) -> bool:
        return not quick or name in QUICK

    for name, fn, args in kernels():
        if keep(name):
            yield pallas_case(name, fn, args)
    if not quick:  # none is quick: jax's interpret mode compiles one for seconds
        for name, fn, args, kernel_inputs in official_kernels():
            yield pallas_case(name, fn, args, kernel_inputs)
        for name, fn, args, kernel_inputs in blackwell_kernels():
            yield pallas_case(name, fn, args, kernel_inputs, arch=(10, 0))
    for name, *rest in smalti_kernels():
        if keep(name):
            yield smalti_case(name, *rest)
    if at_scale:
        for name, fn, args, (small_fn, small_args), ratio in at_scale_kernels():
            case = pallas_case(name, fn, args)
            case.twin, case.ratio = pallas_case(name, small_fn, small_args), ratio
            yield case


def short_error(e: BaseException, width: int = 60) -> str:
    """The gist of an error: for a failure inside one of jax's interpret-mode
    callbacks (whose message is a stack of tracebacks), the innermost error."""
    text = str(e)
    wrappers = ("JaxRuntimeError", "Computation failed on", "CpuCallback error",
                "io_callback failed")
    causes = [m.group(2) or m.group(1) for line in text.splitlines()
              if (m := re.match(r"\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): ?(.*)", line))
              and not any(w in line for w in wrappers)]
    if causes:
        text = causes[-1]
    elif "Traceback (most recent call last)" in text or not text.strip():
        text = type(e).__name__
    text = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    text = re.sub(r"<[^<>]*>", "...", text)  # object reprs
    text = re.sub(r":\s*\{.*", "", text)  # sets of effects, dicts
    return text if len(text) <= width else text[:width - 3] + "..."


def emulator_runs(launches: list[Launch], reports: dict[str, int]
                  ) -> tuple[Callable, Callable | None]:
    """(an emulation without the checker, one with it -- None where this
    emulator has none). The checked run counts what the checker reports in
    ``reports`` (the most of any one run): a run whose launch completed before
    it raised its races keeps its time."""
    def plain() -> None:
        for module, inputs, outputs in launches:
            if HAS_CHECKER:
                run_module(module, inputs, outputs, sanitize=False)
            else:
                run_module(module, inputs, outputs)

    def checked() -> None:
        race_error = getattr(smalti_emulate, "RaceError", ())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for module, inputs, outputs in launches:
                try:
                    run_module(module, inputs, outputs)
                except race_error as e:
                    reports["races"] = max(reports.get("races", 0), len(e.races))
        counts: dict[str, int] = {}
        for w in caught:
            key = {"RaceWarning": "races",
                   "UninitializedReadWarning": "uninitialized reads"}.get(type(w.message).__name__)
            if key is None:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            else:
                counts[key] = counts.get(key, 0) + 1
        for key, n in counts.items():
            reports[key] = max(reports.get(key, 0), n)
    return plain, (checked if HAS_CHECKER else None)


def _reset_jax_interpreter() -> None:
    """After a failed interpretation, jax's interpret mode may keep the failed
    kernel's shared state; the next kernel needs it gone."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
        gpu_callbacks.reset_gpu_interpret_mode_state()
    except (ImportError, AttributeError):
        pass


def _jax_found_races() -> bool:
    try:
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
        return bool(gpu_callbacks._races is not None and gpu_callbacks._races.races_found)
    except (ImportError, AttributeError):
        return False


@contextlib.contextmanager
def _callback_errors_unlogged() -> Iterator[None]:
    """jax logs every failed interpret-mode callback (each warpgroup's) with its
    traceback; the failure also reaches the caller, which shows it short."""
    logger = logging.getLogger("jax._src.callback")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def jax_run(case: Case, detect_races: bool, reports: dict[str, int]) -> Callable[[], None]:
    """A call of ``case.jax_fn`` in jax's GPU interpret mode. What its race
    detector prints is kept off the table: a race it reports is counted in
    ``reports``, even in a run that then failed."""
    compiled = jax.jit(case.jax_fn)

    def go() -> None:
        params = plgpu.InterpretGPUParams(detect_races=detect_races)
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), _callback_errors_unlogged(), \
                    gpu_facts(case.arch), plgpu.force_gpu_interpret_mode(params):
                jax.block_until_ready(compiled(*case.jax_args))
        except Exception:
            _reset_jax_interpreter()
            raise
        finally:
            if detect_races and (_jax_found_races() or "RACE DETECTED" in printed.getvalue()):
                reports["jax races"] = 1
    return go


def on_cpu_run(case: Case, reports: dict[str, int]) -> Callable[[], None]:
    """A call of ``case.jax_fn``, jitted, under ``smalti.emulate.on_cpu``: the
    first call lowers its kernels and compiles them for the emulator, later
    ones only run them, checker on (races counted, not raised)."""
    compiled = jax.jit(case.jax_fn)

    def go() -> None:
        with warnings.catch_warnings(record=True) as caught, \
                smalti_emulate.on_cpu(case.arch, on_race="warn", on_uninitialized="ignore"):
            warnings.simplefilter("always")
            jax.block_until_ready(compiled(*case.jax_args))
        races = sum(type(w.message).__name__ == "RaceWarning" for w in caught)
        if races:
            reports["races"] = max(reports.get("races", 0), races)
    return go


def warm_up() -> None:
    """The process's first calls pay once for what later ones reuse: jax's
    interpret mode (the second call of the first kernel still took ~0.1 s,
    the third 0.004 s), and the emulator's first emulation, which imports
    its op modules (0.03 s, 0.12 s where Python writes no bytecode cache);
    a tiny kernel pays both before the table, so that the first line's cold
    figures are those of any other line. The tensor core's compiled adder
    (numba), which a process loads beside its run after its first
    ``LOAD_AFTER`` WGMMA sums (``emulate/tensorcore_compiled.py``), is loaded
    here too: the WGMMA figures are a process's past those first sums (each
    of them numpy's, 0.2-0.3 ms an m64n128k16 instead of 0.05 ms)."""
    from smalti.emulate import tensorcore_compiled
    if tensorcore_compiled.available() and hasattr(tensorcore_compiled, "kernel"):
        tensorcore_compiled.kernel()
    def tiny(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1
    case = pallas_case("warm-up", plgpu.kernel(tiny, out_type=S((128,), jnp.float32)),
                       [np.zeros(128, np.float32)])
    with contextlib.suppress(Exception):
        fastest([jax_run(case, False, {}), jax_run(case, True, {})], 2)
    with contextlib.suppress(Exception):
        _, launches = lowered_row(case)
        fastest([r for r in emulator_runs(launches or [], {}) if r is not None], 1)


Figure = float | str | BaseException


def fastest(runs: list[Callable[[], Any]], repeat: int) -> list[Figure]:
    """Calls each of ``runs`` ``repeat`` times, in turns (each first in every
    other turn); returns each one's fastest time, or its first error."""
    best: list[Figure] = [float("inf")] * len(runs)
    for turn in range(repeat):
        order = list(range(len(runs)))
        for i in (order if turn % 2 == 0 else order[::-1]):
            if isinstance(best[i], BaseException):
                continue
            t0 = time.perf_counter()
            try:
                with collection_paused():
                    runs[i]()
            except Exception as e:  # noqa: BLE001 (shown in place of the figure)
                best[i] = e
                continue
            best[i] = min(best[i], time.perf_counter() - t0)  # type: ignore[type-var]
    return best


@dataclasses.dataclass
class Row:
    name: str
    ops: int | str = ""
    lower_s: Figure = ""
    emulate_s: Figure = ""
    plain: Figure = ""  # (1)
    checked: Figure = ""  # (2)
    jax: Figure = ""  # (3)
    jax_races: Figure = ""  # (4)
    jax_races_cold: Figure = ""  # (4) on its first call: tracing and compiling included
    on_cpu: Figure = ""  # (5)
    reports: dict[str, int] = dataclasses.field(default_factory=dict)
    note: str = ""  # printed after the line

    @property
    def checked_cold(self) -> Figure:
        """Lowering and the first checked emulation: what checking a kernel
        once costs (the counterpart of jax's first call)."""
        if isinstance(self.lower_s, float) and isinstance(self.emulate_s, float):
            return self.lower_s + self.emulate_s
        return ""


def lowered_row(case: Case) -> tuple[Row, Any]:
    """A row with ``case``'s lowering time and op count, and its launches
    (``None`` where lowering failed: the row then holds the error)."""
    row = Row(case.name)
    t0 = time.perf_counter()
    try:
        with collection_paused():
            launches = case.lower()
    except Exception as e:  # noqa: BLE001
        row.lower_s = e
        return row, None
    row.lower_s = time.perf_counter() - t0
    row.ops = sum(count_ops(module) for module, _, _ in launches)
    return row, launches


def measure(case: Case, repeat: int) -> Row:
    row, launches = lowered_row(case)
    if launches is None:
        return row

    plain, checked = emulator_runs(launches, row.reports)
    # The first emulation after lowering, with the emulator's defaults (this
    # column's meaning since the benchmark's first version): the others' warm-up.
    forget_compiled()
    row.emulate_s, = fastest([checked or plain], 1)
    if checked is None:
        row.plain, = fastest([plain], repeat)
        row.checked = "n/a"
    else:
        row.plain, row.checked = fastest([plain, checked], repeat)

    if case.jax_fn is None:
        row.jax = row.jax_races = "n/a"
        return row
    runs = [jax_run(case, False, row.reports), jax_run(case, True, row.reports)]
    if HAS_ON_CPU:
        runs.append(on_cpu_run(case, row.reports))
    warm = fastest(runs, 1)  # traces, lowers and compiles each for its mode
    row.jax_races_cold = warm[1]
    figures = [w if isinstance(w, BaseException) else t
               for w, t in zip(warm, fastest(runs, repeat))]
    row.jax, row.jax_races = figures[:2]
    row.on_cpu = figures[2] if HAS_ON_CPU else "n/a"
    return row


def measure_at_scale(case: Case, sample: int) -> Row:
    """A kernel at scale: lowered; emulated once without and once with the
    checker, on its first ``sample`` clusters (0: all), the figures scaled
    to the whole grid; jax's interpret mode not run -- its figure on the
    small twin, warm, with ``detect_races``, times the ratio of the work,
    stands in as an estimate."""
    row, launches = lowered_row(case)
    if launches is None:
        return row
    plain, checked = emulator_runs(launches, row.reports)
    forget_compiled()  # (each run compiles its module, as before programs were kept)
    with first_clusters(sample) as counts:
        figures = fastest([plain] + ([checked] if checked else []), 1)
    total = counts[0]
    share = total / min(sample or total, total)
    row.plain, row.checked = [f * share if isinstance(f, float) else f
                              for f in figures + ["n/a"]][:2]
    row.emulate_s = row.checked if checked else row.plain
    if share != 1:
        row.note = f"(1), (2): {total // share:.0f} of {total} clusters emulated, times {share:.0f}"
    shared = getattr(getattr(smalti_emulate, "workers", None), "last_run", {})
    if shared.get("workers", 1) > 1:  # the checked run's clusters on several processes
        row.note += (f"; (2) on {shared['workers']} processes ({shared['mode']}, clusters "
                     f"{'+'.join(map(str, [1] + shared['shares']))})")
    row.jax = row.jax_races = "not run"
    if case.twin is not None:
        twin = case.twin
        race_run = jax_run(twin, True, {})
        first, best = fastest([race_run], 1), fastest([race_run], 1)
        t = best[0] if isinstance(first[0], float) else first[0]
        row.jax = row.jax_races = (f"jax not run: ~{t * case.ratio:,.0f} s ({t:.2f} s on the "
                                   f"small shape x {case.ratio})" if isinstance(t, float)
                                   else f"jax (small shape): {short_error(t)}")
    return row


COLUMNS = [("kernel", 48), ("ops", 6), ("lower s", 8), ("emulate s", 10), ("(1) emu", 9),
           ("(2) +check", 11), ("(2)/(1)", 8), ("(3) jax", 9), ("(4) +races", 11),
           ("(4)/(2)", 8), ("(5) on_cpu", 11), ("(4)/(5)", 8), ("cold: lower+(2)", 16),
           ("(4) 1st call", 13), ("ratio", 6)]


def _cell(value: Figure, prefix: str, mark: bool = False) -> str:
    if isinstance(value, BaseException):
        return f"{prefix}: {short_error(value)}" + ("!" if mark else "")
    if isinstance(value, float):
        return f"{value:.3f}" + ("!" if mark else "")
    return str(value)


def _ratio(a: Figure, b: Figure) -> str:
    if isinstance(a, float) and isinstance(b, float) and b > 0:
        return f"{a / b:.1f}x"
    return "-"


def format_row(row: Row) -> str:
    """The row's cells in their columns; an error stands in place of its
    figure (and pushes the rest of the line right), and one error of both of
    jax's modes is said once, at the end of the line."""
    if isinstance(row.lower_s, BaseException):
        return f"{row.name:{COLUMNS[0][1]}s} lowering: {short_error(row.lower_s)}"
    emu_races = bool(row.reports.get("races"))
    jax_races = bool(row.reports.get("jax races"))
    cells = [row.name, str(row.ops), _cell(row.lower_s, "lowering"),
             _cell(row.emulate_s, "emu", emu_races), _cell(row.plain, "emu"),
             _cell(row.checked, "emu", emu_races), _ratio(row.checked, row.plain)]
    if (isinstance(row.jax, BaseException) and isinstance(row.jax_races, BaseException)
            and short_error(row.jax) == short_error(row.jax_races)):
        tail = [_cell(row.jax, "jax") + (" (both; races reported)" if jax_races else " (both)")]
    elif row.jax == row.jax_races == "n/a":
        tail = ["n/a (no jax function)"]
    elif isinstance(row.jax, str) and row.jax == row.jax_races:  # at scale: not run
        tail = [row.jax]
    else:
        tail = [f"{cell:>{width}s}" for (_, width), cell in zip(COLUMNS[7:], [
            _cell(row.jax, "jax"), _cell(row.jax_races, "jax", jax_races),
            _ratio(row.jax_races, row.checked), _cell(row.on_cpu, "emu", emu_races),
            _ratio(row.jax_races, row.on_cpu), _cell(row.checked_cold, "emu"),
            _cell(row.jax_races_cold, "jax"), _ratio(row.jax_races_cold, row.checked_cold)])]
    out = [f"{cells[0]:{COLUMNS[0][1]}s}"]
    out += [f"{cell:>{width}s}" for (_, width), cell in zip(COLUMNS[1:7], cells[1:])]
    return " ".join(out + tail).rstrip()


def header() -> str:
    return " ".join([f"{COLUMNS[0][0]:{COLUMNS[0][1]}s}"]
                    + [f"{title:>{width}s}" for title, width in COLUMNS[1:]])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.emulate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a few kernels only: " + "; ".join(QUICK))
    parser.add_argument("--only", metavar="TEXT", default="",
                        help="only the kernels whose name contains TEXT")
    parser.add_argument("--repeat", type=int, default=3, metavar="N",
                        help="each figure the fastest of N calls (default 3)")
    parser.add_argument("--workers", metavar="N", default=None,
                        help="processes a grid's clusters may run on (sets SMALTI_EMULATE_WORKERS;"
                        " default: its value, else auto: the cores); (1) without the checker "
                        "always runs in one process")
    parser.add_argument("--sample", type=int, default=2, metavar="N",
                        help=f"for the lines '{AT_SCALE}' (run only when --only names them): "
                        "emulate the first N clusters of the grid and scale (0: all; default 2)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.sample < 0:
        parser.error("--sample must be at least 0")
    if args.workers is not None:
        os.environ["SMALTI_EMULATE_WORKERS"] = args.workers

    checker = "" if HAS_CHECKER else " (n/a: this emulator has none)"
    print(f"seconds, fastest of {args.repeat} after a warm-up; (1) the emulator, (2) with its "
          f"synchronization checker{checker};\n(3) jax's GPU interpret mode, (4) with "
          "detect_races=True; (5) the same jitted calls with kernels on the emulator and its "
          "checker\n(smalti.emulate.on_cpu); ! = races reported; lowering not included;\n"
          "cold: checking a "
          "kernel once -- smalti's lowering plus its first checked emulation, against jax's "
          "first call of (4) (tracing and compiling included)")
    warm_up()
    print(header(), flush=True)
    reported = []
    at_scale = bool(args.only) and any(args.only in line.name for line in AT_SCALE_LINES)
    for case in cases(args.quick, at_scale):
        if args.only not in case.name:
            continue
        row = (measure_at_scale(case, args.sample) if case.twin is not None
               else measure(case, args.repeat))
        print(format_row(row) + (f"  {row.note}" if row.note else ""), flush=True)
        if row.reports:
            reported.append(row)
    if reported:
        print("\nreported (the most in one run):")
    for row in reported:
        found = [f"{row.reports[key]} {key}" for key in ("races", "uninitialized reads")
                 if row.reports.get(key)]
        said = ["the emulator's checker: " + ", ".join(found)] if found else []
        said += ["jax's race detector: races"] if row.reports.get("jax races") else []
        print(f"  {row.name}: " + "; ".join(said))


if __name__ == "__main__":
    main()
