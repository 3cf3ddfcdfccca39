"""benchmarks/count.py: a deterministic measure of smalti's own work."""

from smalti import kernels

from benchmarks.count import count_instructions
from benchmarks.run import SHAPE, reductions


def _kernel(steps: int):
    return lambda: kernels.build_kernel(reductions(5 * steps), [SHAPE], [SHAPE]).module


def test_counts_are_the_same_for_the_same_kernel_and_grow_with_it():
    first, per_function = count_instructions(_kernel(10))
    second, _ = count_instructions(_kernel(10))
    assert first == second == sum(per_function.values())
    larger, _ = count_instructions(_kernel(20))
    assert first < larger < 3 * first


def test_counts_name_the_driver_the_rules_and_the_solver_but_not_the_counter():
    _, per_function = count_instructions(_kernel(10))
    names = set(per_function)
    assert "inference.py:infer_layouts" in names
    assert "vector_ops.py:multi_reduction" in names
    assert "solver.py:Solver.solve_in_order" in names
    assert not [name for name in names if name.startswith("count.py:")]


def test_the_counted_module_gets_its_layouts():
    modules = []

    def make():
        modules.append(_kernel(10)())
        return modules[-1]

    count_instructions(make)
    assert len(modules) == 2 and "out_layouts" in str(modules[1])
