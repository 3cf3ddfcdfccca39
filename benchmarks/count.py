"""The Python instructions one inference executes, by function.

    .venv/bin/python -m benchmarks.count                       # reductions(1000)
    .venv/bin/python -m benchmarks.count --kernel chain --size 4000 --top 30

Timings on a shared machine move by 10% and more between runs, more than most
single changes to smalti's hot paths; the number of bytecode instructions
smalti executes for one kernel does not move at all. It leaves out the time
spent in the MLIR bindings and in C, so it measures smalti's own work: use
it to compare two versions of a change, and ``run.py`` for the figures.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from types import CodeType

from jax._src.lib.mlir import ir

import smalti
from smalti import kernels

from benchmarks.run import SHAPE, SYNTHETIC

_TOOL = sys.monitoring.PROFILER_ID


def count_instructions(make_module: Callable[[], ir.Module]
                       ) -> tuple[int, collections.Counter[str]]:
    """Infers the layouts of a module from ``make_module`` and returns how
    many bytecode instructions that took, and how many of them in each
    function. A first module warms smalti's caches: only the second counts."""
    smalti.infer_layouts(make_module())
    module = make_module()
    per_code: collections.Counter[CodeType] = collections.Counter()

    def on_instruction(code: CodeType, offset: int) -> None:
        per_code[code] += 1

    events = sys.monitoring.events
    sys.monitoring.use_tool_id(_TOOL, "smalti-count")
    try:
        sys.monitoring.register_callback(_TOOL, events.INSTRUCTION, on_instruction)
        sys.monitoring.set_events(_TOOL, events.INSTRUCTION)
        try:
            smalti.infer_layouts(module)
        finally:
            sys.monitoring.set_events(_TOOL, events.NO_EVENTS)
    finally:
        sys.monitoring.free_tool_id(_TOOL)
    per_function: collections.Counter[str] = collections.Counter()
    for code, count in per_code.items():
        if code.co_filename != __file__:  # this module's own lines around the run
            per_function[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_qualname}"] += count
    return per_function.total(), per_function


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    kinds = {make.__name__: make for make in SYNTHETIC.values()}
    parser.add_argument("--kernel", choices=sorted(kinds), default="reductions")
    parser.add_argument("--size", type=int, default=1000, help="the kernel generator's size (its vector ops before canonicalization)")
    parser.add_argument("--top", type=int, default=20, help="functions to list")
    args = parser.parse_args()
    body = kinds[args.kernel](args.size)
    total, per_function = count_instructions(
        lambda: kernels.build_kernel(body, [SHAPE], [SHAPE]).module)
    print(f"{args.kernel}({args.size}): {total:,} instructions")
    for name, count in per_function.most_common(args.top):
        print(f"{count:10,}  {100 * count / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
