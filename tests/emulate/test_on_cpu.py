"""``smalti.emulate.on_cpu``: Mosaic GPU kernels inside ordinary jax programs,
run on the CPU backend by the emulator, compared with numpy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
import smalti.jax
from smalti.emulate import cpu_mode
from tests.emulate import race_kernels
from tests.emulate.kernels import WG, S, normal

F32 = jnp.float32
ROW = S((128,), F32)


def scale_shift(scale: float, shift: float):
    """A Pallas kernel: ``x * scale + shift`` over a grid of two blocks."""
    def body(x, o):
        i = lax.axis_index("i")
        o[pl_slice(i)] = x[pl_slice(i)] * scale + shift
    return plgpu.kernel(body, out_type=S((256,), F32), grid=(2,), grid_names=("i",),
                        compiler_params=WG)


def pl_slice(i):
    from jax.experimental import pallas as pl

    return pl.ds(i * 128, 128)


def lane_kernel(inout: bool = False):
    """An ``mgpu.as_gpu_kernel`` (Lane semantics): ``o = x + y``; with
    ``inout``, ``y`` is an in-out buffer that becomes ``y * y``."""
    context = mlir.make_ir_context()
    mgpu.dialect.register_dialect(context)

    def body(ctx, x, y, o, smem):
        a = fa.FragmentedArray.load_strided(x)
        b = fa.FragmentedArray.load_strided(y)
        (a + b).store_untiled(o)
        if inout:
            (b * b).store_untiled(y)

    with context, ir.Location.unknown():
        if inout:
            # the kernel's refs: inputs, in-out buffers, outputs
            return mgpu.as_gpu_kernel(body, (1, 1, 1), (128, 1, 1), ROW, ROW, (),
                                      inout_shape=ROW)
        return mgpu.as_gpu_kernel(body, (1, 1, 1), (128, 1, 1), (ROW, ROW), ROW, ())


X = normal((256,))


def test_a_pallas_kernel_runs_eagerly_and_under_jit():
    k = scale_shift(3.0, 1.0)
    with emu.on_cpu():
        eager = np.asarray(k(X))
        jitted = np.asarray(jax.jit(k)(X))
    want = X * np.float32(3) + np.float32(1)
    np.testing.assert_array_equal(eager, want)
    np.testing.assert_array_equal(jitted, want)


def test_several_kernels_per_program_with_jax_ops_between():
    k1, k2 = scale_shift(2.0, 0.0), scale_shift(1.0, -5.0)

    @jax.jit
    def f(x):
        return k2(jnp.sin(k1(x))) + k1(x)

    with emu.on_cpu():
        got = np.asarray(f(X))
    twice = X * np.float32(2)
    np.testing.assert_allclose(got, np.sin(twice) - 5 + twice, rtol=1e-6, atol=1e-6)


def test_kernels_in_scan_fori_loop_and_cond():
    k = scale_shift(0.5, 1.0)

    @jax.jit
    def f(x, flag):
        x = lax.fori_loop(0, 3, lambda i, c: k(c), x)
        x, ys = lax.scan(lambda c, _: (k(c), c.sum()), x, None, length=2)
        return lax.cond(flag, k, lambda c: c - 1, x), ys

    with emu.on_cpu():
        taken, ys = (np.asarray(a) for a in f(X, True))
        not_taken, _ = (np.asarray(a) for a in f(X, False))
    want, sums = X.astype(np.float64), []
    for _ in range(3):
        want = want * 0.5 + 1
    for _ in range(2):
        sums.append(want.sum())
        want = want * 0.5 + 1
    np.testing.assert_allclose(taken, want * 0.5 + 1, rtol=1e-6)
    np.testing.assert_allclose(not_taken, want - 1, rtol=1e-6)
    np.testing.assert_allclose(ys, sums, rtol=1e-5)


def test_custom_vjp_with_a_kernel_for_each_direction_under_grad():
    square = plgpu.kernel(lambda x, o: o.__setitem__(..., x[...] * x[...]), out_type=ROW,
                          compiler_params=WG)
    times = plgpu.kernel(lambda x, g, o: o.__setitem__(..., 2 * x[...] * g[...]),
                         out_type=ROW, compiler_params=WG)

    @jax.custom_vjp
    def f(x):
        return square(x)

    f.defvjp(lambda x: (square(x), x), lambda x, g: (times(x, g),))
    x = normal((128,))
    with emu.on_cpu():
        grad = np.asarray(jax.jit(jax.grad(lambda x: f(x).sum()))(x))
        value = np.asarray(f(x))
    np.testing.assert_array_equal(value, x * x)
    np.testing.assert_array_equal(grad, 2 * x)


def test_vmap_batches_the_kernel():
    k = scale_shift(2.0, 1.0)
    xs = normal((3, 256))
    with emu.on_cpu():
        got = np.asarray(jax.vmap(k)(xs))
    np.testing.assert_array_equal(got, xs * np.float32(2) + np.float32(1))


def test_a_kernel_writing_to_a_ref_argument_aliases_it():
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2
        x_ref[...] = x_ref[...] + 100

    k = plgpu.kernel(body, out_type=ROW, compiler_params=WG)

    @jax.jit
    def f(x):
        ref = jax.new_ref(x)
        out = k(ref)
        return out, ref[...]

    x = normal((128,))
    with emu.on_cpu():
        out, updated = (np.asarray(a) for a in f(x))
    np.testing.assert_array_equal(out, x * 2)
    np.testing.assert_array_equal(updated, x + np.float32(100))


def test_gmem_scratch_of_a_global_semaphore_is_passed_and_dropped():
    from jax.experimental import pallas as pl

    def body(x, o):
        pl.get_global(plgpu.SemaphoreType.REGULAR)  # GMEM scratch, aliased in and out
        o[...] = x[...] - 1

    k = plgpu.kernel(body, out_type=ROW, compiler_params=WG)
    x = normal((128,))
    with emu.on_cpu():
        got = np.asarray(jax.jit(k)(x))
    np.testing.assert_array_equal(got, x - 1)


def test_as_gpu_kernel():
    x, y = normal((128,)), normal((128,))
    with emu.on_cpu():
        got = np.asarray(lane_kernel()(x, y))
    np.testing.assert_array_equal(got, x + y)


def test_as_gpu_kernel_in_out_buffer_starts_as_the_input_and_is_returned():
    x, y = normal((128,)), normal((128,))
    with emu.on_cpu():
        out, updated = (np.asarray(a) for a in lane_kernel(inout=True)(x, y))
    np.testing.assert_array_equal(out, x + y)
    np.testing.assert_array_equal(updated, y * y)


def test_a_race_raises_by_on_race_and_its_clean_twin_runs():
    racy = race_kernels.commit_before_tma_store(True)
    clean = race_kernels.commit_before_tma_store(False)
    with emu.on_cpu(on_race="raise"):
        with pytest.raises(jax.errors.JaxRuntimeError,
                           match=r"(?s)RaceError: 1 data race.*read-after-write, smem") as e:
            np.asarray(racy.fn(*racy.args))
        assert cpu_mode.kernel_error(str(e.value)) == "RaceError: 1 data race(s) found:"
        (want,) = clean.ref(*clean.args)
        np.testing.assert_array_equal(np.asarray(clean.fn(*clean.args)), want)
    with emu.on_cpu(on_race="warn"):
        with pytest.warns(emu.RaceWarning, match="read-after-write"):
            np.asarray(racy.fn(*racy.args))
    with emu.on_cpu(on_race="ignore"):
        np.asarray(racy.fn(*racy.args))  # runs to the end


def test_an_emulator_error_at_run_time_reaches_the_caller(monkeypatch):
    from smalti.emulate import runner

    def unmodelled(self, *args, **kwargs):
        raise emu.Unsupported("the op under test")

    monkeypatch.setattr(runner.Program, "run", unmodelled)
    k = scale_shift(1.0, 0.0)
    with emu.on_cpu(), pytest.raises(jax.errors.JaxRuntimeError,
                                     match="Unsupported: the op under test") as e:
        np.asarray(jax.jit(k)(X))
    assert cpu_mode.kernel_error(str(e.value)) == "Unsupported: the op under test"
    assert cpu_mode.kernel_error("ValueError: not from a kernel") is None


def test_an_emulator_error_at_lowering_time_is_raised_as_itself(monkeypatch):
    from smalti.emulate import runner

    def unmodelled(self, module, **kwargs):
        raise emu.Unsupported("the type under test")

    monkeypatch.setattr(runner.Program, "__init__", unmodelled)
    k = scale_shift(1.0, 0.0)
    with emu.on_cpu(), pytest.raises(emu.Unsupported, match="the type under test"):
        jax.jit(k)(X)


def test_nothing_changes_outside_the_mode():
    k = scale_shift(1.0, 1.0)
    f = jax.jit(lambda x: k(x) * 2)
    with emu.on_cpu():
        np.testing.assert_array_equal(np.asarray(f(X)), (X + 1) * 2)
    assert cpu_mode.current() is None
    with pytest.raises(ValueError, match="Only interpret mode is supported on CPU"):
        f(X)  # compiled inside the mode: outside, jax compiles (and refuses) again
    with pytest.raises(NotImplementedError, match="'mosaic_gpu_p' not found for platform cpu"):
        lane_kernel()(X[:128], X[:128])
    cpu = jax.devices("cpu")[0]
    assert not hasattr(cpu, "core_count") and not hasattr(cpu, "compute_capability")


def test_set_on_cpu_is_process_wide_until_none():
    k = scale_shift(1.0, 2.0)
    emu.set_on_cpu((9, 0), on_race="raise")
    try:
        np.testing.assert_array_equal(np.asarray(k(X)), X + 2)
        assert cpu_mode.current().on_race == "raise"
    finally:
        emu.set_on_cpu(None)
    assert cpu_mode.current() is None
    with pytest.raises(ValueError, match="Only interpret mode"):
        k(X)


def test_the_cpu_device_answers_as_the_emulated_gpu_inside_only():
    cpu = jax.devices()[0]
    with emu.on_cpu(arch=(10, 0), num_sms=148):
        assert cpu.compute_capability == "10.0"
        assert cpu.core_count == 148
        assert cpu.shared_memory_per_block_optin == 227 * 1024
        assert mgpu_utils._infer_arch() == (10, 0)
        with emu.on_cpu(arch=(9, 0)):  # nested: the innermost
            assert mgpu_utils._infer_arch() == (9, 0)
        assert cpu.core_count == 148
    assert not hasattr(cpu, "core_count")


def test_smaltis_pipeline_lowers_the_kernels_inside_installed(monkeypatch):
    lowered = []
    original = smalti.jax.lower

    def counting(module, *args, **kwargs):
        lowered.append(module)
        return original(module, *args, **kwargs)

    monkeypatch.setattr(smalti.jax, "lower", counting)
    k = scale_shift(4.0, -1.0)
    with emu.on_cpu(), smalti.jax.installed():
        got = np.asarray(jax.jit(lambda x: k(x) + 0.0)(X))
    assert len(lowered) == 1
    np.testing.assert_array_equal(got, X * np.float32(4) - 1)


def test_an_official_kernel_in_a_jitted_program():
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as matmul

    config = matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal(s).astype(np.float16) for s in ((128, 128), (128, 256)))

    @jax.jit
    def f(a, b):
        return jnp.tanh(matmul.matmul(a, b, None, config).astype(F32))

    with emu.on_cpu():
        got = np.asarray(f(a, b))
    want = np.tanh(a.astype(np.float32) @ b.astype(np.float32))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_the_readmes_on_cpu_example_runs_as_shown():
    from pathlib import Path

    text = (Path(__file__).parents[2] / "README.md").read_text()
    section = text[text.index("### Whole programs: `smalti.emulate.on_cpu`"):]
    code = section[section.index("```python") + len("```python"):]
    scope: dict = {}
    exec(compile(code[:code.index("```")], "README.md", "exec"), scope)
    a, b = (scope[n].astype(np.float32) for n in "ab")
    np.testing.assert_allclose(np.asarray(scope["out"], np.float32), np.maximum(a @ b, 0),
                               rtol=2e-2, atol=5e-2)


def test_an_aliased_output_is_the_inputs_bytes_read_as_its_own_type():
    from smalti.emulate.capture import prebuilt_modules
    from smalti.emulate.runner import Program

    kernel = lane_kernel(inout=True)
    x, y = normal((128,)), normal((128,))
    [module] = prebuilt_modules(jax.make_jaxpr(kernel)(x, y))
    out, updated = Program(module).run([x, y], [((128,), np.float32), ((128,), np.int32)],
                                       aliases={1: 1})
    np.testing.assert_array_equal(out, x + y)
    np.testing.assert_array_equal(updated, (y * y).view(np.int32))
    with pytest.raises(emu.EmulationError, match="aliases input 1 of another size"):
        Program(module).run([x, y], [((128,), np.float32), ((64,), np.float32)],
                            aliases={1: 1})
