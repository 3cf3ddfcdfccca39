"""The two ways emulation stops early."""

from __future__ import annotations


class Unsupported(NotImplementedError):
    """Something the emulator does not model: an op, an inline-asm string, an
    intrinsic, an attribute value or a memory-space behaviour. The message
    names it and its source location. Raised instead of guessing: the emulator
    never returns an answer it cannot vouch for."""

    def __init__(self, what: str, where: str = "") -> None:
        self.what = what
        self.where = where
        super().__init__(f"{what}" + (f" at {where}" if where else ""))


class EmulationError(RuntimeError):
    """The kernel did something that is an error on the GPU too (an access
    outside every buffer, a misaligned access, a barrier over-arrived), or the
    inputs do not match the kernel."""
