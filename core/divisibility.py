"""What is statically known about the divisibility of dynamic indices.

Rules use this to state tiling requirements of refs sliced at dynamic
offsets: a tile of size ``t`` may only start at offsets known to be multiples
of ``t`` (``mosaic_gpu.assume_multiple`` / ``pl.multiple_of`` tell it).
"""

from __future__ import annotations

import math

from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax.experimental.mosaic.gpu import utils as mgpu_utils


def prime_factors(n: int) -> list[int]:
    """The prime factors of ``n``, with multiplicity, in increasing order."""
    factors, divisor = [], 2
    while divisor * divisor <= n:
        while n % divisor == 0:
            factors.append(divisor)
            n //= divisor
        divisor += 1
    if n > 1:
        factors.append(n)
    return factors


def known_gcd(size: int, index: ir.Value) -> int:
    """The largest divisor of ``size`` that ``index`` is known to be a multiple of.

    Vector indices (gathers) are unknown; constants are exact; otherwise the
    IR's divisibility facts are asked one prime factor at a time.
    """
    if size <= 0:
        raise ValueError(f"size must be positive, got {size}")
    if isinstance(index.type, ir.VectorType):
        return 1
    owner = index.owner
    if not isinstance(owner, ir.Block) and isinstance(owner.opview, arith.ConstantOp):
        return math.gcd(size, int(owner.opview.literal_value))
    gcd = 1
    for factor in prime_factors(size):
        if mgpu_utils.is_known_divisible(index, gcd * factor):
            gcd *= factor
    return gcd
