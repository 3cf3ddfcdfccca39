"""float32 blocks to int32 in WGMMA's registers where every value is known
to fit: one ``cvt.rzi.s32.f32`` per element.

Pallas lowers ``x.astype(jnp.int32)`` of a float32 block to a ``max`` and a
``min`` against int32's range and then ``arith.fptosi``: LLVM's ``fptosi``
of a value out of range is poison, so jax clamps first, three instructions
per element. A caller that has bounded its values already (the quantized
sort keys of :mod:`smalti.vocabulary.sorting`: a block scaled by a power
of two into ``(-2**24, 2**24)``) needs only the conversion:
:func:`truncate_in_range` emits it alone, through the register path every
vocabulary primitive of :mod:`smalti.vocabulary.lanes` takes. Its values
must be finite and within ``(-2**31, 2**31)``; outside WGMMA's registers it
is jnp's ``astype`` (jax's rule, clamp included).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir

from smalti.vocabulary import lanes
from smalti.vocabulary.annotations import Aval, Lowered, Operand, PallasContext

__all__ = ["truncate_in_range", "truncate_p"]

truncate_p = jax_core.Primitive("smalti_truncate_in_range")


def truncate_in_range(x: jax.Array) -> jax.Array:
    """``x.astype(jnp.int32)`` (toward zero) of a float32 block whose values
    are all finite and of magnitude below ``2**31``: without the clamp in
    WGMMA's registers (see the module docstring)."""
    if np.dtype(x.dtype) != np.dtype(np.float32):
        raise ValueError(f"truncate_in_range: a float32 block, got {x.dtype}")
    if not (lanes.registers_allowed() and lanes.in_registers(tuple(x.shape), x.dtype)):
        return x.astype(jnp.int32)
    return truncate_p.bind(x)


@truncate_p.def_abstract_eval
def _abstract_eval(x: Aval) -> Aval:
    return jax_core.ShapedArray(x.shape, np.dtype(np.int32))


def _impl(x: jax.Array) -> jax.Array:
    return x.astype(jnp.int32)


truncate_p.def_impl(_impl)
mlir.register_lowering(truncate_p, mlir.lower_fun(_impl, multiple_results=False))


def lower(ctx: PallasContext, x: Operand) -> Lowered:
    """``fptosi`` of each register, the operand and result in WGMMA's layout."""
    [aval] = ctx.avals_in
    i32 = ir.IntegerType.get_signless(32)
    return lanes.on_registers(ctx, x, tuple(aval.shape),
                              lambda value: value.astype(i32, is_signed=True), jnp.int32)
