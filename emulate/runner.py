"""Running a captured Lane-level module: host code once, then the launch.

:class:`Program` compiles a module once (:mod:`.compiler`) and runs it as
often as asked, each run on fresh memory: the kernel's buffers are the
inputs followed by the outputs, as the ``mosaic_gpu`` custom call passes
them, and an output aliased to an input (``input_output_aliases``,
``mgpu.as_gpu_kernel``'s in-out buffers, Pallas' GMEM scratch) is the same
buffer as that input, starting with the input's contents."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import irtypes, ops  # noqa: F401  (ops registers the rules)
from .compiler import Compiler
from .errors import EmulationError, Unsupported
from .machine import Frame, Launch
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


class Program:
    """A Lane-level module compiled once (with the synchronization checker's
    hooks when ``sanitize``), run by :meth:`run` on fresh memory each time."""

    def __init__(self, module: Any, *, sanitize: bool = True) -> None:
        # The compiled steps hold MLIR operations (for locations in reports):
        # the module must outlive them.
        self.module = module
        func = _entry(module)
        self.kargs = _kernel_args(func)
        self.sanitize = sanitize
        comp = Compiler(checked=sanitize)
        self.body = comp.block(func.regions[0].blocks[0])
        comp.finish()
        self.nslots = comp.nslots

    def run(self, inputs: Sequence[np.ndarray],
            outputs: Sequence[tuple[tuple[int, ...], np.dtype]] | None = None, *,
            aliases: Mapping[int, int] | None = None, on_race: str = "raise",
            on_uninitialized: str = "warn") -> tuple[np.ndarray, ...]:
        """Runs the kernel on ``inputs``; returns the output buffers, each of
        the given (shape, dtype) -- by default, the types of the kernel
        arguments after the inputs. ``aliases`` maps an output's index to the
        input whose buffer it is. The checker reports by the two policies."""
        kargs = self.kargs
        aliases = dict(aliases or {})
        if outputs is None:
            outputs = [(tuple(kargs[i].shape), kargs[i].dtype)
                       for i in range(len(inputs), len(kargs))]
        n = len(inputs) + len(outputs)
        if any(i >= n for i in kargs):
            raise Unsupported(f"a kernel with {len(kargs)} buffer arguments for {len(inputs)} "
                              f"inputs and {len(outputs)} outputs")
        launch = Launch()
        if self.sanitize:
            launch.sync = Checker(on_race, on_uninitialized)
        g = launch.memory["global"]
        regions: list = []
        for i in range(n):
            if i >= len(inputs) and i - len(inputs) in aliases:
                j = aliases[i - len(inputs)]
                shape, dt = outputs[i - len(inputs)]
                r, in_dt, in_shape = regions[j]
                nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
                if nbytes != int(np.prod(in_shape, dtype=np.int64)) * in_dt.itemsize:
                    raise EmulationError(f"output {i - len(inputs)} ({shape}, {np.dtype(dt)}) "
                                         f"aliases input {j} of another size ({in_shape}, "
                                         f"{in_dt})")
                # The same bytes, read back as the output's type (jax aliases
                # int32 to uint32, say).
                regions.append((r, np.dtype(dt), tuple(shape)))
                continue
            if i < len(inputs):
                t = kargs.get(i)
                arr = np.asarray(inputs[i])
                if t is not None:
                    if tuple(arr.shape) != tuple(t.shape):
                        raise EmulationError(f"input {i} has shape {arr.shape}, the kernel "
                                             f"wants {t.shape}")
                    arr = arr.astype(t.dtype)
                arr = np.ascontiguousarray(arr)
            else:
                shape, dt = outputs[i - len(inputs)]
                arr = np.zeros(shape, dt)
            r = g.alloc(arr.nbytes, f"kernel argument {i}")
            r.tracked = True
            r.data[:arr.nbytes] = arr.reshape(-1).view(np.uint8)
            regions.append((r, arr.dtype, arr.shape))
        table = g.alloc(8 * n, "kernel argument table")
        table.data[:8 * n] = np.array([r.base for r, _, _ in regions], np.int64).view(np.uint8)
        regs: list = [None] * self.nslots
        token_slot, buffers_slot = self.body.args
        regs[token_slot] = np.asarray(0, np.int64)
        regs[buffers_slot] = np.asarray(table.base, np.int64)
        frame = Frame(regs, launch)
        try:
            with np.errstate(all="ignore"):
                self.body.run(frame)
        except (EmulationError, Unsupported) as e:
            if launch.sync is not None and launch.sync.races and on_race != "ignore":
                races = list(launch.sync.races.values())
                e.add_note(f"before this, the checker found {len(races)} data race(s), which "
                           "may have caused it:\n" + "\n".join(str(r) for r in races[:3]))
            raise
        if launch.sync is not None:
            launch.sync.finish()
        out = []
        for r, dt, shape in regions[len(inputs):]:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            out.append(r.data[:nbytes].copy().view(dt).reshape(shape))
        return tuple(out)


def run_module(module: Any, inputs: Sequence[np.ndarray],
               outputs: Sequence[tuple[tuple[int, ...], np.dtype]] | None = None, *,
               aliases: Mapping[int, int] | None = None, on_race: str = "raise",
               on_uninitialized: str = "warn", sanitize: bool = True
               ) -> tuple[np.ndarray, ...]:
    """Compiles ``module`` (a Lane-level Mosaic GPU module) and runs it once
    (see :meth:`Program.run`)."""
    return Program(module, sanitize=sanitize).run(
        inputs, outputs, aliases=aliases, on_race=on_race, on_uninitialized=on_uninitialized)
