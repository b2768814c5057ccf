"""The process's long-lived heap, kept out of the cyclic garbage collector's way."""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """Move every object alive now (modules, catalogs, the planning's tables, clients) out of
    the cyclic garbage collector's reach, once a worker's warm-up built them: they live as
    long as the process, and every full collection rescanned them all. In
    ``bench/control_loop.py`` a third of a tick's CPU went to collections that the tick's
    own allocations triggered. (The API's process showed no gain in ``bench/api_submit``.)"""
    gc.collect()
    gc.freeze()
