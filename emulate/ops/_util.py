"""Helpers shared by the rule modules."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..batching import Elementwise
from ..compiler import Op, Step
from ..machine import Frame


def unary(o: Op, fn: Callable, batch: bool = False) -> Step:
    """``fn`` of the operand; ``batch``: ``fn`` is elementwise and accepts a
    leading axis, so a run of such ops may run as one call (:mod:`..batching`)."""
    (a,), (out,) = o.ins, o.outs

    def step(fr: Frame) -> None:
        r = fr.regs
        r[out] = fn(r[a])
    return _batchable(step, o, fn) if batch else step


def binary(o: Op, fn: Callable, batch: bool = False) -> Step:
    """``fn`` of the two operands; ``batch``: as :func:`unary`'s."""
    (a, b), (out,) = o.ins, o.outs

    def step(fr: Frame) -> None:
        r = fr.regs
        r[out] = fn(r[a], r[b])
    return _batchable(step, o, fn) if batch else step


def _batchable(step: Step, o: Op, fn: Callable) -> Step:
    types = o.in_types + o.out_types
    if any(t.kind not in ("scalar", "vector") for t in types):
        return step
    step.elementwise = Elementwise(  # type: ignore[attr-defined]
        (o.name, fn, tuple(t.text for t in types)), fn,
        tuple(tuple(t.shape) if t.kind == "vector" else () for t in o.in_types))
    return step


def ternary(o: Op, fn: Callable) -> Step:
    (a, b, c), (out,) = o.ins, o.outs

    def step(fr: Frame) -> None:
        r = fr.regs
        r[out] = fn(r[a], r[b], r[c])
    return step


def const_array(value: np.ndarray) -> np.ndarray:
    value = np.asarray(value)
    value.setflags(write=False)
    return value


def thread_axis(cond: np.ndarray, vrank: int) -> np.ndarray:
    """A per-thread (T,) array shaped to broadcast against (T, *vector_shape)."""
    return cond.reshape(cond.shape + (1,) * vrank)
