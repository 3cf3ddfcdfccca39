"""smalti's Hopper (sm_90a) plugin: TMA and WGMMA.

Registered through the ``smalti`` entry-point group like any other plugin.
Its rules (TMA copies, expect-tx barriers, ``async_store_smem``, WGMMA)
are not written yet: see the project's Hopper issue. Until then it registers
nothing, and kernels using those ops fail with SM003/SM004 naming the op.
"""

SMALTI_HOOK_VERSION = 1
