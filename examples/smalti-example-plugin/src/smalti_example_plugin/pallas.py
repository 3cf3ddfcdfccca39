"""``fma(a, b, c)`` for Pallas users: a jax primitive whose Warpgroup lowering
emits ``smalti_example.fma``.

The lowering is registered through ``smalti_register_pallas_lowerings``, so it
is in force while smalti is installed into jax (``smalti.jax.installed()``),
which also lets the MLIR context accept the op of this unregistered dialect
until smalti has lowered it.
"""

from __future__ import annotations

import jax
from jax._src.lib.mlir import ir
from jax.extend.core import Primitive

from smalti_example_plugin.fused import fma_op

fma_p = Primitive("smalti_example_fma")


def _abstract_eval(a, b, c):
    if not (a.shape == b.shape == c.shape and a.dtype == b.dtype == c.dtype):
        raise TypeError(f"fma takes arrays of one shape and dtype, got {a.str_short()}, "
                        f"{b.str_short()} and {c.str_short()}")
    return a


fma_p.def_abstract_eval(_abstract_eval)


def fma(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
    """``a * b + c`` with a single rounding, elementwise; inside Pallas Mosaic GPU
    kernels with Warpgroup semantics, while smalti is installed into jax."""
    return fma_p.bind(a, b, c)


def lower_fma_primitive(ctx, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    del ctx  # Pallas' lowering context: nothing needed from it
    return fma_op(a, b, c)
