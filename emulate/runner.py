"""Running a captured Lane-level module: host code once, then the launch.

:class:`Program` compiles a module once (:mod:`.compiler`) and runs it as
often as asked, each run on fresh memory. The kernel's buffer table is the
inputs followed by the outputs, as the ``mosaic_gpu`` custom call passes
them; an output aliased to an input (``input_output_aliases``) is the same
buffer as that input, starting with the input's contents. Called with the
user's arrays only (:func:`smalti.emulate.run`), the buffers jax adds are
made here: ``mgpu.as_gpu_kernel``'s in-out buffers, Pallas' GMEM scratch and
an unrequested profiler buffer."""

from __future__ import annotations

import functools
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import irtypes, ops, subbyte  # noqa: F401  (ops registers the rules)
from .compiler import Compiler
from .errors import EmulationError, Unsupported
from .liveness import dead_ops
from .machine import Frame, Launch
from .sched import WarpSplit
from .sync.checker import Checker


def _entry(module: Any):
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and "llvm.emit_c_interface" in op.attributes:
            return op
    raise Unsupported("a module without a Mosaic GPU entry function (func.func with "
                      "llvm.emit_c_interface)")


def _kernel_args(func: Any) -> dict[int, irtypes.T]:
    found: dict[int, irtypes.T] = {}

    def walk(op: Any) -> None:
        for region in op.regions:
            for block in region.blocks:
                for o in block.operations:
                    o = o.operation
                    if (o.name == "builtin.unrealized_conversion_cast"
                            and "mosaic_gpu.from_kernel_arg_idx" in o.attributes):
                        idx = int(o.attributes["mosaic_gpu.from_kernel_arg_idx"].value)
                        found.setdefault(idx, irtypes.of(o.results[0]))
                    walk(o)
    walk(func)
    return found


def _inouts(kargs: dict[int, irtypes.T], inputs, outputs) -> int:
    """How many of the last inputs are in-out buffers (``mgpu.as_gpu_kernel``'s
    ``inout_shape``): the kernel's buffer table is ``[inputs, outputs]`` with
    those inputs returned as the last outputs, so it has that many fewer
    buffers than inputs and outputs together."""
    k = len(inputs) + len(outputs) - (max(kargs, default=-1) + 1)
    if k <= 0:
        return 0
    pairs = zip(inputs[len(inputs) - k:], outputs[len(outputs) - k:])
    if k > min(len(inputs), len(outputs)) or any(
            tuple(np.shape(a)) != tuple(shape) for a, (shape, _) in pairs):
        raise Unsupported(f"a kernel with {max(kargs, default=-1) + 1} buffer arguments for "
                          f"{len(inputs)} inputs and {len(outputs)} outputs")
    return k


def _gmem_scratch(kargs: dict[int, irtypes.T], n_in: int, n_out: int) -> tuple[list, list]:
    """The (shape, dtype) of each GMEM scratch buffer of a kernel whose buffer
    table is ``[inputs, scratch, outputs, scratch]`` (Pallas passes its GMEM
    scratch as inputs aliased to extra outputs), and of the profiler buffer
    Mosaic GPU appends last (``prof_spec``) when the caller did not ask for it:
    ([...], [] or [profile])."""
    n = max(kargs, default=-1) + 1
    extra = n - n_in - n_out
    if extra <= 0:
        return [], []
    k = extra // 2
    tail = [kargs.get(n_in + k + n_out + j) for j in range(k)]
    profile = [kargs.get(n - 1)] if extra % 2 else []
    if any(t is None or t.kind != "memref" or min(t.shape, default=1) < 0
           for t in tail + profile):
        raise Unsupported(f"a kernel with {n} buffer arguments for {n_in} inputs and {n_out} "
                          "outputs (only Pallas' aliased GMEM scratch and a profiler buffer are "
                          "modelled beyond them)")
    return ([(tuple(t.shape), t.dtype) for t in tail],
            [(tuple(t.shape), t.dtype) for t in profile])


class Program:
    """A Lane-level module compiled once (with the synchronization checker's
    hooks when ``sanitize``, the profiler's when ``profiled``), run by
    :meth:`run` on fresh memory each time."""

    def __init__(self, module: Any, *, sanitize: bool = True, profiled: bool = False) -> None:
        # The compiled steps hold MLIR operations (for locations in reports):
        # the module must outlive them.
        self.module = module
        func = _entry(module)
        self.kargs = _kernel_args(func)
        self.sanitize = sanitize
        self.profiled = profiled
        start = time.perf_counter()
        comp = Compiler(checked=sanitize, profiled=profiled, dead=dead_ops(func))
        self.body = comp.block(func.regions[0].blocks[0])
        comp.finish()
        self.nslots = comp.nslots
        self.compile_s = time.perf_counter() - start  # what a worker pays again (.workers)
        #: warpgroups (by index in their block) whose warps run as tasks: found
        #: by a run (.sched.WarpSplit), kept for the next
        self.warp_split: frozenset[int] = frozenset()

    @functools.cached_property
    def text(self) -> str:
        """The module as a worker process re-parses it: generic form, every
        op's location (the checker's reports name them)."""
        return self.module.operation.get_asm(enable_debug_info=True, print_generic_op_form=True)

    @functools.cached_property
    def sequential_reason(self) -> str | None:
        """Why this module's clusters may not run on several processes, or None."""
        from .workers import sequential_reason

        return sequential_reason(self.module)

    def run(self, inputs: Sequence[np.ndarray],
            outputs: Sequence[tuple[tuple[int, ...], np.dtype]] | None = None, *,
            aliases: Mapping[int, int] | None = None, on_race: str = "raise",
            on_uninitialized: str = "warn", profiler=None,
            workers: int | str | None = None) -> tuple[np.ndarray, ...]:
        """Runs the kernel on ``inputs``; returns the output buffers, each of
        the given (shape, dtype) -- by default, the types of the kernel
        arguments after the inputs. ``aliases`` maps an output's index to the
        input whose buffer it is. The checker reports by the two policies; a
        ``profiler`` (:class:`.profiling.Profiler`, with ``profiled``) counts
        the run. ``workers``: how many processes may run the grid's clusters
        (:mod:`.workers`; ``None``: ``SMALTI_EMULATE_WORKERS``, else the cores)."""
        from . import fpenv
        from . import workers as parallel

        count = parallel.resolve(workers) if profiler is None else 1  # counters: one process
        # the GPU keeps subnormals; a caller's thread may flush them (XLA's callbacks do)
        with fpenv.ieee_subnormals():
            while True:
                started = self.start(inputs, outputs, aliases=aliases, on_race=on_race,
                                     on_uninitialized=on_uninitialized, profiler=profiler)
                parallel.last_run.clear()
                parallel.last_run["mode"] = "sequential: workers=1"
                if count > 1:
                    started.launch.parallel = parallel.plan(self, count, inputs,
                                                            started.outputs, aliases,
                                                            on_uninitialized)
                try:
                    self.execute(started)
                except WarpSplit as e:
                    # warps of one warpgroup wait for each other: again from the
                    # inputs, that warpgroup's warps as tasks (see .sched)
                    if e.warpgroup in self.warp_split:
                        raise EmulationError(f"internal: {e} although they run as tasks") from e
                    self.warp_split = self.warp_split | {e.warpgroup}
                    if profiler is not None:
                        profiler.lines.clear()
                    continue
                return self.collect(started)

    def start(self, inputs: Sequence[np.ndarray],
              outputs: Sequence[tuple[tuple[int, ...], np.dtype]] | None = None, *,
              aliases: Mapping[int, int] | None = None, on_race: str = "raise",
              on_uninitialized: str = "warn", profiler=None) -> Started:
        """The launch's memory, the buffers in it, the host frame: all but running."""
        if profiler is not None and not self.profiled:
            raise ValueError("a profiler for a Program compiled without profiled=True")
        kargs = self.kargs
        aliases = dict(aliases or {})
        if outputs is None:
            untyped = [i for i in range(len(inputs), len(kargs)) if i not in kargs]
            if untyped:
                raise EmulationError(
                    f"the kernel's buffer arguments {untyped} (after its {len(inputs)} "
                    "inputs) have no memref type in the module to take the outputs' types "
                    "from (Pallas' GMEM scratch, say); fix: pass outputs=[(shape, dtype), "
                    "...], one pair per output")
            outputs = [(tuple(kargs[i].shape), kargs[i].dtype)
                       for i in range(len(inputs), len(kargs))]
        # With ``aliases`` the buffers are the custom call's, all of them
        # given; without, the ones jax adds to the user's are made here.
        inout = 0 if aliases else _inouts(kargs, inputs, outputs)
        n = len(inputs) + len(outputs) - inout  # the in-out buffers are inputs' regions
        scratch, profile = ([], []) if aliases else _gmem_scratch(kargs, len(inputs),
                                                                  len(outputs))
        launch = Launch()
        launch.warp_split = self.warp_split
        if self.sanitize:
            launch.sync = Checker(on_race, on_uninitialized)
        launch.prof = profiler
        g = launch.memory["global"]
        regions: list = []
        for i in range(n):
            if i >= len(inputs) and i - len(inputs) in aliases:
                regions.append(_aliased(regions, aliases[i - len(inputs)],
                                        i - len(inputs), outputs[i - len(inputs)]))
                continue
            if i < len(inputs):
                t = kargs.get(i)
                arr = np.asarray(inputs[i])
                if t is not None:
                    if tuple(arr.shape) != tuple(t.shape):
                        raise EmulationError(f"input {i} has shape {arr.shape}, the kernel "
                                             f"wants {t.shape}")
                    if subbyte.bits_of(arr.dtype) != subbyte.bits_of(t.dtype) or \
                            not subbyte.bits_of(t.dtype):  # uint4 for an i4 kernel: the same bits
                        arr = arr.astype(t.dtype)
                arr = np.ascontiguousarray(arr)
            else:
                shape, dt = outputs[i - len(inputs)]
                arr = np.zeros(shape, dt)
            # sub-byte arrays are bit-packed in memory, as the GPU holds them
            data = (subbyte.pack(arr) if subbyte.bits_of(arr.dtype)
                    else arr.reshape(-1).view(np.uint8))
            r = g.alloc(data.size, f"kernel argument {i}")
            r.tracked = True
            r.data[:data.size] = data
            regions.append((r, arr.dtype, arr.shape))
        # Pallas' GMEM scratch (semaphores...): zeroed, an aliased input and
        # output; a profiler buffer nobody asked for: zeroed, written, dropped
        extra = []
        for j, (shape, dt) in enumerate(scratch + profile):
            r = g.alloc(max(int(np.prod(shape, dtype=np.int64)) * dt.itemsize, 1),
                        f"GMEM scratch {j}" if j < len(scratch) else "profiler buffer")
            r.tracked = True
            extra.append(r.base)
        bases = [r.base for r, _, _ in regions]
        bases = (bases[:len(inputs)] + extra[:len(scratch)] + bases[len(inputs):]
                 + extra[:len(scratch)] + extra[len(scratch):])
        table = g.alloc(8 * len(bases), "kernel argument table")
        table.data[:8 * len(bases)] = np.array(bases, np.int64).view(np.uint8)
        regs: list = [None] * self.nslots
        token_slot, buffers_slot = self.body.args
        regs[token_slot] = np.asarray(0, np.int64)
        regs[buffers_slot] = np.asarray(table.base, np.int64)
        returned = regions[len(inputs):] + regions[len(inputs) - inout:len(inputs)]
        return Started(launch, Frame(regs, launch), returned, list(outputs))

    def execute(self, started: Started) -> None:
        """Runs the module's code (host code, the launch) in ``started``'s frame."""
        launch, on_race = started.launch, getattr(started.launch.sync, "on_race", "ignore")
        try:
            with np.errstate(all="ignore"):
                self.body.run(started.frame)
        except (EmulationError, Unsupported) as e:
            if launch.sync is not None and launch.sync.races and on_race != "ignore":
                races = list(launch.sync.races.values())
                e.add_note(f"before this, the checker found {len(races)} data race(s), which "
                           "may have caused it:\n" + "\n".join(str(r) for r in races[:3]))
            raise

    def collect(self, started: Started) -> tuple[np.ndarray, ...]:
        """Applies the race policy; the output buffers' contents."""
        if started.launch.sync is not None:
            started.launch.sync.finish()
        out = []
        for (r, dt, shape), (_, want) in zip(started.returned, started.outputs):
            if np.dtype(want).itemsize == dt.itemsize and \
                    subbyte.bits_of(want) == subbyte.bits_of(dt):
                dt = np.dtype(want)  # the same bits as the caller's type (an in-out u32 for i32)
            if subbyte.bits_of(dt):
                out.append(subbyte.unpack(r.data[:subbyte.nbytes(shape, dt)], dt, shape))
                continue
            out.append(r.data[:_nbytes(shape, dt)].copy().view(dt).reshape(shape))
        return tuple(out)


@dataclass
class Started:
    """A run set up by :meth:`Program.start`: its launch, host frame, the
    regions returned (outputs, then in-out inputs) and the outputs' types."""

    launch: Launch
    frame: Frame
    returned: list
    outputs: list


def _nbytes(shape: tuple, dtype: Any) -> int:
    """A buffer's size in memory (sub-byte elements packed)."""
    if subbyte.bits_of(dtype):
        return subbyte.nbytes(shape, dtype)
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _aliased(regions: list, j: int, index: int, output: tuple) -> tuple:
    """Output ``index``'s region when it aliases input ``j``: the same bytes,
    read back as the output's type (jax aliases int32 to uint32, say)."""
    shape, dt = output
    r, in_dt, in_shape = regions[j]
    if _nbytes(shape, dt) != _nbytes(in_shape, in_dt):
        raise EmulationError(f"output {index} ({shape}, {np.dtype(dt)}) aliases input {j} "
                             f"of another size ({in_shape}, {in_dt})")
    return (r, np.dtype(dt), tuple(shape))


#: compiled programs, by module text (every op and location) and flags;
#: the most recently used last, at most KEEP_COMPILED of them
_COMPILED: OrderedDict[tuple[str, bool, bool], Program] = OrderedDict()
KEEP_COMPILED = 16
_DUMP_NAME = re.compile(r'mosaic_gpu\.dump_basename = "[^"]*"')
_compiled_lock = threading.Lock()


def compiled(module: Any, *, sanitize: bool = True, profiled: bool = False) -> Program:
    """``module``'s :class:`Program`, compiled once per text: a module that
    prints the same (every op and every location: a kernel lowered again)
    runs the program compiled for the first, with what its runs learned
    (warps as tasks). Printing a module costs a tenth of compiling it."""
    text = module.operation.get_asm(enable_debug_info=True, print_generic_op_form=True)
    # (a name for dump files, numbered per lowering: nothing the kernel does)
    key = (_DUMP_NAME.sub("", text), sanitize, profiled)
    with _compiled_lock:
        program = _COMPILED.get(key)
        if program is not None:
            _COMPILED.move_to_end(key)
            return program
    program = Program(module, sanitize=sanitize, profiled=profiled)
    program.__dict__["text"] = text  # (Program.text's value: what workers re-parse)
    with _compiled_lock:
        _COMPILED[key] = program
        while len(_COMPILED) > KEEP_COMPILED:
            _COMPILED.popitem(last=False)
    return program


def forget_compiled() -> None:
    """Drops every kept program (the next run of any module compiles it)."""
    with _compiled_lock:
        _COMPILED.clear()


def run_module(module: Any, inputs: Sequence[np.ndarray],
               outputs: Sequence[tuple[tuple[int, ...], np.dtype]] | None = None, *,
               aliases: Mapping[int, int] | None = None, on_race: str = "raise",
               on_uninitialized: str = "warn", sanitize: bool = True,
               profiler=None, workers: int | str | None = None) -> tuple[np.ndarray, ...]:
    """Runs ``module`` (a Lane-level Mosaic GPU module) once, compiled or
    found compiled (:func:`compiled`; see :meth:`Program.run`)."""
    return compiled(module, sanitize=sanitize, profiled=profiler is not None).run(
        inputs, outputs, aliases=aliases, on_race=on_race, on_uninitialized=on_uninitialized,
        profiler=profiler, workers=workers)
