"""smalti's Blackwell (sm_100a) plugin: tcgen05 MMA and tensor memory.

Registered through the ``smalti`` entry-point group like any other plugin.
Its rules (tcgen05 MMA, TMEM allocation, loads and stores, commit-arrive,
cluster launch control) are not written yet: see the project's Blackwell
issue. Until then it registers nothing.
"""

SMALTI_HOOK_VERSION = 1
