"""Warp specialization: producer / consumer warpgroups and their register budgets (``setmaxnreg``, sm_90a).

A warp-specialized kernel runs ``producers + consumers`` warpgroups of 128 threads; warpgroup ids below
``producers`` issue copies (few registers), the others compute (many registers). ``setmaxnreg.{dec,inc}`` moves the
registers between them at run time. Facts it relies on (PTX ISA ``setmaxnreg``; NVIDIA's Hopper tuning notes):

* the count is a multiple of 8 in [24, 256]; all warps of a warpgroup execute the same ``setmaxnreg``;
* it only takes effect when the kernel has a register cap at entry (``__launch_bounds__(threads, 1)``: the kernel
  asks for ``tirx.launch_bounds_min_blocks_per_sm`` 1, see :meth:`WarpgroupRoles.launch_attr`) and each role is one
  branch of a single if / else (ptxas warns C7508 and ignores it otherwise);
* the budgets must fit what the CTA was given at launch: ``producers x producer_regs + consumers x consumer_regs``
  <= ``warpgroups x entry_regs`` (``entry_regs`` = 65536 / threads rounded down to 8). ``setmaxnreg.inc`` only takes
  registers that a ``dec`` released in the same CTA; asking for more blocks the consumers forever (measured on the
  H100: 1 x 40 + 4 x 112 with 640 threads, entry 96 registers, hung) -- the check below is that rule, not the
  register file size.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedConfigError
from .stmt import emit

__all__ = ["WarpgroupRoles", "REGISTER_FILE"]

#: 32-bit registers per SM (and at most per CTA) on sm_90
REGISTER_FILE = 65536


@dataclass(frozen=True)
class WarpgroupRoles:
    """``producers`` copy warpgroups (ids 0..producers-1) with ``producer_regs`` registers per thread, then
    ``consumers`` math warpgroups with ``consumer_regs``."""

    producers: int = 1
    consumers: int = 2
    producer_regs: int = 40
    consumer_regs: int = 232

    def __post_init__(self):
        if self.producers < 1 or self.consumers < 1 or self.producers + self.consumers > 8:
            raise UnsupportedConfigError(f"producers={self.producers}, consumers={self.consumers}: need >= 1 of "
                                         f"each and at most 8 warpgroups (1024 threads)")
        for name in ("producer_regs", "consumer_regs"):
            v = getattr(self, name)
            if not isinstance(v, int) or v % 8 or not 24 <= v <= 256:
                raise UnsupportedConfigError(f"{name}={v!r}: setmaxnreg takes a multiple of 8 in [24, 256]")
        if self.producer_regs > self.consumer_regs:
            raise UnsupportedConfigError(f"producer_regs={self.producer_regs} > consumer_regs={self.consumer_regs}: "
                                         f"producers give registers to consumers, not the reverse")
        total = 128 * (self.producers * self.producer_regs + self.consumers * self.consumer_regs)
        given = self.threads * self.entry_regs
        if total > given:
            # setmaxnreg.inc waits for registers a dec released; more than the launch allocation never comes
            most = (given // 128 - self.producers * self.producer_regs) // self.consumers // 8 * 8
            raise UnsupportedConfigError(
                f"register budget {total} > {given} per CTA (the launch allocation: {self.threads} threads x "
                f"{self.entry_regs} registers): 128 x ({self.producers} x {self.producer_regs} + {self.consumers} x "
                f"{self.consumer_regs}); with {self.producer_regs} producer registers the consumers can have at most "
                f"{most} (setmaxnreg.inc beyond it hangs)")

    @property
    def warpgroups(self) -> int:
        return self.producers + self.consumers

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    @property
    def entry_regs(self) -> int:
        """Registers per thread the kernel starts with under ``__launch_bounds__(threads, 1)`` (multiple of 8)."""
        return min(255, REGISTER_FILE // self.threads // 8 * 8)

    @staticmethod
    def launch_attr() -> dict:
        """The kernel attribute that gives the kernel a register cap at entry (``__launch_bounds__(threads, 1)``);
        pass it to ``T.attr`` right after ``T.device_entry()``."""
        return {"tirx.launch_bounds_min_blocks_per_sm": 1}

    def is_producer(self, wg):
        return wg < self.producers

    def consumer_index(self, wg):
        """0-based index of consumer warpgroup ``wg``."""
        return wg - self.producers

    def producer_setup(self) -> None:
        """First statement of the producer branch: ``setmaxnreg.dec`` to ``producer_regs``."""
        from tvm.script import tirx as T

        emit(T.ptx[f"setmaxnreg.dec.sync.aligned.u32"](self.producer_regs))

    def consumer_setup(self) -> None:
        """First statement of the consumer branch: ``setmaxnreg.inc`` to ``consumer_regs``."""
        from tvm.script import tirx as T

        emit(T.ptx[f"setmaxnreg.inc.sync.aligned.u32"](self.consumer_regs))
