"""The machine instructions of smalti's and jax's inference and lowering of
the official Pallas kernels, phase by phase (callgrind).

    .venv/bin/python -m benchmarks.count_official     # needs valgrind and a C compiler
    .venv/bin/python -m benchmarks.count_official --kernel hopper_matmul_mgpu

``run.py`` times these phases; on a shared machine two timings of one
lowering move by 10-30%, about what the comparison with jax is about. Here
one process under callgrind compiles each kernel twice with each compiler
(the first warms their caches), the collector off, and counts what every
call of the four phase functions executes: ``smalti.jax.infer_layouts`` and
``smalti.jax.lower``, jax's ``infer_layout`` and ``lower_mgpu_dialect``. A
call is bracketed by two callgrind client requests (counters zeroed on
entry, dumped under the call's label on exit), compiled from
``valgrind/callgrind.h`` into a small library loaded with ctypes. About ten
minutes for the four kernels.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import gc
import importlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import jax

import smalti.jax
from benchmarks.count import _VALGRIND, run_counted
from benchmarks.run import lower_for_cuda, official_cases, row, targeting, wrapped_calls

#: The phase functions, by compiler: (module, function name, phase).
_SMALTI, _JAX = "smalti", "jax"
_PHASES = {
    _SMALTI: (("smalti.jax", "infer_layouts", "infer"), ("smalti.jax", "lower", "lower")),
    _JAX: (("jax.experimental.mosaic.gpu.layout_inference", "infer_layout", "infer"),
           ("jax.experimental.mosaic.gpu.dialect_lowering", "lower_mgpu_dialect", "lower")),
}

_CLIENT_REQUESTS = """\
#include <valgrind/callgrind.h>
void smalti_count_start(void) { CALLGRIND_ZERO_STATS; }
void smalti_count_stop(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""

#: What the counted process calls around each phase: start(), stop(label).
Brackets = tuple[Callable[[], object], Callable[[str], object]]
#: Instructions by (kernel, compiler, phase).
Counts = dict[tuple[str, str, str], int]


def compile_client_requests(directory: Path) -> Path:
    """Builds the library of the two client requests in ``directory``."""
    source = directory / "client_requests.c"
    source.write_text(_CLIENT_REQUESTS)
    library = directory / "client_requests.so"
    done = subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O1", "-o",
                           str(library), str(source)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError("could not compile the callgrind client requests (valgrind's "
                           f"headers and a C compiler are needed):\n{done.stderr}")
    return library


@contextlib.contextmanager
def bracketed(compiler: str, kernel: str, brackets: Brackets) -> Iterator[None]:
    """Every call of ``compiler``'s phase functions runs between the two
    brackets, labelled ``kernel|compiler|phase``."""
    start, stop = brackets
    with contextlib.ExitStack() as stack:
        for module_name, function, phase in _PHASES[compiler]:
            def around(_name: str, fn: Callable, phase: str = phase) -> Callable:
                def call(*args, **kwargs):
                    start()
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        stop(f"{kernel}|{compiler}|{phase}")
                return call
            stack.enter_context(wrapped_calls(importlib.import_module(module_name),
                                              (function,), around))
        yield


def count_phases(kernels: list[str] | None, brackets: Brackets) -> None:
    """What runs under callgrind: compiles each official kernel (or those
    named) twice with smalti and twice with jax, the second of each
    bracketed (the first warms caches), the collector off throughout."""
    idle: Brackets = (lambda: None, lambda label: None)
    for name, fn, args, arch in official_cases():
        kernel = name.split()[0]  # "attention_mgpu (pipeline emitter)": a label has no spaces
        if kernels and kernel not in kernels:
            continue
        with targeting(arch):
            for compiler in (_SMALTI, _JAX):
                for counted in (False, True):
                    jax.clear_caches()
                    gc.collect()
                    gc.disable()
                    installed = (smalti.jax.installed() if compiler == _SMALTI
                                 else contextlib.nullcontext())
                    try:
                        with installed, bracketed(compiler, kernel,
                                                  brackets if counted else idle):
                            lower_for_cuda(fn, args)
                    finally:
                        gc.enable()


def read_counts(directory: Path, prefix: str) -> Counts:
    """The instructions of every labelled dump callgrind wrote in
    ``directory`` (files ``prefix.N``), summed by label, in the order of the
    dumps."""
    counts: Counts = collections.Counter()
    dumps = [p for p in directory.glob(f"{prefix}.*") if p.suffix[1:].isdigit()]
    for path in sorted(dumps, key=lambda p: int(p.suffix[1:])):  # in the order of the calls
        text = path.read_text()
        label = re.search(r"^desc: Trigger: Client Request: (\S+)$", text, re.M)
        total = re.search(r"^summary: (\d+)$", text, re.M)
        if label is None or total is None:
            continue
        kernel, compiler, phase = label.group(1).split("|")
        counts[kernel, compiler, phase] += int(total.group(1))
    return dict(counts)


def machine_counts(kernels: list[str] | None = None) -> Counts:
    """Runs :func:`count_phases` under callgrind and reads its dumps."""
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        library = compile_client_requests(directory)
        command = [*_VALGRIND, "--tool=callgrind", f"--callgrind-out-file={directory}/cg.out",
                   sys.executable, "-m", "benchmarks.count_official", "--counted-by",
                   str(library), *(["--kernel", *kernels] if kernels else [])]
        run_counted(command)
        return read_counts(directory, "cg.out")


def print_counts(counts: Counts) -> None:
    widths = [30, 13, 13, 8, 13, 13, 8]
    print("machine instructions per call (callgrind), second compilation of each:")
    print(row(["kernel", "sm infer", "jax infer", "jax/sm", "sm lower", "jax lower", "sm/jax"],
              widths))
    for kernel in dict.fromkeys(k for k, _, _ in counts):
        si, ji = counts[kernel, _SMALTI, "infer"], counts[kernel, _JAX, "infer"]
        sl, jl = counts[kernel, _SMALTI, "lower"], counts[kernel, _JAX, "lower"]
        print(row([kernel, f"{si:,}", f"{ji:,}", f"{ji / si:.1f}x", f"{sl:,}", f"{jl:,}",
                   f"{sl / jl:.3f}"], widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", nargs="+", help="official kernels to count (default: all)")
    # The process main() runs under callgrind, with the client requests' library.
    parser.add_argument("--counted-by", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.counted_by is not None:
        library = ctypes.CDLL(str(args.counted_by))
        count_phases(args.kernel, (library.smalti_count_start,
                                   lambda label: library.smalti_count_stop(label.encode())))
        return
    print_counts(machine_counts(args.kernel))


if __name__ == "__main__":
    main()
