"""One way to run a client's calls on several threads: `run_all(fn, items, threads)`.

Every parallel path of the client (ranges of one Dequantize, ReadTensor streams, tensors into
CUDA regions) uses it, so they all stop the same way: the first call that raises ends the run.
No call is started after a failure is seen (a shared flag that each call checks before it
starts, so not even a worker that is already free takes the next item), the calls already
running finish, and the first failure in item order is raised to the caller.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")


def run_all(fn: Callable[[T], None], items: Iterable[T], threads: int) -> None:
    """Calls fn(item) for every item on max(1, threads) threads, in item order of start.

    Raises:
        the first exception (in item order) of a call that failed; after it is seen no
        further call is started.
    """
    failed = threading.Event()

    def guarded(item: T) -> None:
        if failed.is_set():
            return
        try:
            fn(item)
        except BaseException:
            failed.set()
            raise

    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
        futures = [pool.submit(guarded, item) for item in items]
        try:
            for future in futures:
                future.result()
        except BaseException:
            failed.set()  # also when the caller's thread is interrupted
            for future in futures:
                future.cancel()
            raise
