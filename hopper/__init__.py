"""smalti's Hopper (sm_90a) plugin: TMA copies, expect-tx barriers,
``async_store_smem`` and WGMMA.

Registered through the ``smalti`` entry-point group like any other plugin.
TMA rules hold from sm_90 on (Blackwell has TMA too); WGMMA exists on sm_90a
only.

As in :mod:`smalti.plugins`, each module registers its own rules, at its end
(``register_constraints``, ``register_lowerings`` and, where it has any,
``register_pallas_lowerings``, each taking the registry); the hooks below
only call them, module by module.
"""

from __future__ import annotations

from smalti.hookspec import hookimpl
from smalti.hopper import smem_stores, tma, wgmma
from smalti.registry import ConstraintRegistry, LoweringRegistry, PallasRegistry

SMALTI_HOOK_VERSION = 1
# In registration order.
_RULE_MODULES = (tma, smem_stores, wgmma)
_PALLAS_MODULES = (smem_stores,)


@hookimpl
def smalti_register_constraint_rules(registry: ConstraintRegistry) -> None:
    for module in _RULE_MODULES:
        module.register_constraints(registry)


@hookimpl
def smalti_register_lowering_rules(registry: LoweringRegistry) -> None:
    for module in _RULE_MODULES:
        module.register_lowerings(registry)


@hookimpl
def smalti_register_pallas_lowerings(registry: PallasRegistry) -> None:
    for module in _PALLAS_MODULES:
        module.register_pallas_lowerings(registry)
