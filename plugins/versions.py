"""The jax version ranges of smalti's built-in rules.

Where jax 0.12 changed what a rule must emit, the rule is registered twice —
``jax=BEFORE_0_12`` and ``jax=SINCE_0_12`` — and the pipeline keeps the one
for the installed jax when it is built.
"""

from __future__ import annotations

from smalti.registry import JaxVersions

BEFORE_0_12 = JaxVersions(before="0.12")
SINCE_0_12 = JaxVersions(since="0.12")
