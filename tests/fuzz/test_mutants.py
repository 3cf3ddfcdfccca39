"""Mutated real kernels (tests.fuzz.mutants): a short deterministic slice of
the campaign (the long one is scripts/mutation_campaign.py), every
reproducer it found, and the two bugs of issue 28."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import memref

import smalti
from tests.differential import normalized
from tests.fuzz import mutants

REPRODUCERS = sorted((Path(__file__).parent / "reproducers").glob("*.mlir"))
#: Reproducers of bugs still open, with why (docs/robustness.md; strict
#: xfail: fixing one fails its mark).
OPEN: dict[str, str] = {}

pytestmark = pytest.mark.filterwarnings("ignore::smalti.ArchitectureWarning")


@pytest.fixture(scope="module")
def seeds() -> tuple[mutants.Seed, ...]:
    return mutants.default_seeds(official=False)


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=OPEN[p.stem]))
    if p.stem in OPEN else p for p in REPRODUCERS], ids=[p.stem for p in REPRODUCERS])
def test_reproducer(path):
    """Every mutant the campaign ever found misbehaving: no bug any more."""
    outcome = mutants.run_mutant(path.read_text())
    assert outcome.kind not in mutants.BUGS, outcome


def test_campaign_slice(seeds):
    """A few hundred mutants through smalti, and some through jax too: no
    bug class, and no call near the 10 s limit."""
    start = time.perf_counter()
    counts: collections.Counter[str] = collections.Counter()
    bugs = []
    number = 0
    while sum(counts.values()) < 300:
        seed = seeds[number % len(seeds)]
        mutant = mutants.mutate(seed, number)
        number += 1
        if mutant.text is None:
            continue
        # jax's failing searches are slow: compare with jax on every tenth.
        run = mutants.run_mutant if number % 10 == 0 else mutants.run_smalti_only
        outcome = run(mutant.text)
        counts[outcome.kind] += 1
        if outcome.kind in mutants.BUGS:
            bugs.append(f"{seed.name} #{mutant.number} {mutant.mutations}: {outcome}")
    assert not bugs, "\n".join(bugs)
    # Both accepting and refusing must be exercised for the slice to mean anything.
    assert counts["smalti accepts"] and counts["smalti refused"], counts
    assert time.perf_counter() - start < 120


def test_mutation_is_deterministic(seeds):
    one, two = mutants.mutate(seeds[5], 1234), mutants.mutate(seeds[5], 1234)
    assert one == two


def test_rebuilt_launch_context_lowers_like_jax_pipeline():
    """A seed run through jax's middle-end with the rebuilt launch context
    gives the module jax's own pipeline gives."""
    from jax.experimental.mosaic import gpu as jax_mgpu

    text = mutants.profiled_kernel(prof=False)
    kernel = mutants.instantiate(text)
    with kernel.context, ir.Location.unknown(kernel.context):
        jax_mgpu.infer_layout(kernel.module, arch=(9, 0))
        jax_mgpu.lower_mgpu_dialect(kernel.module, kernel.launch_context)
    ours = mutants.instantiate(text)
    smalti.infer_layouts(ours.module, arch=(9, 0))
    smalti.lower(ours.module, ours.launch_context)
    assert normalized(ours.module) == normalized(kernel.module)
    assert "mosaic_gpu.vector_load" not in normalized(ours.module)


# --- issue 28's bugs -----------------------------------------------------------------


@pytest.mark.parametrize("text", [
    pytest.param(lambda: mutants.profiled_kernel(), id="as_gpu_kernel-prof_spec"),
    pytest.param(lambda: mutants.profiled_kernel(smem_transforms=False), id="untransformed"),
    pytest.param(mutants.pallas_profiled_seed, id="pallas-profile_space"),
])
def test_profiled_kernels_lower_to_jax_module(text):
    """Kernels using jax's profiler: lowering no longer looks up ops other
    rewrites erased ("the operation has been invalidated"); the module is jax's."""
    assert mutants.run_mutant(text()) == mutants.Outcome("ok", "", pytest.approx(0, abs=10))


def _with_transforms_module(space: str, cast: bool = False) -> str:
    """The transformed seed with its SMEM spelled ``space`` (and a cast of
    the scratch ref to a dynamic offset before the with_transforms)."""
    text = mutants.profiled_kernel(prof=False)
    if cast:
        context = mutants.kernels.make_context()

        with context, ir.Location.unknown(context):
            module = ir.Module.parse(text)
            [transforms] = [op for op in mutants._body_ops(module)
                            if op.name == "mosaic_gpu.with_transforms"]
            ref = transforms.operands[0]
            with ir.InsertionPoint(transforms):
                dynamic = memref.cast(mutants._ref_type(ir.MemRefType(ref.type), offset="?"),
                                      ref)
                pinned = mgpu.with_transforms(dynamic, transforms.attributes["transforms"])
            transforms.results[0].replace_all_uses_with(pinned)
            transforms.erase()
            module.operation.verify()
            text = mutants.module_text(module)
    return text.replace(mutants.SMEM, space)


@pytest.mark.parametrize("space, cast", [("3", False), ("#gpu.address_space<private>", False),
                                         ("5", False), ("3", True)])
def test_with_transforms_outside_smem_refused_before_rewriting(space, cast):
    """A with_transforms (and its slice_smem) whose ref is not in
    #gpu.address_space<workgroup> gets no transforms from inference, like
    jax: lowering refuses it before rewriting anything (jax: ValueError)."""
    text = _with_transforms_module(space, cast)
    kernel = mutants.instantiate(text)
    smalti.infer_layouts(kernel.module, arch=(9, 0))
    before = mutants.module_text(kernel.module)
    with pytest.raises(smalti.SmaltiError) as caught:
        smalti.lower(kernel.module, kernel.launch_context)
    assert isinstance(caught.value, ValueError)
    assert caught.value.code == "SM201"
    assert "does not have an out_transforms attribute" in str(caught.value)
    assert f"memory space {space}" in str(caught.value)
    assert caught.value.op and caught.value.fixes
    assert mutants.module_text(kernel.module) == before
    outcome = mutants.run_mutant(text)
    assert outcome.kind == "both refuse" and "SM201" in outcome.detail, outcome
