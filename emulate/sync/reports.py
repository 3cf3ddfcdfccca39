"""What the synchronization checker reports: races, uninitialized reads and
the errors a kernel makes on the GPU too, each naming the op and its source
line (both, where two accesses conflict) and a fix."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import EmulationError

RACE_KINDS = ("read-after-write", "write-after-read", "write-after-write")
POLICIES = ("raise", "warn", "ignore")

_FILE_LINE = re.compile(r'"([^"]+)":(\d+):\d+')
_NAME = re.compile(r'loc\("([^"]+?):?"\(')


def source_line(location: str) -> str:
    """``file:line`` of the innermost source frame an MLIR location names (the
    Pallas or Mosaic GPU line an op came from), or the location as printed."""
    m = _FILE_LINE.search(location)
    return f"{m.group(1)}:{m.group(2)}" if m else location


def primitive_name(location: str) -> str:
    """The name a Pallas location carries (``swap``, ``copy_smem_to_gmem``), or ''."""
    m = _NAME.match(location)
    return m.group(1) if m else ""


@dataclass(frozen=True)
class Access:
    """One side of a conflict: who touched which bytes, by which op, where."""

    op: str  # the Lane-level op or PTX instruction
    location: str  # file:line of the kernel source
    agent: str  # "block (0, 0, 0) warpgroup 0 warp 1", or "TMA ...", "WGMMA ..."
    is_write: bool
    allocation: str  # the buffer: "block (0, 0, 0) SMEM", "kernel argument 1"
    start: int  # byte offsets into the allocation, [start, stop)
    stop: int
    primitive: str = ""  # the Pallas primitive the location names, if any

    def describe(self) -> str:
        what = "write" if self.is_write else "read"
        prim = f" ({self.primitive})" if self.primitive else ""
        return (f"{what} of {self.allocation} bytes [{self.start}, {self.stop}) by {self.agent}: "
                f"{self.op} at {self.location}{prim}")


@dataclass(frozen=True)
class Race:
    """Two accesses to the same bytes, at least one a write, that no
    synchronization orders. ``first`` is the one the emulator executed first."""

    kind: str  # one of RACE_KINDS
    space: str  # "smem", "gmem" or "tmem"
    first: Access
    second: Access
    fix: str
    count: int = field(default=1, compare=False)  # executions that hit this pair

    def __str__(self) -> str:
        return (f"data race ({self.kind}, {self.space}): {self.second.describe()}\n"
                f"  conflicts with the unordered {self.first.describe()}\n"
                f"  fix: {self.fix}")


class RaceError(EmulationError):
    """A run found data races; ``races`` lists them (each a :class:`Race`)."""

    def __init__(self, races: list[Race]) -> None:
        self.races = list(races)
        more = f"\n... and {len(races) - 3} more" if len(races) > 3 else ""
        super().__init__(f"{len(races)} data race(s) found:\n"
                         + "\n".join(str(r) for r in races[:3]) + more)


class RaceWarning(UserWarning):
    """One data race, reported under ``on_race="warn"``; ``race`` is the :class:`Race`."""

    def __init__(self, race: Race) -> None:
        self.race = race
        super().__init__(str(race))


class UninitializedRead(EmulationError):
    """A read of SMEM (or TMEM) bytes no write of this launch initialized."""

    def __init__(self, access: Access, space: str) -> None:
        self.access = access
        self.space = space
        self.location = access.location
        super().__init__(
            f"uninitialized read ({space}): {access.describe()}; no write of this launch "
            f"initialized these bytes\n  fix: write (or copy into) the buffer before reading "
            f"it, and order the write before the read")


class UninitializedReadWarning(UserWarning):
    """An :class:`UninitializedRead` reported under ``on_uninitialized="warn"``."""

    def __init__(self, report: UninitializedRead) -> None:
        self.report = report
        super().__init__(str(report))


class OutOfBounds(EmulationError):
    """An access outside every allocation (or running past one's end)."""


class BarrierDivergence(EmulationError):
    """A barrier that not every thread it counts reaches: the GPU hangs or
    behaves undefinedly (``bar.sync`` is ``.aligned``)."""


class MBarrierOverArrival(EmulationError):
    """An mbarrier arrival beyond the count it was initialized with."""


class Deadlock(EmulationError):
    """Every warpgroup still running waits for something none of them can do:
    the kernel hangs on the GPU."""


def check_policy(name: str, value: str) -> str:
    if value not in POLICIES:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(map(repr, POLICIES))}")
    return value
