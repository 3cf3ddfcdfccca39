"""(being written)"""

from __future__ import annotations

from smalti.registry import ConstraintRegistry, LoweringRegistry


def register_constraints(registry: ConstraintRegistry) -> None:
    pass


def register_lowerings(registry: LoweringRegistry) -> None:
    pass
