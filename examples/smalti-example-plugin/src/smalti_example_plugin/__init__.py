"""smalti_example_plugin: a third-party smalti plugin, end to end.

- a new op, ``smalti_example.fma`` (:mod:`.fused`), with its constraint and
  lowering rules;
- the same op for Pallas users as :func:`fma` (:mod:`.pallas`);
- a new constraint, :class:`Vectorized` (:mod:`.vectorized`);
- an override of the built-in lowering of ``arith.cmpf`` (:mod:`.cmpf`).

smalti finds this module through the ``smalti`` entry point of the
distribution; nothing needs to import it but the kernels that call :func:`fma`.
"""

from __future__ import annotations

import smalti
from smalti.registry import ConstraintRegistry, LoweringRegistry, PallasRegistry
from smalti_example_plugin import cmpf, fused, pallas
from smalti_example_plugin.fused import OP_NAME, fma_op
from smalti_example_plugin.pallas import fma, fma_p
from smalti_example_plugin.vectorized import Vectorized

__all__ = ["OP_NAME", "Vectorized", "fma", "fma_op", "fma_p"]
__version__ = "0.1.0"

#: The version of smalti's hook specification this plugin was written for.
SMALTI_HOOK_VERSION = 1

#: The plugin whose rule the override replaces.
BUILTIN = "smalti.plugins"


@smalti.hookimpl
def smalti_register_constraint_rules(registry: ConstraintRegistry) -> None:
    registry.constraint_rule(OP_NAME)(fused.fma_constraints)


@smalti.hookimpl
def smalti_register_lowering_rules(registry: LoweringRegistry) -> None:
    registry.lowering_rule(OP_NAME)(fused.lower_fma)
    # A real override: in force whenever smalti.plugins is installed too.
    registry.lowering_rule("arith.cmpf", overrides=BUILTIN)(cmpf.lower_cmpf)


@smalti.hookimpl
def smalti_register_pallas_lowerings(registry: PallasRegistry) -> None:
    registry.pallas_lowering(fma_p)(pallas.lower_fma_primitive)
