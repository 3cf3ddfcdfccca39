"""Where Blackwell's instructions exist: the architecture ranges (and the
options built on them) that the rule modules of :mod:`smalti.blackwell`
register with.

tcgen05 and TMEM exist on the data-center Blackwell family (sm_100 to
sm_110), not on sm_120; cluster launch control exists from sm_100 on
(:data:`smalti.registry.BLACKWELL_AND_LATER`).
"""

from __future__ import annotations

from smalti.registry import Architectures, LoweringOptions

#: Where tcgen05 and tensor memory exist.
TCGEN05 = Architectures(minimum=(10, 0), maximum=(11, 0))

#: A tcgen05 lowering rule whose op may also be issued by a single warp
#: (inside ``mosaic_gpu.warp_map``), as jax allows for views, SMEM-to-TMEM
#: copies, MMAs and commits.
TCGEN05_WARP_ISSUED: LoweringOptions = {"archs": TCGEN05, "warp_semantics": True}
