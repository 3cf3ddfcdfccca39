"""Lowering a jax function for CUDA on the CPU and capturing the Lane-level
Mosaic GPU module(s) it produces.

Mosaic GPU's Python pipeline ends in
``jax.experimental.mosaic.gpu.core.lower_mgpu_module`` (layout inference and
dialect lowering for Warpgroup semantics; a no-op for Lane semantics). Whoever
is installed there -- jax's own function or smalti's replacement inside
``smalti.jax.installed()`` -- is wrapped for the duration of one lowering, and
the module it leaves behind is the one the emulator runs: the same module the
``mosaic_gpu`` custom call would hand to the C++ passes and ptxas.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NUM_SMS = 132  # an H100/H200; Pallas kernels may size their grids by it


@contextlib.contextmanager
def gpu_facts(arch: tuple[int, int] = (9, 0), num_sms: int = NUM_SMS) -> Iterator[None]:
    """What lowering asks of the (absent) GPU: the SM count and the architecture."""
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jax.extend import backend

    saved = backend.get_default_device, mgpu_utils._infer_arch
    device = types.SimpleNamespace(core_count=num_sms)
    backend.get_default_device = lambda: device
    mgpu_utils._infer_arch = lambda: tuple(arch)
    try:
        yield
    finally:
        backend.get_default_device, mgpu_utils._infer_arch = saved


@contextlib.contextmanager
def capturing(sink: list) -> Iterator[None]:
    """Appends every module ``lower_mgpu_module`` finishes with to ``sink``."""
    from jax.experimental.mosaic.gpu import core as mgpu_core

    current = mgpu_core.lower_mgpu_module

    def spy(module, *args: Any, **kwargs: Any) -> None:
        current(module, *args, **kwargs)
        sink.append(module)

    mgpu_core.lower_mgpu_module = spy
    try:
        yield
    finally:
        mgpu_core.lower_mgpu_module = current


@dataclass
class KernelCall:
    """One ``mosaic_gpu`` custom call as jax lowered it: the avals of its
    operands and results and which results are operands' buffers. Pallas
    adds operands of its own after the user's (GMEM scratch: semaphores),
    each aliased to a result; a buffer the kernel never touches has no type
    in the module, so only the call says how many there are."""

    avals_in: list
    avals_out: list
    aliases: dict[int, int] = field(default_factory=dict)  # result index -> operand index


def call_aliases(n_in: int, n_out: int, input_output_aliases: Sequence[tuple[int, int]],
                 inouts: int) -> dict[int, int]:
    """Result index -> operand index of the buffers a ``mosaic_gpu`` call
    shares: its ``input_output_aliases``, or with ``inouts`` in-out buffers
    (``mgpu.as_gpu_kernel``'s), the last operands as the last results, as
    jax's lowering rule makes them."""
    if inouts:
        return {n_out - 1 - k: n_in - 1 - k for k in range(inouts)}
    return {o: i for i, o in input_output_aliases}


@contextlib.contextmanager
def recording_calls(calls: dict[int, KernelCall]) -> Iterator[None]:
    """Records, by ``id`` of its module, every ``mosaic_gpu`` custom call
    lowered inside (jax's lowering rule still emits it)."""
    from jax.experimental.mosaic.gpu import core as mgpu_core

    current = mgpu_core._mosaic_gpu_lowering_rule

    def spy(ctx: Any, *args: Any, module: Any, out_types: Any, inout_types: Any,
            input_output_aliases: tuple[tuple[int, int], ...] = (), **kwargs: Any) -> Any:
        aliases = call_aliases(len(ctx.avals_in), len(ctx.avals_out), input_output_aliases,
                               len(inout_types))
        calls[id(module)] = KernelCall(list(ctx.avals_in), list(ctx.avals_out), aliases)
        return current(ctx, *args, module=module, out_types=out_types, inout_types=inout_types,
                       input_output_aliases=input_output_aliases, **kwargs)

    mgpu_core._mosaic_gpu_lowering_rule = spy
    try:
        yield
    finally:
        mgpu_core._mosaic_gpu_lowering_rule = current


def lower_for_cuda(f: Callable, args: Sequence[np.ndarray],
                   arch: tuple[int, int] = (9, 0)) -> tuple[list, Any]:
    """Lowers ``f`` for CUDA on the CPU; returns (captured modules, the traced
    function's output avals)."""
    modules, out_avals, _ = lower_calls(f, args, arch)
    return modules, out_avals


def lower_calls(f: Callable, args: Sequence[np.ndarray], arch: tuple[int, int] = (9, 0)
                ) -> tuple[list, Any, list[KernelCall | None]]:
    """:func:`lower_for_cuda`, and each module's :class:`KernelCall` (None
    where the call did not lower: a prebuilt module riding on a function
    with a host callback)."""
    import jax

    structs = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args]
    modules: list = []
    calls: dict[int, KernelCall] = {}
    with gpu_facts(arch), capturing(modules), recording_calls(calls):
        jax.clear_caches()  # jax caches lowerings: make it lower again
        traced = jax.jit(f).trace(*structs)
        try:
            traced.lower(lowering_platforms=("cuda",))
        except ValueError:
            # a host callback (a profiled kernel's trace dump) does not lower for
            # CUDA on the CPU; an mgpu.as_gpu_kernel module rides on the call anyway
            if modules or not prebuilt_modules(traced.jaxpr):
                raise
    out_avals = jax.tree.leaves(traced.out_info)
    if not modules:  # mgpu.as_gpu_kernel lowers when it is built: the module rides on the call
        modules = prebuilt_modules(traced.jaxpr)
    return modules, out_avals, [calls.get(id(m)) for m in modules]


def prebuilt_modules(jaxpr: Any) -> list:
    """The ``module`` parameters of the ``mosaic_gpu_p`` calls in ``jaxpr``."""
    from jax.experimental.mosaic.gpu import core as mgpu_core

    found: list = []

    def walk(jx: Any) -> None:
        jx = getattr(jx, "jaxpr", jx)
        for eqn in jx.eqns:
            if eqn.primitive is mgpu_core.mosaic_gpu_p:
                found.append(eqn.params["module"])
            for p in eqn.params.values():
                if hasattr(p, "eqns") or hasattr(getattr(p, "jaxpr", None), "eqns"):
                    walk(p)
    walk(jaxpr)
    return found
