"""Register blocks (``{ .reg ...; ...; }``, :mod:`smalti.emulate.ops.ptx_block`)
as jax's ``FragmentedArray.astype`` writes them, op by op: every conversion
block jax emits for the fp8/fp4/ue8m0 casts, on edge values packed into its
operands as jax packs them, against the PTX ISA's definitions per element
(the cases and the reference of :mod:`tests.emulate.test_ptx_convert`), and
the int8 -> bf16 block without a conversion (``prmt`` + ``sub.bf16x2``) on
every int8, against numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from .. import test_ptx_convert as convert
from .harness import RecordingCompiler, assert_same_bits, covers, run
from .test_ptx import form

CVT_BLOCK = r"\{.*\}"
PLAIN_BLOCK = r"\{[^{]*(?:\{[^{}]*\}[^{]*)*\}"


@pytest.mark.parametrize("src,chain,arch,isa", convert.CASES,
                         ids=[f"{np.dtype(c[0]).name}-{'-'.join(np.dtype(d).name for d in c[1])}"
                              for c in convert.CASES])
@covers(CVT_BLOCK)
def test_every_conversion_block_jax_writes_computes_ptx_semantics(src, chain, arch, isa):
    convert.check_conversion_strings(src, chain, arch, isa, RecordingCompiler())


def _int8_to_bf16_blocks() -> list[tuple[str, str, str]]:
    """(asm string, as MLIR prints it, constraints as MLIR prints them) of each
    block jax writes for int8 -> bf16 (one for bytes 0-1 of a register, one
    for bytes 2-3)."""
    import jax.numpy as jnp
    from jax._src.lib.mlir import ir

    (module,), _ = convert.lower_for_cuda(convert._cast_kernel(np.int8, [jnp.bfloat16]),
                                          [np.zeros((128, 128), np.int8)])
    found = {}
    for op in convert._asm_ops(module):
        asm = op.attributes["asm_string"]
        if "prmt" in ir.StringAttr(asm).value:
            found[ir.StringAttr(asm).value] = (str(asm), str(op.attributes["constraints"]))
    return [(text, *printed) for text, printed in sorted(found.items())]


@covers(PLAIN_BLOCK)
def test_the_int8_to_bf16_block_converts_every_int8_exactly():
    """Each of jax's two blocks on registers holding all 256 int8 values (4 a
    register): the two bf16 of the bytes it selects, the lower byte's in the
    low half; -128, -1, 0, 127 among them, all exact in bf16."""
    blocks = _int8_to_bf16_blocks()
    assert len(blocks) == 2
    codes = np.arange(-128, 128, dtype=np.int8)
    regs = codes.view(np.int32)  # 64 registers of 4 bytes, the first byte lowest
    by_byte = codes.reshape(64, 4).astype(ml_dtypes.bfloat16)
    pairs = {0: by_byte[:, :2], 1: by_byte[:, 2:]}  # bytes 0-1, bytes 2-3
    selects = []
    for text, asm, constraints in blocks:
        assert form(text) == PLAIN_BLOCK
        got = run(f"%r = llvm.inline_asm has_side_effects {asm}, {constraints} %a : (i32) -> i32",
                  {"a": ("i32", regs)}, {"r": "i32"}, threads=64)["r"]
        halves = got.view(ml_dtypes.bfloat16).reshape(64, 2)
        which = int(float(halves[0, 0]) != -128)  # register 0 holds -128 .. -125
        assert_same_bits(halves, pairs[which])
        selects.append(which)
    assert sorted(selects) == [0, 1]
