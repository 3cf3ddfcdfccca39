"""Helpers shared by the rule modules."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..compiler import Op, Step
from ..machine import Frame


def unary(o: Op, fn: Callable) -> Step:
    (a,), (out,) = o.ins, o.outs

    def step(fr: Frame) -> None:
        r = fr.regs
        r[out] = fn(r[a])
    return step


def binary(o: Op, fn: Callable) -> Step:
    (a, b), (out,) = o.ins, o.outs

    def step(fr: Frame) -> None:
        r = fr.regs
        r[out] = fn(r[a], r[b])
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
