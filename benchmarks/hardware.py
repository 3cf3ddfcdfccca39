"""What an H200 computes, recorded, against what the emulator computes.

The emulator is validated against numpy and jnp on the CPU; where the exact
answer depends on the hardware (how fp8 conversions round and saturate, in
which order WGMMA accumulates, what a racy kernel does) only the hardware can
say. This module defines a few such kernels once and has two commands:

    python -m benchmarks.hardware record OUT.npz   # on a GPU (jax + numpy only)
    python -m benchmarks.hardware compare FILE.npz # here: the emulator vs FILE

``record`` runs each case on the GPU and saves its outputs (inputs are rebuilt
from fixed seeds, so the file holds outputs only). It also runs every kernel
of the race catalogue (``tests/emulate/race_kernels.py``) several times and
records how many runs of each gave an answer other than its clean twin's
reference: a race the emulator reports should, at least sometimes, be visible
on the hardware, and a clean twin never. ``compare`` runs the same cases on
the emulator (jax's pipeline) and prints, per case, how many elements differ
bit for bit and by how many units in the last place.

``record`` imports no smalti code: the GPU machine has jax, not smalti.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

RACE_RUNS = 8


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable  # a jax function of one Mosaic GPU kernel call
    args: tuple  # numpy inputs


def _cast_kernel(out_dtype, rows: int, cols: int, block_rows: int) -> Callable:
    """``x.astype(out_dtype)`` over a (rows, cols) array in GMEM, a block of
    rows per program (Warpgroup semantics, as Pallas users write it)."""
    def body(x_ref, o_ref):
        rows_here = pl.ds(lax.axis_index("i") * block_rows, block_rows)
        o_ref[rows_here, :] = x_ref[rows_here, :].astype(out_dtype)

    return plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((rows, cols), out_dtype),
        grid=(rows // block_rows,), grid_names=("i",),
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup))


def f32_patterns() -> np.ndarray:
    """Every f32 whose low 16 bits are zero (all signs, exponents, the top 7
    mantissa bits: every fp8 rounding case and tie), as a (256, 256) array."""
    return (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32).reshape(256, 256)


def fp8_codes(dtype) -> np.ndarray:
    """All 256 codes of an fp8 type, repeated to a (128, 128) array."""
    return np.tile(np.arange(256, dtype=np.uint8), 64).reshape(128, 128).view(dtype)


def _f16_patterns(dtype) -> np.ndarray:
    """Every 16-bit pattern of a 16-bit float type, as a (256, 256) array."""
    return np.arange(1 << 16, dtype=np.uint16).view(dtype).reshape(256, 256)


def _wgmma_kernel(in_dtype, acc_dtype, steps: int, k: int = 64) -> Callable:
    """acc = 0; ``steps`` times acc += a @ b.T (a: (64, k), b: (64, k), both
    K-major in 128-byte-swizzled SMEM, as 8-bit WGMMA operands must be); the
    accumulator stored as it is (no cast)."""
    cols = 128 // np.dtype(in_dtype).itemsize
    smem = plgpu.SMEM((64, k), in_dtype, transforms=(plgpu.TilingTransform((8, cols)),
                                                     plgpu.SwizzleTransform(128)))

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, bar):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, bar.at[0])
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])

        def scope(acc_ref):
            for _ in range(steps):
                plgpu.wgmma(acc_ref, a_smem, plgpu.transpose_ref(b_smem, (1, 0)))
            plgpu.wgmma_wait(0)
            return acc_ref[...]
        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((64, 64), acc_dtype))

    return plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((64, 64), acc_dtype),
        scratch_types=[smem, smem, plgpu.Barrier(num_barriers=2)],
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup))


def _matmul_inputs(k: int, seed: int):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((256, k)).astype(np.float16)
    b = rng.standard_normal((k, 256)).astype(np.float16)
    return a, b


def cases() -> Iterator[Case]:
    import ml_dtypes
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as matmul
    from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mixed

    e4m3, e5m2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
    x = f32_patterns()
    yield Case("f32_to_e4m3", _cast_kernel(jnp.float8_e4m3fn, 256, 256, 32), (x,))
    yield Case("f32_to_e5m2", _cast_kernel(jnp.float8_e5m2, 256, 256, 32), (x,))
    # bf16 <-> fp8 is refused by jax at sm_90 ("cast to f32 first").
    h = _f16_patterns(np.float16)
    yield Case("float16_to_e4m3", _cast_kernel(jnp.float8_e4m3fn, 256, 256, 32), (h,))
    yield Case("float16_to_e5m2", _cast_kernel(jnp.float8_e5m2, 256, 256, 32), (h,))
    for name, codes in (("e4m3", fp8_codes(e4m3)), ("e5m2", fp8_codes(e5m2))):
        for dst in (jnp.float32, jnp.float16):
            yield Case(f"{name}_to_{jnp.dtype(dst).name}", _cast_kernel(dst, 128, 128, 32),
                       (codes,))

    # WGMMA accumulation: f16 operands, the f32 accumulator seen exactly
    # (c = 0 in f32 makes the output the accumulator), and rounded to f16.
    config = matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    a, b = _matmul_inputs(1024, seed=42)
    zeros = np.zeros((256, 256), np.float32)
    yield Case("hopper_matmul_f32_acc", lambda a, b, c: matmul.matmul(a, b, c, config),
               (a, b, zeros))
    yield Case("hopper_matmul_f16_out", lambda a, b: matmul.matmul(a, b, None, config), (a, b))
    # Cancellation probes: large and tiny products in one dot, K = 64.
    rng = np.random.default_rng(7)
    scale = np.float16(2.0) ** rng.integers(-14, 14, (256, 64)).astype(np.float16)
    pa = (rng.standard_normal((256, 64)) * scale).astype(np.float16)
    pb = rng.choice(np.array([1, -1, 0.5, 2], np.float16), (64, 256))
    yield Case("hopper_matmul_cancellation", lambda a, b, c: matmul.matmul(a, b, c, config),
               (pa, pb, zeros))

    # bf16 operands; subnormal f16 operands; f16 accumulators.
    ab, bb = (x.astype(ml_dtypes.bfloat16) for x in _matmul_inputs(1024, seed=43))
    yield Case("hopper_matmul_bf16_f32_acc", lambda a, b, c: matmul.matmul(a, b, c, config),
               (ab, bb, zeros))
    tiny = (rng.standard_normal((256, 256)) * 2.0 ** -18).astype(np.float16)
    yield Case("hopper_matmul_subnormal", lambda a, b, c: matmul.matmul(a, b, c, config),
               (tiny, rng.standard_normal((256, 256)).astype(np.float16), zeros))
    wa = rng.standard_normal((64, 64)).astype(np.float16)
    wb = rng.standard_normal((64, 64)).astype(np.float16)
    yield Case("wgmma_f16_acc_x3", _wgmma_kernel(jnp.float16, jnp.float16, 3), (wa, wb.T.copy()))
    yield Case("wgmma_f32_acc_x3", _wgmma_kernel(jnp.float16, jnp.float32, 3), (wa, wb.T.copy()))
    # fp8 operands (K = 32 per instruction): codes of every magnitude. (A
    # generator of their own: the recorded cases' inputs must not change.)
    frng = np.random.default_rng(8)
    for name, dt in (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)):
        fa = (frng.standard_normal((64, 128)) * 2.0 ** frng.integers(-6, 6, (64, 128))).astype(dt)
        fb = frng.standard_normal((64, 128)).astype(dt)
        yield Case(f"wgmma_{name}_f32_acc_x3", _wgmma_kernel(dt, jnp.float32, 3, k=128), (fa, fb))

    # Mixed types: int8 x bf16 (prmt + sub.bf16x2 dequantization) and int8 x f16.
    mx = mixed.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    a8 = rng.integers(-128, 128, (128, 128)).astype(np.int8)
    for dt in (ml_dtypes.bfloat16, np.float16):
        bb = rng.standard_normal((128, 256)).astype(dt)
        yield Case(f"mixed_matmul_s8_x_{np.dtype(dt).name}",
                   functools.partial(mixed.mixed_matmul_kernel, out_dtype=jnp.dtype(dt),
                                     config=mx), (a8, bb))


def _as_bits(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return x.view(f"u{x.dtype.itemsize}") if x.dtype.kind != "b" else x


def record(path: str) -> None:
    print(jax.devices())
    results: dict[str, np.ndarray] = {}
    for case in cases():
        start = time.perf_counter()
        try:
            out = jax.jit(case.fn)(*case.args)
            out = np.asarray(jax.block_until_ready(out))
            results[case.name] = _as_bits(out)  # loads without ml_dtypes' types
            print(f"{case.name}: {out.dtype}{out.shape} in {time.perf_counter() - start:.1f} s",
                  flush=True)
        except Exception as error:  # a case that fails is reported, the others still run
            print(f"{case.name}: FAILED {type(error).__name__}: {str(error)[:300]}", flush=True)
    np.savez_compressed(path, **results)
    print(f"saved {len(results)} cases to {path}", flush=True)


def record_races(path: str) -> None:
    """Runs each race-catalogue kernel RACE_RUNS times and saves, per entry,
    [runs that differ, runs, runs off the reference]: a racy kernel's runs
    are compared bit for bit with its clean twin's run on the same inputs
    (the twins differ only in the synchronization step), a clean kernel's
    with its first run; "off the reference" counts runs outside the clean
    twin's numpy reference and tolerance."""
    from tests.emulate import race_kernels

    entries = race_kernels.entries()  # each racy kernel just before its clean twin
    counts: dict[str, np.ndarray] = {}
    for i, entry in enumerate(entries):
        twin = entry if entry.race is None else entries[i + 1]
        try:
            want = _outputs(jax.jit(twin.fn)(*entry.args))
            fn = jax.jit(entry.fn)
            runs = [_outputs(fn(*entry.args)) for _ in range(RACE_RUNS)]
        except Exception as error:
            print(f"{entry.name}: FAILED {type(error).__name__}: {str(error)[:200]}", flush=True)
            continue
        differ = sum(any(not np.array_equal(_as_bits(o), _as_bits(w)) for o, w in zip(run, want))
                     for run in runs)
        off = -1
        if twin.ref is not None:
            try:
                ref = twin.ref(*entry.args)
                off = sum(not all(np.allclose(o, r, rtol=twin.rtol or 1e-6, atol=0)
                                  for o, r in zip(run, ref)) for run in runs)
            except TypeError:  # a reference of no inputs
                pass
        counts[entry.name] = np.array([differ, RACE_RUNS, off])
        print(f"{entry.name} ({entry.verdict}): {differ}/{RACE_RUNS} runs differ from the clean "
              f"twin, {off} off the reference", flush=True)
    np.savez_compressed(path, **counts)


def _outputs(out) -> list[np.ndarray]:
    out = jax.block_until_ready(out)
    return [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else (out,))]


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between same-typed float arrays."""
    bits = {2: np.int16, 4: np.int32}[a.dtype.itemsize]
    ia, ib = a.view(bits).astype(np.int64), b.view(bits).astype(np.int64)
    # Map sign-magnitude to a monotonic integer line.
    ia = np.where(ia < 0, -(ia & ((1 << (8 * a.dtype.itemsize - 1)) - 1)), ia)
    ib = np.where(ib < 0, -(ib & ((1 << (8 * a.dtype.itemsize - 1)) - 1)), ib)
    return np.abs(ia - ib)


def compare(path: str, only: str | None = None) -> int:
    """Emulates every recorded case; prints the differences. Returns 1 where any differ."""
    from smalti import emulate

    recorded = np.load(path)
    status = 0
    for case in cases():
        if only and only not in case.name:
            continue
        if case.name not in recorded:
            print(f"{case.name}: not recorded")
            continue
        try:
            out = emulate.run(case.fn, *case.args, on_race="raise")
        except Exception as error:
            print(f"{case.name}: emulator {type(error).__name__}: {str(error)[:200]}")
            status = 1
            continue
        out = np.asarray(out[0] if isinstance(out, (tuple, list)) else out)
        hw = recorded[case.name].view(out.dtype)
        differ = _as_bits(out) != _as_bits(hw)
        with np.errstate(invalid="ignore"):
            differ &= ~(np.isnan(out.astype(np.float32)) & np.isnan(hw.astype(np.float32)))
        line = f"{case.name}: {int(differ.sum())} of {differ.size} differ"
        if differ.any() and hw.dtype.itemsize in (2, 4) and hw.dtype.kind == "f":
            u = _ulps(out, hw)[differ]
            line += f" (ulps: max {int(u.max())}, histogram {np.bincount(u.clip(0, 4)).tolist()})"
        print(line)
        status |= bool(differ.any())
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the cases on a GPU and save their outputs")
    rec.add_argument("path")
    rec.add_argument("--races", help="also run the race catalogue and save its counts here")
    cmp_ = sub.add_parser("compare", help="emulate the cases and compare with a recording")
    cmp_.add_argument("path")
    cmp_.add_argument("-k", dest="only", help="only cases whose name contains this")
    args = parser.parse_args(argv)
    if args.command == "record":
        if args.path != "-":
            record(args.path)
        if args.races:
            try:
                record_races(args.races)
            except Exception:
                traceback.print_exc()
        return 0
    return compare(args.path, args.only)


if __name__ == "__main__":
    sys.exit(main())
