"""smalti's architecture-neutral plugin: rules for ops every GPU has.

Registered, like any third-party plugin, through the ``smalti`` entry-point
group (see ``pyproject.toml``).
"""

from __future__ import annotations

from smalti.hookspec import hookimpl
from smalti.plugins import (
    ampere_mma,
    barriers,
    control_flow,
    custom_primitive,
    elementwise,
    hints,
    layout_ops,
    memory,
    multimem,
    printing,
    transfers,
    vector_ops,
    warp_map,
)
from smalti.registry import ConstraintRegistry, LoweringRegistry

SMALTI_HOOK_VERSION = 1
# In registration order. Barriers and hints have no vectors: lowering rules only.
_CONSTRAINTS = (elementwise, transfers, layout_ops, vector_ops, control_flow, memory, printing,
                multimem, ampere_mma, custom_primitive, warp_map)
_LOWERINGS = (elementwise, transfers, layout_ops, vector_ops, control_flow, memory, barriers,
              hints, printing, multimem, ampere_mma, custom_primitive, warp_map)


@hookimpl
def smalti_register_constraint_rules(registry: ConstraintRegistry) -> None:
    for module in _CONSTRAINTS:
        module.register_constraints(registry)


@hookimpl
def smalti_register_lowering_rules(registry: LoweringRegistry) -> None:
    # Mosaic GPU ops do not exist past lowering: any left over is an error.
    registry.require_lowering("mosaic_gpu.")
    for module in _LOWERINGS:
        module.register_lowerings(registry)
