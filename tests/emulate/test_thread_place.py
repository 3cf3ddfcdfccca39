"""Values that depend only on a thread's place (``emulate.compiler.per_group``):
thread-id arithmetic is computed once per group of threads and handed out
again in later blocks and launches; nothing that depends on the block, on
memory or on a loop is kept."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate
from smalti.emulate.compiler import Compiler
from smalti.emulate.runner import Program, _entry

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)


def _grid_kernel():
    """Each of 4 blocks adds its block index and each element's column to its rows."""
    def body(x_ref, o_ref):
        i = lax.axis_index("i")
        o_ref[pl.ds(i * 128, 128)] = x_ref[pl.ds(i * 128, 128)] \
            + lax.broadcasted_iota(jnp.float32, (128, 128), 1) + i.astype(jnp.float32) * 1000

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((512, 128), jnp.float32),
                        compiler_params=WG, grid=(4,), grid_names=("i",))


def _want(x: np.ndarray) -> np.ndarray:
    blocks = np.repeat(np.arange(4, dtype=np.float32) * np.float32(1000), 128)[:, None]
    return (x + np.arange(128, dtype=np.float32)) + blocks  # f32, in the kernel's order


def test_blocks_and_launches_share_thread_values_not_block_values():
    """Right in every block (block-dependent values are not kept) and in a
    second launch of the same compiled program (kept values are reused)."""
    x = np.random.default_rng(0).standard_normal((512, 128)).astype(np.float32)
    module, _ = smalti.emulate.lower(_grid_kernel(), x)
    program = Program(module)
    for _ in range(2):
        (got,) = program.run([x], workers=1)
        np.testing.assert_array_equal(got, _want(x))


def test_what_is_kept():
    """Thread-id reads and their arithmetic are kept; arithmetic on the
    block index is not."""
    x = np.zeros((512, 128), np.float32)
    module, _ = smalti.emulate.lower(_grid_kernel(), x)
    comp = Compiler()
    comp.block(_entry(module).regions[0].blocks[0])
    kinds: dict[str, set[bool]] = {}

    def walk(op) -> None:
        for region in op.regions:
            for block in region.blocks:
                for o in block.operations:
                    o = o.operation
                    for r in o.results:
                        if r in comp.slots:
                            kinds.setdefault(o.name, set()).add(comp.slots[r] in comp.placed)
                    walk(o)
    walk(_entry(module))
    assert kinds["gpu.thread_id"] == {True}
    assert kinds["gpu.block_id"] == {False}
    assert True in kinds.get("arith.remui", set()) | kinds.get("arith.andi", set()) \
        | kinds.get("arith.divui", set()) | kinds.get("arith.shrui", set())
    # loads are never kept, nor is anything computed from them
    assert kinds.get("vector.load", {False}) == {False}


def test_warpgroups_get_their_own_thread_values():
    """Two Pallas warpgroups (groups of threads that start at 0 and 128): each
    its own iota and warpgroup index."""
    def body(o_ref):
        wg = lax.axis_index("wg")
        o_ref[wg] = lax.broadcasted_iota(jnp.int32, (64, 128), 1) + wg * 1000

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, 64, 128), jnp.int32),
                     num_threads=2, thread_name="wg", compiler_params=WG)
    (got,) = smalti.emulate.run(k)
    want = np.arange(128, dtype=np.int32)[None, None, :] + np.array([0, 1000])[:, None, None]
    np.testing.assert_array_equal(got, np.broadcast_to(want, (2, 64, 128)))


def _counting(log: list, name: str, slot: int, value: int):
    def step(fr) -> None:
        log.append(name)
        fr.regs[slot] = np.asarray(value)
    return step


def _frame(group_key):
    from types import SimpleNamespace
    block = None if group_key is None else SimpleNamespace(group_key=group_key)
    return SimpleNamespace(regs=[None] * 8, block=block)


def test_runs_of_place_only_steps_become_one_step():
    """Consecutive place-only and constant steps (and the fused runs'
    placeholders between them) merge into one step; a step wrapped since
    compiling (a checker's guard) or any other step ends a run, and a run of
    one keeps its own step."""
    from smalti.emulate.compiler import merge_placed
    from smalti.emulate.fusion import nothing
    log: list = []
    a, b, c, d = (_counting(log, n, k, k) for k, n in enumerate("abcd"))
    other = _counting(log, "other", 4, 4)
    wrapped = _counting(log, "wrapped", 5, 5)
    steps = [a, nothing, b, other, c, wrapped, d]
    place_only = [(a, a, [0]), None, (b, b, [1]), None, (c, c, [2]),
                  (_counting(log, "unwrapped", 5, 5), None, [5]), (d, d, [3])]
    merged = merge_placed(steps, place_only)
    assert len(merged) == 5 and merged[1:] == [other, c, wrapped, d]
    fr = _frame((0, 0, 128))
    for s in merged:
        s(fr)
    assert log == ["a", "b", "other", "c", "wrapped", "d"]
    assert [int(v) for v in fr.regs[:6]] == [0, 1, 2, 3, 4, 5]


def test_a_merged_run_runs_once_per_group_and_always_in_host_code():
    from smalti.emulate.compiler import placed_run
    log: list = []
    run = placed_run([_counting(log, "a", 0, 7), _counting(log, "b", 1, 8)], [0, 1])
    for key in [(0, 0, 128), (0, 0, 128), (0, 128, 128), None, None]:
        fr = _frame(key)
        run(fr)
        assert [int(v) for v in fr.regs[:2]] == [7, 8]
        if key is not None:  # handed out read-only, as per_group's
            assert not fr.regs[0].flags.writeable
    assert log == ["a", "b"] * 4  # the first block of each group, and each host run


def test_a_compiled_kernel_runs_its_index_arithmetic_as_few_steps():
    """In the grid kernel's compiled body, the thread-id arithmetic and
    constants are a few merged steps: under a third as many steps as ops
    (its values are right: the tests above)."""
    programs: list = []

    class Recording(Compiler):
        def block(self, block):
            programs.append(super().block(block))
            return programs[-1]

    x = np.zeros((512, 128), np.float32)
    module, _ = smalti.emulate.lower(_grid_kernel(), x)
    comp = Recording()
    comp.block(_entry(module).regions[0].blocks[0])
    ops = sum(len(p.steps) for p in programs)  # before finish: a step per op
    comp.finish()
    steps = [s for p in programs for s in p.steps]
    merged = [s for s in steps if s.__qualname__.startswith("placed_run.")]
    assert merged and len(steps) * 3 < ops
