"""Hopper pipeline building blocks: TMA tensor maps and box copies, mbarrier rings, warpgroup roles with register
budgets, and persistent tile scheduling. Each emits exactly the PTX it names while TVMScript parses the kernel, and
validates its configuration in Python first (``mmaemit.errors``), like the mma emitters.

* :class:`TmaTile` (``mmaemit.pipeline.tma``): tensor map = global tensor + box + swizzle; ``encode`` (host),
  ``load`` (-> shared, mbarrier completion, optional multicast), ``store`` (-> global, bulk group), ``bulk_commit``,
  ``bulk_wait``.
* :class:`CpAsyncTile` (``mmaemit.pipeline.cp_async``): the sm_80 counterpart with the same vocabulary (global
  tensor, box, shared layout, coordinates): 16-byte cp.async pieces from every thread, commit / wait groups.
* :class:`MbarrierRing` (``mmaemit.pipeline.mbarrier``): ``stages`` full/empty barrier pairs with phase tracking by a
  running iteration count; ``mbarrier_wait`` / ``mbarrier_arrive`` / ``mbarrier_expect_tx`` / ``mbarrier_init``.
* :class:`WarpgroupRoles` (``mmaemit.pipeline.roles``): producer / consumer warpgroups, ``setmaxnreg`` budgets checked
  against the 64K register file.
* :class:`PersistentTileScheduler` (``mmaemit.pipeline.scheduler``): one CTA / cluster per SM, panel-rasterized tile
  order.
"""
from .cp_async import CpAsyncTile, cp_async_commit, cp_async_wait  # noqa: F401
from .mbarrier import MbarrierRing, mbarrier_arrive, mbarrier_expect_tx, mbarrier_init, mbarrier_wait  # noqa: F401
from .roles import WarpgroupRoles  # noqa: F401
from .scheduler import PersistentTileScheduler, StreamKScheduler  # noqa: F401
from .tma import TmaTile, bulk_commit, bulk_wait  # noqa: F401

__all__ = ["CpAsyncTile", "cp_async_commit", "cp_async_wait", "TmaTile", "bulk_commit", "bulk_wait", "MbarrierRing", "mbarrier_wait", "mbarrier_arrive",
           "mbarrier_expect_tx", "mbarrier_init", "WarpgroupRoles", "PersistentTileScheduler"]
