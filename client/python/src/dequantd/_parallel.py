"""One way to run a client's calls on several threads: `run_all(fn, items, threads)`.

Every parallel path of the client (ranges of one Dequantize, ReadTensor streams, tensors into
CUDA regions) uses it, so they all stop the same way: the first call that raises ends the run.
No call is started after a failure is seen (a shared flag that each call checks before it
starts, so not even a worker that is already free takes the next item), the calls already
running finish, and the first failure in item order is raised to the caller. When the caller's
own thread is interrupted (KeyboardInterrupt, SystemExit) the streamed RPCs still in flight are
cancelled too (`CallGroup`: Client._stream registers each stream a worker starts), so that the
run ends at once even when the server has stopped answering, not when its calls end.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Callable, Iterable, List, Optional, Set, TypeVar

T = TypeVar("T")

_worker = threading.local()  # .group: the CallGroup of the run_all this thread works for


class CallGroup:
    """The streamed RPCs (grpc call objects) the workers of one run_all have in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Set[Any] = set()
        self._cancelled = False

    def add(self, call: Any) -> None:
        """Tracks `call`; cancels it at once when the group already was."""
        with self._lock:
            if not self._cancelled:
                self._calls.add(call)
                return
        call.cancel()

    def discard(self, call: Any) -> None:
        with self._lock:
            self._calls.discard(call)

    def cancel(self) -> None:
        """Cancels every call in flight and every call added from now on."""
        with self._lock:
            self._cancelled = True
            calls, self._calls = list(self._calls), set()
        for call in calls:
            call.cancel()


def current_group() -> Optional[CallGroup]:
    """The CallGroup of the run_all whose worker this thread is now, else None."""
    return getattr(_worker, "group", None)


def run_all(fn: Callable[[T], None], items: Iterable[T], threads: int) -> None:
    """Calls fn(item) for every item on max(1, threads) threads, in item order of start.

    Raises:
        the first exception (in item order) of a call that failed; after it is seen no
        further call is started. KeyboardInterrupt / SystemExit of the caller's thread, after
        cancelling the streams in flight.
    """
    failed = threading.Event()
    group = CallGroup()

    def guarded(item: T) -> None:
        if failed.is_set():
            return
        _worker.group = group
        try:
            fn(item)
        except BaseException:
            failed.set()
            raise
        finally:
            _worker.group = None

    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
        futures: List["concurrent.futures.Future[None]"] = []
        try:
            for item in items:  # an interrupt may come while the first calls already run
                futures.append(pool.submit(guarded, item))
            for future in futures:
                future.result()
        except BaseException as e:
            if not isinstance(e, Exception):  # the caller's thread, not a call, was stopped
                group.cancel()
            failed.set()
            for future in futures:
                future.cancel()
            raise
