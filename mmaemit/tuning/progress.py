"""The tuning progress bar (tqdm): one step per candidate whose fate is known, with compiled / timed / skipped counts.

    autotune gemm M=4096 N=4096 K=4096:  75%|███████▌  | 9/12 [00:11<00:03, compiled 12, timed 8, skipped 1]

Written to stderr (or the file given); ``enabled=False`` or ``MMAEMIT_AUTOTUNE_PROGRESS=0`` silences it.
"""
from __future__ import annotations

import os
import sys

__all__ = ["Progress"]


class Progress:
    def __init__(self, total: int, desc: str, enabled=True, file=None):
        self.compiled = self.timed = self.skipped = 0
        self.file = file if file is not None else sys.stderr
        if os.environ.get("MMAEMIT_AUTOTUNE_PROGRESS", "1") == "0":
            enabled = False
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:  # a declared dependency; without it tuning still runs, with the summary line only
                print(f"{desc}: {total} candidates (install tqdm for a progress bar)", file=self.file, flush=True)
                return

            self._bar = tqdm(total=total, desc=desc, file=self.file, leave=True, dynamic_ncols=False, ncols=110,
                             mininterval=0.2, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                                                         "[{elapsed}<{remaining}{postfix}]")
            self._refresh()

    def _refresh(self):
        if self._bar is not None:
            self._bar.set_postfix_str(f"compiled {self.compiled}, timed {self.timed}, skipped {self.skipped}",
                                      refresh=True)

    def on_compiled(self):
        self.compiled += 1
        self._refresh()

    def on_timed(self):
        self.timed += 1
        if self._bar is not None:
            self._bar.update(1)
        self._refresh()

    def on_skipped(self):
        self.skipped += 1
        if self._bar is not None:
            self._bar.update(1)
        self._refresh()

    def timed_then_skipped(self):
        """A timed candidate failed its confirmation run: it moves from timed to skipped."""
        self.timed -= 1
        self.skipped += 1
        self._refresh()

    def write(self, text: str):
        if self._bar is not None:
            self._bar.write(text, file=self.file)

    def close(self):
        if self._bar is not None:
            self._refresh()
            self._bar.close()
