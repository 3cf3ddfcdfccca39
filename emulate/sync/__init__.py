"""The synchronization checker: an asynchronous memory model and a race
detector over the generated code.

The emulator executes each warpgroup in lockstep and completes asynchronous
copies and MMAs when they are issued; that fixes *one* schedule. Beside it,
the checker keeps what the PTX memory model says is *ordered*, so its verdict
does not depend on that schedule:

* **Agents.** Every warp is an agent with a vector clock
  (:mod:`.clocks`); program order advances nothing by itself, a warp's own
  time advances when it releases (arrives somewhere). Threads of one warp
  are one agent: a converged warp's instructions are ordered (what jax's and
  CUTLASS's warp-level code relies on). Asynchronous units -- a TMA transfer
  completing on an mbarrier, a thread's bulk async-groups (TMA stores, bulk
  copies; their reads and their writes apart), a warpgroup's WGMMA groups,
  ``st.async`` -- record their accesses under a *component* of their own,
  with a value that waits for them complete in order.
* **Happens-before.** ``bar.sync``/``barrier.sync``/``gpu.barrier`` and
  named barriers join the clocks of the warps they count; an mbarrier
  arrival releases the arriving warp's clock into the phase in progress, a
  transfer's ``complete_tx`` adds its component, and a successful
  ``try_wait`` on the phase acquires what the completed phase holds (also
  across blocks of a cluster: an arrival on a peer's barrier orders the
  arriving threads' earlier accesses before the accesses after the wait, as
  jax's ``ClusterBarrier`` relies on); ``barrier.cluster.arrive`` (not
  ``.relaxed``) releases and ``barrier.cluster.wait`` acquires;
  ``cp.async.bulk.wait_group[.read] N`` makes the waiting thread know its
  groups but the newest N (reads only, with ``.read``); ``wgmma.wait_group N``
  likewise for the warpgroup's WGMMAs.
* **Proxies.** TMA and WGMMA read SMEM through the async proxy: a thread's
  generic write is visible to them only if the thread executed
  ``fence.proxy.async`` after it and that fence is ordered before the issue
  (what ``plgpu.commit_smem()`` emits). Writes by asynchronous units need no
  fence before a thread reads them after the wait.
* **Shadow memory** (:mod:`.shadow`): per byte of every kernel argument and
  every block's SMEM, the last write and each component's last read. An
  access that conflicts (same bytes, one a write) with one not ordered
  before it is a :class:`~.reports.Race`, reported with both ops, their
  source lines, agents, the buffer and byte range, and a fix.
* Reads of SMEM no write of the launch initialized are
  :class:`~.reports.UninitializedRead`; accesses outside every buffer
  :class:`~.reports.OutOfBounds`; a barrier only part of the threads it
  counts reach :class:`~.reports.BarrierDivergence`; an mbarrier arrived at
  beyond its count :class:`~.reports.MBarrierOverArrival`; warpgroups all
  waiting for each other :class:`~.reports.Deadlock`.

* **Through memory** (:mod:`.memory_order`): atomics with release and
  acquire semantics (and fences around relaxed ones) order what a
  semaphore hands from one warpgroup, block or cluster to another. Blocks
  of different clusters are ordered only so: any other conflict between
  them is a race.

The reports' classes are public as :mod:`smalti.emulate`'s (they live in
:mod:`.reports`).
"""
