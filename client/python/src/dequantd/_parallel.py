"""One way to run a client's calls on several threads: `run_all(fn, items, threads)`.

Every parallel path of the client (ranges of one Dequantize, ReadTensor streams, tensors into
CUDA regions) uses it, so they all stop the same way: the first call that raises ends the run.
No call is started after a failure is seen (a shared flag that each call checks before it
starts, so not even a worker that is already free takes the next item), and the RPCs still in
flight are cancelled (`CallGroup`: Client._stream and Client._unary register each RPC a worker
starts), so a run ends at once even where the server has stopped answering. Raised is the first
failure in item order among the calls that failed before the run was stopped (a call that fails
afterwards, typically CANCELLED, is a consequence, not the cause). When the caller's own thread
is interrupted (KeyboardInterrupt, SystemExit) the RPCs in flight are cancelled the same way and
the interrupt is raised once the workers have ended.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Callable, Iterable, List, Optional, Set, TypeVar

T = TypeVar("T")

_worker = threading.local()  # .group: the CallGroup of the run_all this thread works for


class CallGroup:
    """The RPCs (grpc call or future objects) the workers of one run_all have in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Set[Any] = set()
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        with self._lock:
            return self._cancelled

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
        the first exception, in item order, of a call that failed before the run was stopped;
        after it no further call is started and the RPCs in flight are cancelled.
        KeyboardInterrupt / SystemExit of the caller's thread, after cancelling them.
    """
    group = CallGroup()  # cancelled: the run is stopped (a call failed or the caller stopped)
    after_stop: Set[int] = set()  # items whose failure came after the run was stopped

    def guarded(index: int, item: T) -> None:
        if group.cancelled:
            return
        _worker.group = group
        try:
            fn(item)
        except BaseException:
            if group.cancelled:
                after_stop.add(index)
            group.cancel()
            raise
        finally:
            _worker.group = None

    pool = concurrent.futures.ThreadPoolExecutor(max(1, threads))
    futures: List["concurrent.futures.Future[None]"] = []
    try:
        for index, item in enumerate(items):  # an interrupt may come while calls already run
            futures.append(pool.submit(guarded, index, item))
        concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        if group.cancelled:
            for future in futures:
                future.cancel()
            concurrent.futures.wait(futures)  # the cancelled RPCs end their calls
            errors = [(i, f.exception()) for i, f in enumerate(futures)
                      if not f.cancelled() and f.exception() is not None]
            cause = [e for i, e in errors if i not in after_stop] or [e for _, e in errors]
            raise cause[0]
    except BaseException:
        group.cancel()
        for future in futures:
            future.cancel()
        raise
    finally:
        pool.shutdown(wait=True)  # quick: every RPC still in flight was cancelled
