"""The sites core makes for a rule are the sites the constructor makes."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, vector

import smalti
from smalti import kernels
from smalti.sites import SiteKind, ValueSite

F32 = jax.ShapeDtypeStruct((128, 128), jnp.float32)


def row_sums(ctx, x_ref, out_ref, smem):
    x = mgpu.vector_load(x_ref)
    f32 = ir.F32Type.get()
    zero = vector.broadcast(ir.VectorType.get([128], f32), arith.constant(f32, 0.0))
    total = vector.MultiDimReductionOp(vector.CombiningKind.ADD, x, zero, [1]).result
    mgpu.vector_store(mgpu.broadcast_in_dim(x.type, total, [0]), out_ref)


def test_a_rules_sites_have_every_field_the_constructor_sets():
    seen: list[ValueSite] = []

    def recording(op, b):
        sites = [b.operand(0), b.operand(1), b.result(0)]
        seen.extend(sites)
        b.variable(sites[0])
        b.variable(sites[1], sites[2])

    @smalti.hookimpl
    def smalti_register_constraint_rules(registry):
        registry.constraint_rule("vector.multi_reduction", overrides="smalti.plugins")(recording)

    plugin = SimpleNamespace(smalti_register_constraint_rules=smalti_register_constraint_rules)
    kernel = kernels.build_kernel(row_sums, [F32], [F32])
    with kernel.context:
        smalti.infer_layouts(kernel.module, pipeline=smalti.build_pipeline(plugins=[plugin]))
    assert [(s.kind, s.index) for s in seen] == [
        (SiteKind.OPERAND, 0), (SiteKind.OPERAND, 1), (SiteKind.RESULT, 0)]
    for position, site in enumerate(seen):
        made = ValueSite(site.op, site.kind, site.index)
        for field in ValueSite.__slots__:
            if field not in ("position", "_hash", "_op_hash"):
                assert getattr(site, field) == getattr(made, field), field
        assert site == made and hash(site) == hash(made)
        assert site.position == position
