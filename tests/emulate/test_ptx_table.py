"""The inline-PTX dispatch table (``smalti.emulate.ops.inline_asm``): its
listing, which handler a string reaches, and what an unknown string raises."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from smalti.emulate.errors import Unsupported
from smalti.emulate.ops import inline_asm as ptx

REMOTE_ARRIVE = ("{\n .reg .b32 remAddr32;\n @$0 mapa.shared::cluster.u32  remAddr32, $1, $2;\n"
                 " @$0 mbarrier.arrive.shared::cluster.b64  _, [remAddr32];\n}")
WGMMA = ("{ .reg .pred p; setp.ne.b32 p, $2, 0; wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 "
         "{$0, $1}, $3, $4, p, 1, 1, 0, 1; }")


def test_every_form_is_listed_with_a_description():
    listing = ptx.modelled_ptx()
    assert listing == sorted(listing)
    described = dict(listing)
    forms = [*ptx.OPCODES, *(p.form for p in ptx.PATTERNS), *(t.form for t in ptx.TEXTS)]
    assert len(listing) == len(forms) == len(set(forms))
    for form in forms:
        assert described[form].strip(), form


def test_exact_opcodes_are_matched_by_no_pattern():
    """An exact opcode wins over the patterns: none should also match one, or
    the table would depend on the lookup order."""
    for opcode in ptx.OPCODES:
        assert not [p.form for p in ptx.PATTERNS if p.regex.fullmatch(opcode)], opcode


@pytest.mark.parametrize("text,handler", [
    ("fence.proxy.async.shared::cta;", ptx.fence_proxy_async),
    ("fence.proxy.async;", ptx.fence_proxy_async),
    ("@$1 cp.async.bulk.commit_group;", ptx.bulk_commit_group),
    ("cp.async.bulk.wait_group.read 0;", ptx.bulk_wait_group),
    ("bar.sync 0;", ptx.bar_sync),
    ("barrier.sync.aligned $0, $1;", ptx.bar_sync),
    ("barrier.cluster.arrive.release.aligned;", ptx.barrier_cluster_arrive),
    ("setmaxnreg.inc.sync.aligned.u32 240;", ptx.no_op),
    ("wgmma.fence.sync.aligned;", ptx.no_op),
    ("mbarrier.init.shared::cta.b64 [$0], $1;", ptx.mbarrier_init_shared),
    ("@$3 mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [$0], $1;",
     ptx.mbarrier_arrive_expect_tx),
    ("@$2 cp.async.bulk.tensor.3d.shared::cta.global.mbarrier::complete_tx::bytes "
     "[$0], [$1, {$3, $4, $5}], [$6];", ptx.tma_tile),
    ("cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [$0, {$1}], [$2];", ptx.tma_tile),
    (f"{ptx.GATHER4} [$0], [$1, {{$2, $3, $4, $5, $6}}], [$7];", ptx.tma_gather4),
    (f"{ptx.ST_ASYNC}.v2.b32 [$0], $1, $2, [$3];", ptx.st_async),
    ("ex2.approx.ftz.f32 $0, $1;", ptx.value_instruction),
    ("tanh.approx.bf16x2 $0, $1;", ptx.value_instruction),
    ("max.NaN.f16x2 $0, $1, $2;", ptx.value_instruction),
    ("prmt.b32 $0, $1, $2, $3;", ptx.value_instruction),
    ("mapa.shared::cluster.u32 $0, $1, $2;", ptx.mapa_shared_cluster),
    ("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, "
     "{$10,$11,$12,$13};", ptx.mma_sync_warp),
    ("", ptx.optimization_barrier),
    (" \n ", ptx.optimization_barrier),
    (REMOTE_ARRIVE, ptx.remote_arrive),
    (WGMMA, ptx.wgmma_block),
])
def test_lookup_finds_the_handler(text, handler):
    entry = ptx.lookup(text)
    assert entry is not None and entry.handler is handler


@pytest.mark.parametrize("text", [
    "frobnicate.b32 $0;", "mov.b32 $0, $1;", "ex2.approx.f64 $0, $1;", "sin.approx.f16 $0, $1;",
    "fence.proxy.async.shared::cta; fence.proxy.async;", "{ .reg .b32 r; mov.b32 r, $1; }",
    "cp.async.bulk.tensor.6d.shared::cta.global.mbarrier::complete_tx::bytes [$0], [$1], [$2];",
])
def test_lookup_of_an_unmodelled_string_is_none(text):
    assert ptx.lookup(text) is None


def test_value_patterns_match_exactly_what_value_fn_models():
    """The value-instruction patterns route an opcode to `_value_fn` iff it
    models the opcode for some operand count."""
    bases = ["ex2", "lg2", "tanh", "rsqrt", "rcp", "abs", "max", "min", "add", "mul", "prmt",
             "addc", "fma"]
    modifiers = ["approx", "NaN", "ftz", "rn", ""]
    types = ["f32", "f16", "f16x2", "bf16", "bf16x2", "b32", "f64", "approx", "NaN"]
    for base, n in itertools.product(bases, range(3)):
        for mods, ty in itertools.product(itertools.product(modifiers, repeat=n), types):
            opcode = ".".join([base, *mods, ty])
            modelled = any(ptx._value_fn(opcode, k) is not None for k in range(1, 4))
            entry = ptx.lookup(f"{opcode} $0, $1;")
            assert (entry is not None and entry.value) == modelled, opcode


def _inline_asm_ops(*lines: str):
    """The ``llvm.inline_asm`` ops of a function of ``%a: i32, %b: f32``, as
    compile-time :class:`Op` views."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    from smalti.emulate.compiler import Compiler, Op

    body = "\n".join(f"  {line}" for line in lines)
    with mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.parse(f"func.func @f(%a: i32, %b: f32) {{\n{body}\n  return\n}}")
        block = module.body.operations[0].regions[0].blocks[0]
        comp = Compiler()
        return [Op(raw.operation, comp) for raw in block.operations
                if raw.operation.name == "llvm.inline_asm"], module


@pytest.mark.parametrize("text,hint", [
    ("frobnicate.sync $0;", ""),
    ("@!$0 fence.proxy.async;", ""),  # no handler models a negated predicate
    ("bar.sync $0, $1, $2;", ""),  # a known opcode, an operand count it does not model
    ("tcgen05.commit.cta_group::1.mbarrier::arrive::one.b64 [$0];",
     " (a tcgen05 form the emulator does not model)"),
])
def test_an_unknown_string_raises_unsupported_naming_it(text, hint):
    (op,), _ = _inline_asm_ops(f'llvm.inline_asm has_side_effects "{text}", "r" %a : (i32) -> ()')
    with pytest.raises(Unsupported) as err:
        ptx.inline_asm(op)
    assert err.value.what == f"inline PTX {text!r}{hint}"
    assert err.value.where == op.loc


def test_a_side_effect_opcode_written_as_a_value_instruction_is_unsupported():
    (op,), _ = _inline_asm_ops('%r = llvm.inline_asm "bar.sync $0;", "=r,r" %a : (i32) -> i32')
    with pytest.raises(Unsupported, match="inline PTX 'bar.sync \\$0;'"):
        ptx.inline_asm(op)


def test_a_value_instruction_compiles_to_its_step():
    (op,), _module = _inline_asm_ops(
        '%r = llvm.inline_asm "ex2.approx.ftz.f32 $0, $1;", "=f,f" %b : (f32) -> f32')
    step = ptx.inline_asm(op)
    frame = SimpleNamespace(regs={op.ins[0]: np.float32([0, 1, 3, -1])})
    step(frame)
    np.testing.assert_array_equal(frame.regs[op.outs[0]], np.float32([1, 2, 8, 0.5]))
