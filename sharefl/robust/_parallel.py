"""Worker threads for the CPU kernels: blocks of columns spread over a few threads.

torch's intra-op parallelism opens one OpenMP region per operation; on a shared or
oversubscribed machine each region can wait milliseconds for a descheduled thread, so a
loop of small parallel operations over column blocks can cost far more than the work.
The CPU kernels here instead give each thread its own interleaved share of the blocks and
run single-threaded numpy operations on them (numpy releases the GIL): the threads never
wait for each other until the end.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import torch

T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool_in_child() -> None:
    # a forked child has none of the parent's threads: start a fresh pool when needed
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)


def thread_pool() -> ThreadPoolExecutor:
    """The shared worker threads of the CPU kernels (created on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=os.cpu_count() or 1, thread_name_prefix="sharefl-robust"
            )
        return _pool


def over_blocks(d: int, width: int, work: Callable[[Sequence[int]], T]) -> list[T]:
    """Run ``work(starts)`` on interleaved shares of the block starts ``0, width, ...``.

    Uses up to ``torch.get_num_threads()`` threads (one share each; neighbouring blocks go
    to different threads so they stream through memory together) and returns the
    per-share results. numpy floating-point warnings are off inside: ±inf and NaN are part
    of the kernels' contract.
    """
    starts = range(0, d, width)
    shares = max(1, min(torch.get_num_threads(), len(starts)))

    def run(mine: Sequence[int]) -> T:
        with np.errstate(all="ignore"):
            return work(mine)

    if shares == 1:
        return [run(starts)]
    futures = [thread_pool().submit(run, starts[t::shares]) for t in range(shares)]
    return [future.result() for future in futures]
