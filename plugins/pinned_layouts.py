"""Register layouts an op dictates rather than lets inference choose.

``mosaic_gpu.mma`` needs the MMA layouts of its shape and
``mosaic_gpu.custom_primitive`` the layouts it declares: their rules give
the op's sites one variable fixed to that layout, after checking that the
layout fits the value (SM102 otherwise, as jax refuses it).
"""

from __future__ import annotations

from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import fragmented_array as fa

from smalti.diagnostics import SmaltiValueError
from smalti.layouts import RegisterLayout, describe_register_layout, register_layout_fits
from smalti.rules import ConstraintBuilder
from smalti.sites import ValueSite


def pin_layout(b: ConstraintBuilder, op: ir.OpView, what: str, layout: fa.FragmentedLayout,
               value: ir.Value, *sites: ValueSite) -> None:
    """Gives ``sites`` one variable, fixed to ``layout``, which must fit ``value``."""
    shape = tuple(ir.VectorType(value.type).shape)
    if not register_layout_fits(shape, layout):
        raise SmaltiValueError(
            "SM102", f"Cannot assign layout {describe_register_layout(layout)} to {what} "
            f"of {op.operation.name}: the layout is not compatible with its shape {shape}",
            op=op, values={"layout": str(layout), "shape": shape},
            fix=f"give {what} a shape the layout tiles evenly")
    b.assign(b.variable(*sites), RegisterLayout.of(layout))
