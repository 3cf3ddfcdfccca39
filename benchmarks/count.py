"""The Python instructions one inference executes, by function; with
``--machine``, the machine instructions (callgrind).

    .venv/bin/python -m benchmarks.count                       # reductions(1000)
    .venv/bin/python -m benchmarks.count --kernel chain --size 4000 --top 30
    .venv/bin/python -m benchmarks.count --machine             # needs valgrind
    .venv/bin/python -m benchmarks.count --kernel unrolled_wgmma --size 333
    .venv/bin/python -m benchmarks.count --kernel chain --size 250 --machine --lowering
    .venv/bin/python -m benchmarks.count --machine --against-read

Timings on a shared machine move by 10% and more between runs, more than most
single changes to smalti's hot paths; the number of bytecode instructions
smalti executes for one kernel does not move at all. It leaves out the time
spent in the MLIR bindings and in C, so it measures smalti's own work: use
it to compare two versions of a change, and ``run.py`` for the figures.

Bytecode instructions undercount what costs most in Python: a call or a new
object is one or two instructions, and hundreds of machine instructions in
the interpreter (frames, arguments, allocation, freeing). ``--machine``
counts those: it runs the kernel under callgrind twice, building four copies
and inferring all of them, then none, and prints the difference per
inference (within about 1% from run to run on the synthetic kernels, 2-4%
on the unrolled WGMMA pipeline; a minute or two per kernel).

``--against-read`` also counts one read walk of the kernel (``run.py``'s
``read_ops``: what the performance target compares inference with) and
prints the ratio: the target's figure, free of the machine's noise.

``--lowering`` counts one lowering by smalti and one by jax the same way,
both after smalti's inference, so that both compilers get the same module:
where timings of the two move by 10-20% from run to run, the counts show
what smalti's lowering adds to the code generators both share.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import CodeType

from jax._src.lib.mlir import ir

import smalti
from benchmarks.run import SHAPE, SYNTHETIC, _unrolled_wgmma_text, collector_kept_out, read_ops
from smalti import kernels

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


_ROOT = Path(__file__).resolve().parents[1]
_KINDS = {make.__name__: make for make in SYNTHETIC.values()}
_UNROLLED = "unrolled_wgmma"
#: Address-space randomization off where it can be: the bindings hash values
#: by address, so without it dict layouts, and the work, move by a few
#: percent between runs.
_VALGRIND = ("setarch", "-R", "valgrind") if shutil.which("setarch") else ("valgrind",)


def module_maker(kernel: str, size: int, text: str | None = None) -> Callable[[], ir.Module]:
    """Makes fresh copies of ``kernel`` of ``size`` (its vector ops): a
    synthetic kernel of ``benchmarks/run.py``, or the unrolled WGMMA pipeline
    (``size`` WGMMAs; ``text``, if given, its text), parsed into one context
    for all copies (a context each moved the counts by up to 8% between runs)."""
    if kernel == _UNROLLED:
        text, context = text or _unrolled_wgmma_text(size), kernels.make_context()
        return lambda: ir.Module.parse(text, context)
    body = _KINDS[kernel](size)
    return lambda: kernels.build_kernel(body, [SHAPE], [SHAPE]).module


def machine_instructions(kernel: str, size: int, *, inferences: int = 4,
                         valgrind: Sequence[str] = _VALGRIND, lower_with: str | None = None,
                         read_walk: bool = False) -> int:
    """The machine instructions one inference of ``kernel(size)`` executes,
    bindings and interpreter included, as callgrind counts them: a process
    that builds ``inferences`` copies and infers them all, less one that
    builds them and infers none, per inference.

    With ``lower_with`` (``"smalti"`` or ``"jax"``, a synthetic kernel),
    those of one lowering by that compiler instead: both processes build and
    infer every copy (with smalti: the same input for both compilers), one
    lowers them all, the other none.

    With ``read_walk``, those of one read walk instead (``run.read_ops``:
    every op's name and the types of its operands and results, what the
    performance target compares inference with), counted the same way."""
    if lower_with is not None and kernel == _UNROLLED:
        raise ValueError("the unrolled WGMMA pipeline is parsed from text, without the "
                         "launch context lowering needs: count a synthetic kernel")
    with tempfile.TemporaryDirectory() as scratch:
        extra = [] if lower_with is None else ["--lower-with", lower_with]
        if read_walk:
            extra.append("--read-walk")
        if kernel == _UNROLLED:  # traced by Pallas here, not twice under callgrind
            text = Path(scratch, "kernel.mlir")
            text.write_text(_unrolled_wgmma_text(size))
            extra += ["--text", str(text)]
        return _machine_instructions([*valgrind, "--tool=callgrind",
                                      "--callgrind-out-file=/dev/null", sys.executable, "-m",
                                      "benchmarks.count", "--kernel", kernel, "--size",
                                      str(size), *extra, "--build", str(inferences)],
                                     inferences)


def run_counted(command: list[str]) -> str:
    """Runs ``command`` (a process under callgrind) from the repository root
    and returns what it wrote to stderr; raises if it failed."""
    # A fixed hash seed: the same dict layouts, hence the same work, every
    # run. One BLAS thread: numpy's OpenBLAS otherwise starts a thread per
    # core whose idle spinning callgrind counts, more the longer a run
    # takes (7M instructions per inference, +-10% on the totals).
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=_ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n"
                           + done.stderr[-2000:])
    return done.stderr


def _machine_instructions(command: list[str], inferences: int) -> int:
    """Runs ``command`` (callgrind on this module's ``--build``) inferring
    all its copies and none, and returns the difference per inference."""
    def collected(infer: int) -> int:
        command_infer = [*command, "--infer", str(infer)]
        stderr = run_counted(command_infer)
        found = re.search(r"Collected\s*:\s*([\d,]+)", stderr)
        if found is None:
            raise RuntimeError(f"{' '.join(command_infer)} reported no count:\n"
                               + stderr[-2000:])
        return int(found.group(1).replace(",", ""))

    return (collected(inferences) - collected(0)) // inferences


def _build_and_infer(kernel: str, size: int, build: int, infer: int,
                     text: str | None = None, read_walk: bool = False) -> None:
    """What --machine runs under callgrind: warms smalti on one copy of the
    kernel, builds ``build`` more and infers the first ``infer`` of them,
    the collector off (its passes would fall at different times). With
    ``read_walk``, the same with read walks instead of inferences."""
    work: Callable[[ir.Module], object] = read_ops if read_walk else smalti.infer_layouts
    make_module = module_maker(kernel, size, text)
    work(make_module())  # a process's first walk or inference costs much more
    modules = [make_module() for _ in range(build)]
    with collector_kept_out():  # restored after: tests call this in their process
        for module in modules[:infer]:
            work(module)


def _build_and_lower(kernel: str, size: int, build: int, lower: int, lower_with: str) -> None:
    """What --machine --lower-with runs under callgrind: warms the compiler
    on one copy of the kernel, builds and infers ``build`` more (with
    smalti, whichever compiler lowers) and lowers the first ``lower`` of
    them, the collector off."""
    from jax.experimental.mosaic import gpu as jax_mgpu  # the reference

    body = _KINDS[kernel](size)

    def lower_one(kernel: kernels.Kernel) -> None:
        if lower_with == "smalti":
            smalti.lower(kernel.module, kernel.launch_context)
            return
        with kernel.context, ir.Location.unknown(kernel.context):
            jax_mgpu.lower_mgpu_dialect(kernel.module, kernel.launch_context)

    def inferred() -> kernels.Kernel:
        kernel = kernels.build_kernel(body, [SHAPE], [SHAPE])
        smalti.infer_layouts(kernel.module)
        return kernel

    lower_one(inferred())
    built = [inferred() for _ in range(build)]
    with collector_kept_out():
        for kernel in built[:lower]:
            lower_one(kernel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=sorted([*_KINDS, _UNROLLED]), default="reductions")
    parser.add_argument("--size", type=int, default=1000,
                        help="the kernel generator's size (its vector ops before "
                        "canonicalization; the unrolled pipeline's WGMMAs)")
    parser.add_argument("--top", type=int, default=20, help="functions to list")
    parser.add_argument("--machine", action="store_true",
                        help="count machine instructions under callgrind instead (needs valgrind)")
    machine_only = parser.add_mutually_exclusive_group()
    machine_only.add_argument("--against-read", action="store_true",
                              help="with --machine: also count one read walk of the kernel "
                              "(what the performance target compares inference with) and "
                              "print the ratio")
    machine_only.add_argument("--lowering", action="store_true",
                              help="with --machine: the instructions of one lowering by "
                              "smalti and by jax, after smalti's inference (a synthetic kernel)")
    # The process --machine runs under callgrind.
    parser.add_argument("--build", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--infer", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--text", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--lower-with", choices=["smalti", "jax"], help=argparse.SUPPRESS)
    parser.add_argument("--read-walk", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build is not None:
        if args.lower_with is not None:
            _build_and_lower(args.kernel, args.size, args.build, args.infer or 0,
                             args.lower_with)
        else:
            _build_and_infer(args.kernel, args.size, args.build, args.infer or 0,
                             args.text.read_text() if args.text else None, args.read_walk)
        return
    for flag, given in (("--lowering", args.lowering), ("--against-read", args.against_read)):
        if given and not args.machine:
            parser.error(f"{flag} counts machine instructions: add --machine")
    if args.lowering:
        counts = {name: machine_instructions(args.kernel, args.size, inferences=2,
                                             lower_with=name) for name in ("smalti", "jax")}
        print(f"{args.kernel}({args.size}), one lowering after smalti's inference: smalti "
              f"{counts['smalti']:,}, jax {counts['jax']:,} machine instructions "
              f"(smalti/jax {counts['smalti'] / counts['jax']:.3f})")
        return
    if args.machine:
        count = machine_instructions(args.kernel, args.size)
        line = f"{args.kernel}({args.size}): {count:,} machine instructions per inference"
        if args.against_read:
            read = machine_instructions(args.kernel, args.size, read_walk=True)
            line += f", {read:,} per read walk ({count / read:.2f}x)"
        print(line)
        return
    total, per_function = count_instructions(module_maker(args.kernel, args.size))
    print(f"{args.kernel}({args.size}): {total:,} instructions")
    for name, count in per_function.most_common(args.top):
        print(f"{count:10,}  {100 * count / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
