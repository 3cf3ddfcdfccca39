"""An override of a built-in lowering rule: ``arith.cmpf`` on vectors.

The built-in rule (plugin ``smalti.plugins``) lowers the predicates Mosaic
GPU's ``FragmentedArray`` has operators for — ``oeq``, ``une``, ``olt``,
``ole``, ``ogt``, ``oge`` — and rejects the others. This one lowers those
through the same operators (so the IR is the same) and every other predicate
with one ``arith.cmpf`` per register.
"""

from __future__ import annotations

import functools
import operator

from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith

from smalti.rules import LoweringContext

OPERATORS = {
    "oeq": operator.eq, "une": operator.ne, "olt": operator.lt,
    "ole": operator.le, "ogt": operator.gt, "oge": operator.ge,
}


def lower_cmpf(ctx: LoweringContext, op: arith.CmpFOp) -> list[ir.Value]:
    predicate = arith.CmpFPredicate(op.predicate.value)
    [layout] = ctx.out_layouts(op)
    lhs, rhs = ctx.operand_arrays(op, layout=layout)
    compare = OPERATORS.get(str(predicate).lower())
    if compare is not None:
        result = compare(lhs, rhs)
    else:
        result = lhs._pointwise(functools.partial(arith.cmpf, predicate), rhs,
                                output_is_signed=False, restrict_bitwidth=False)
    return [ctx.to_ir(result, op.result.type)]
