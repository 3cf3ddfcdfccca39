"""An execution mode: Mosaic GPU kernels in any jax program run on the emulator.

::

    with smalti.emulate.on_cpu(arch=(9, 0), on_race="raise"):
        out = jax.jit(my_attention)(q, k, v)     # kernels run on the emulator

How it works. jax lowers a program for the platform it runs on; on the CPU
backend Mosaic GPU kernels have no lowering (``mgpu.as_gpu_kernel``'s
``mosaic_gpu_p`` has a rule for CUDA only; Pallas' ``mpmd_map`` -- what
``plgpu.kernel`` and ``pl.core_map`` bind -- and ``pallas_call`` fall back
to interpret mode or refuse). :func:`on_cpu` adds CPU lowering rules for
these primitives that, while the mode is on, do exactly what the CUDA
lowering does -- Pallas' Mosaic GPU lowering, then the Python pipeline in
force (jax's own, or smalti's inside ``smalti.jax.installed()``) -- up to
the point where jax would emit the ``mosaic_gpu_v2`` custom call
(``jax.experimental.mosaic.gpu.core._mosaic_gpu_lowering_rule``, which
Pallas calls too). There, instead, the Lane-level module is compiled for
the emulator (:class:`smalti.emulate.runner.Program`) and the custom call
becomes a host callback of the XLA CPU executable (jax's
``emit_python_callback``, the mechanism of ``jax.pure_callback``): when the
compiled program reaches the kernel, XLA hands the callback the operands as
numpy arrays and the emulator runs the kernel on them -- every launch, in
``lax.scan``/``fori_loop``/``cond``, under ``custom_vjp``, ``grad`` and
``vmap`` (which act on the program before lowering), eagerly or under
``jax.jit``. Buffers are what the custom call gets: inputs then outputs,
outputs aliased to inputs by ``input_output_aliases`` (and
``as_gpu_kernel``'s in-out buffers, Pallas' GMEM scratch) sharing the
input's buffer.

While the mode is on, CPU devices also answer what kernel code asks of a
GPU (``core_count``, ``shared_memory_per_block_optin``,
``compute_capability``, hence ``mgpu.utils._infer_arch()``) as the emulated
GPU (:mod:`.device`), and ``lax.dot_general`` with a tensor-core dot
algorithm (``precision=DotAlgorithmPreset.F16_F16_F32``...) computes as the
emulated GPU's tensor cores (:mod:`.dot_algorithms`, also a host callback).

The mode is a jax configuration value included in jax's compilation cache
keys (as jax's own ``force_gpu_interpret_mode`` is): a function compiled
inside the mode is compiled again outside it, where nothing differs from
jax without smalti (the added rules hand everything to jax's own). The
pipeline in force is read when a kernel is lowered: after switching
between jax's and smalti's pipeline, ``jax.clear_caches()`` makes jax lower
again. Errors of a kernel (:class:`~smalti.emulate.Unsupported`,
:class:`~smalti.emulate.RaceError`, ...) happen inside XLA's execution; jax
raises them as ``JaxRuntimeError`` whose message carries the emulator's.
Multi-device kernels (NVSHMEM, collective metadata) are refused with
:class:`~smalti.emulate.Unsupported`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import device, dot_algorithms, fpenv
from .errors import Unsupported

#: The name of the jax configuration value that holds the mode.
CONFIG_NAME = "smalti_emulate_on_cpu"


@dataclass(frozen=True, slots=True)
class Settings:
    """The mode's settings: the emulated GPU and the checker's policies
    (hashable: they are part of jax's cache keys)."""

    arch: tuple[int, int] = (9, 0)
    on_race: str = "raise"
    on_uninitialized: str = "warn"
    sanitize: bool = True
    num_sms: int = device.NUM_SMS
    workers: int = 1  # processes a grid's clusters may run on (..workers)

    @property
    def facts(self) -> device.GpuFacts:
        return device.GpuFacts(arch=self.arch, num_sms=self.num_sms)


_lock = threading.RLock()
_state: Any = None  # the jax configuration value (created once, on first use)


def _config() -> Any:
    global _state
    with _lock:
        if _state is None:
            from jax._src import config

            _state = config.config_ext.Config(CONFIG_NAME, None, include_in_jit_key=True,
                                              include_in_trace_context=True)
            _install_rules()
            device.answer_with(_current_facts)
        return _state


def current() -> Settings | None:
    """The settings in force in this thread, or ``None`` outside the mode."""
    return None if _state is None else _state.value


def _current_facts() -> device.GpuFacts | None:
    settings = current()
    return None if settings is None else settings.facts


def settings(arch: Sequence[int] = (9, 0), *, on_race: str | None = None,
             on_uninitialized: str | None = None, sanitize: bool = True,
             num_sms: int = device.NUM_SMS, workers: int | str | None = None) -> Settings:
    """:class:`Settings` with the checker's policies and the worker count
    resolved as :func:`smalti.emulate.run` resolves them (environment defaults)."""
    from . import _policies
    from .workers import resolve

    race, uninit = _policies(on_race, on_uninitialized)
    major, minor = (int(a) for a in arch)
    return Settings((major, minor), race, uninit, bool(sanitize), int(num_sms),
                    resolve(workers))


@contextlib.contextmanager
def on_cpu(arch: Sequence[int] = (9, 0), *, on_race: str | None = None,
           on_uninitialized: str | None = None, sanitize: bool = True,
           num_sms: int = device.NUM_SMS, workers: int | str | None = None
           ) -> Iterator[Settings]:
    """Inside: every Mosaic GPU kernel a jax program launches on the CPU
    backend runs on the emulator, as ``arch`` (see the module's docstring).
    ``on_race``/``on_uninitialized``/``sanitize`` as :func:`smalti.emulate.run`
    takes them; ``num_sms``: the SM count devices report; ``workers``: the
    processes a grid's clusters may run on (:func:`smalti.emulate.run`'s)."""
    state = _config()
    new = settings(arch, on_race=on_race, on_uninitialized=on_uninitialized,
                   sanitize=sanitize, num_sms=num_sms, workers=workers)
    previous = state.swap_local(new)
    try:
        yield new
    finally:
        state.set_local(previous)


def set_on_cpu(arch: Sequence[int] | None = (9, 0), *, on_race: str | None = None,
               on_uninitialized: str | None = None, sanitize: bool = True,
               num_sms: int = device.NUM_SMS, workers: int | str | None = None) -> None:
    """:func:`on_cpu` process-wide (jax's global configuration value, as
    ``set_gpu_interpret_mode`` sets jax's); ``set_on_cpu(None)`` turns it off."""
    state = _config()
    state.set_global(None if arch is None else settings(
        arch, on_race=on_race, on_uninitialized=on_uninitialized, sanitize=sanitize,
        num_sms=num_sms, workers=workers))


# --- the lowering rules ----------------------------------------------------------------------


def _install_rules() -> None:
    """Adds the CPU lowering rules; each hands over to jax's own outside the mode."""
    from jax._src.interpreters import mlir
    from jax._src.lax import lax
    from jax._src.pallas import mpmd
    from jax._src.pallas import pallas_call as pallas_call_lib
    from jax.experimental.mosaic.gpu import core as mgpu_core

    mlir.register_lowering(mgpu_core.mosaic_gpu_p, _mosaic_gpu_rule, "cpu")
    mpmd_default = mlir._lowerings[mpmd.mpmd_map_p].rule
    mlir.register_lowering(mpmd.mpmd_map_p, _mpmd_map_rule(mpmd_default), "cpu")
    pallas_default = mlir._lowerings[pallas_call_lib.pallas_call_p].rule
    mlir.register_lowering(pallas_call_lib.pallas_call_p, _pallas_call_rule(pallas_default),
                           "cpu")
    dot_default = mlir._platform_specific_lowerings["cpu"][lax.dot_general_p].rule
    mlir.register_lowering(lax.dot_general_p, _dot_general_rule(dot_default), "cpu")


def _mosaic_gpu_rule(ctx: Any, *args: Any, **params: Any) -> Any:
    """``mgpu.as_gpu_kernel``'s primitive on the CPU."""
    settings = current()
    if settings is None:  # what jax says without a CPU rule
        raise NotImplementedError(
            "MLIR translation rule for primitive 'mosaic_gpu_p' not found for platform cpu")
    return _emulated_custom_call(settings)(ctx, *args, **params)


def _mpmd_map_rule(default: Any) -> Any:
    def rule(ctx: Any, *args: Any, **params: Any) -> Any:
        """``plgpu.kernel``/``pl.core_map`` on the CPU: Mosaic GPU's lowering
        with the emulator in place of the custom call."""
        from jax._src.pallas.mosaic_gpu import core as gpu_core

        settings = current()
        if (settings is None or params.get("interpret")
                or not all(isinstance(m, gpu_core.Mesh) for m in params["meshes"])):
            return default(ctx, *args, **params)
        from jax._src.pallas.mosaic_gpu import pallas_call_registration

        with _emulating(settings):
            return pallas_call_registration.mpmd_map_mgpu_lowering_rule(ctx, *args, **params)

    return rule


def _pallas_call_rule(default: Any) -> Any:
    def rule(ctx: Any, *args: Any, interpret: Any = False, **params: Any) -> Any:
        """``pl.pallas_call`` with Mosaic GPU's compiler parameters on the
        CPU: the GPU lowering jax registers for them, if any (jax 0.11.2
        registers none: there, such a call fails on a GPU as well)."""
        from jax._src.pallas import core as pallas_core
        from jax._src.pallas.mosaic_gpu import core as gpu_core

        settings = current()
        compiler_params = params.get("compiler_params")
        if (settings is not None and not interpret
                and isinstance(compiler_params, gpu_core.CompilerParams)):
            gpu_rule = pallas_core.get_lowering_rule(type(compiler_params), "gpu")
            if gpu_rule is not None:
                with _emulating(settings):
                    return gpu_rule(ctx, *args, **params)
        return default(ctx, *args, interpret=interpret, **params)

    return rule


def _dot_general_rule(default: Any) -> Any:
    def rule(ctx: Any, lhs: Any, rhs: Any, *, precision: Any = None, **params: Any) -> Any:
        """``lax.dot_general`` on the CPU: a tensor-core dot algorithm as the
        emulated GPU computes it (:mod:`.dot_algorithms`), inside the mode."""
        settings = current()
        if settings is None:
            return default(ctx, lhs, rhs, precision=precision, **params)
        lhs_aval, rhs_aval = ctx.avals_in
        algo = dot_algorithms.algorithm(precision) or dot_algorithms.default_precision_algorithm(
            precision, lhs_aval, rhs_aval, ctx.avals_out[0], params["dimension_numbers"])
        if algo is None:
            return default(ctx, lhs, rhs, precision=precision, **params)
        from jax._src import callback

        numbers, arch = params["dimension_numbers"], settings.arch
        dot_algorithms.instruction_of(arch)  # refused here, not when the program runs
        out_dtype = np.dtype(ctx.avals_out[0].dtype)

        def compute(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
            # (XLA's threads flush subnormals: the model keeps IEEE's environment)
            with fpenv.ieee_subnormals():
                return (dot_algorithms.dot_general(a, b, numbers, algo, arch, out_dtype),)

        results, _, _ = callback.emit_python_callback(
            ctx, compute, None, [lhs, rhs], ctx.avals_in, ctx.avals_out,
            has_side_effect=False, returns_token=False)
        return results

    return rule


@contextlib.contextmanager
def _emulating(settings: Settings) -> Iterator[None]:
    """For one lowering: the custom call Mosaic GPU's lowering ends with
    becomes the emulator's callback."""
    from jax.experimental.mosaic.gpu import core as mgpu_core

    with _lock:
        saved = mgpu_core._mosaic_gpu_lowering_rule
        mgpu_core._mosaic_gpu_lowering_rule = _emulated_custom_call(settings)
        try:
            yield
        finally:
            mgpu_core._mosaic_gpu_lowering_rule = saved


def _emulated_custom_call(settings: Settings) -> Any:
    def lowering_rule(ctx: Any, *args: Any, module: Any, out_types: Any, inout_types: Any,
                      input_output_aliases: tuple[tuple[int, int], ...] = (),
                      **_: Any) -> Any:
        """``_mosaic_gpu_lowering_rule``'s signature; emits a host callback."""
        from jax._src import callback
        from jax.experimental.mosaic.gpu import core as mgpu_core

        from .capture import call_aliases

        if mgpu_core._has_communication(module):
            raise Unsupported("a multi-device Mosaic GPU kernel (NVSHMEM or XLA collective "
                              "metadata): the emulator runs one device")
        kernel = EmulatedKernel(module, settings, ctx.avals_out,
                                call_aliases(len(ctx.avals_in), len(ctx.avals_out),
                                             input_output_aliases, len(inout_types)))
        results, _, _ = callback.emit_python_callback(
            ctx, kernel, None, list(args), ctx.avals_in, ctx.avals_out,
            has_side_effect=False, returns_token=False)
        return results

    return lowering_rule


class EmulatedKernel:
    """One kernel of a compiled program: compiled for the emulator when
    lowered, run on the operands XLA passes each time the program reaches it."""

    _run_lock = threading.Lock()  # one emulation at a time: the emulator is Python

    def __init__(self, module: Any, settings: Settings, avals_out: Sequence[Any],
                 aliases: dict[int, int]) -> None:
        from .runner import compiled

        self.settings = settings
        self.program = compiled(module, sanitize=settings.sanitize)
        self.outputs = [(tuple(a.shape), np.dtype(a.dtype)) for a in avals_out]
        self.aliases = aliases
        #: how many times the kernel ran
        self.launches = 0

    def __call__(self, *operands: np.ndarray) -> tuple[np.ndarray, ...]:
        # (XLA's threads flush subnormals: Program.run puts IEEE's environment back)
        with self._run_lock:
            self.launches += 1
            return self.program.run(operands, self.outputs, aliases=self.aliases,
                                    on_race=self.settings.on_race,
                                    on_uninitialized=self.settings.on_uninitialized,
                                    workers=self.settings.workers)


def kernel_error(message: str) -> str | None:
    """The emulator's error inside the message of a ``JaxRuntimeError`` that a
    kernel's callback raised (``"RaceError: 1 data race(s) found:"``), or
    ``None`` if the message is not a callback's."""
    if "CpuCallback error" not in message:
        return None
    lines = message.splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    for line in lines[frames[-1] + 1 if frames else 1:]:
        if line and not line.startswith(" "):
            return line
    return None
