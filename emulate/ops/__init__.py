"""Op rules, one module per dialect. Importing this package registers them."""

# Not sorted: this order is the order inline_asm's table tries the forms in.
# isort: off
from . import arith, builtin, gpu, llvm, math, memref, nvvm, scf, vector  # noqa: F401
from . import inline_asm  # noqa: F401
from . import clc, tcgen05, tcgen05_cp, tma_pair  # noqa: F401  (register their forms in inline_asm's table)
from . import atomics, cp_async, printf, timers, tma_prefetch, tma_reduce  # noqa: F401
# isort: on
