"""Mosaic GPU's profiler (``prof_spec=``, ``ctx.named_region``) on the
emulator: the kernel runs with its profiler buffer, and the buffer it fills
is a trace jax's own ``ProfilerSpec.dump`` reads -- each region entered and
left once per warpgroup, in program order, on the emulator's deterministic
clock."""

from __future__ import annotations

import io
import json

import jax
import jax.numpy as jnp
import numpy as np

import smalti.emulate as emu
from smalti.emulate.capture import prebuilt_modules


def _profiled(spec):
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic import gpu as mgpu

    def body(ctx, x_ref, o_ref, _):
        with ctx.named_region("load"):
            x = mgpu.FragmentedArray.load_strided(x_ref)
        with ctx.named_region("store"):
            (x + x).store_untiled(o_ref)

    sds = jax.ShapeDtypeStruct((128, 128), jnp.bfloat16)
    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(body, (1, 1, 1), (128, 1, 1), sds, sds, (), prof_spec=spec)


def test_a_profiled_kernel_runs_and_its_trace_dumps():
    from jax.experimental.mosaic.gpu import profiler

    spec = profiler.ProfilerSpec(1024)
    f = _profiled(spec)
    x = np.random.default_rng(0).standard_normal((128, 128)).astype(jnp.bfloat16)
    (y,) = emu.run(f, x)  # the profiler buffer, not asked for, is dropped
    np.testing.assert_array_equal(y, x + x)
    (module,) = prebuilt_modules(jax.jit(f).trace(x).jaxpr)
    y, prof = emu.run_module(module, [x], [((128, 128), x.dtype), ((1024,), np.uint32)])
    np.testing.assert_array_equal(y, x + x)
    out = io.StringIO()
    spec.dump(prof, out, grid=(1, 1, 1), block=(128, 1, 1))
    events = json.loads(out.getvalue())["traceEvents"]
    named = [e for e in events if e.get("name") in ("load", "store")]
    traces = sorted({e["tid"] for e in named})
    assert len(traces) == 1  # one warpgroup
    for t in traces:
        mine = [(e["name"], e["ph"]) for e in named if e["tid"] == t]
        assert mine == [("load", "B"), ("load", "E"), ("store", "B"), ("store", "E")]
        ts = [e["ts"] for e in named if e["tid"] == t]
        assert ts == sorted(ts) and len(set(ts)) == 4
