"""smalti's architecture-neutral plugin: rules for ops every GPU has.

Registered, like any third-party plugin, through the ``smalti`` entry-point
group (see ``pyproject.toml``).
"""

from __future__ import annotations

from smalti.hookspec import hookimpl
from smalti.registry import ConstraintRegistry, LoweringRegistry

from smalti.plugins import (
    control_flow,
    elementwise,
    layout_ops,
    memory,
    misc_ops,
    transfers,
    vector_ops,
)

SMALTI_HOOK_VERSION = 1
_MODULES = (elementwise, transfers, layout_ops, vector_ops, control_flow, memory, misc_ops)


@hookimpl
def smalti_register_constraint_rules(registry: ConstraintRegistry) -> None:
    for module in _MODULES:
        module.register_constraints(registry)


@hookimpl
def smalti_register_lowering_rules(registry: LoweringRegistry) -> None:
    # Mosaic GPU ops do not exist past lowering: any left over is an error.
    registry.require_lowering("mosaic_gpu.")
    for module in _MODULES:
        module.register_lowerings(registry)
