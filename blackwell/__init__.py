"""smalti's Blackwell (sm_100a) plugin: tcgen05 MMA and tensor memory.

Registered through the ``smalti`` entry-point group like any other plugin.
tcgen05 and TMEM exist on the data-center Blackwell family (sm_100 to
sm_110), not on sm_120; cluster launch control exists from sm_100 on
(:mod:`smalti.blackwell.archs`).

As in :mod:`smalti.plugins`, each module registers its own rules, at its end
(``register_constraints`` and ``register_lowerings``, each taking the
registry); the hooks below only call them, module by module.
"""

from __future__ import annotations

from smalti.blackwell import cluster_launch_control, mma, smem_to_tmem, tmem
from smalti.hookspec import hookimpl
from smalti.registry import ConstraintRegistry, LoweringRegistry

SMALTI_HOOK_VERSION = 1
# In registration order.
_RULE_MODULES = (tmem, smem_to_tmem, mma, cluster_launch_control)


@hookimpl
def smalti_register_constraint_rules(registry: ConstraintRegistry) -> None:
    for module in _RULE_MODULES:
        module.register_constraints(registry)


@hookimpl
def smalti_register_lowering_rules(registry: LoweringRegistry) -> None:
    for module in _RULE_MODULES:
        module.register_lowerings(registry)
