"""Op rules, one module per dialect. Importing this package registers them."""

from . import arith, builtin, gpu, llvm, math, memref, nvvm, scf, vector  # noqa: F401
from . import inline_asm  # noqa: F401
from . import atomics, printf, timers, tma_prefetch, tma_reduce  # noqa: F401
