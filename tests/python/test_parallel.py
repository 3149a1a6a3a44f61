"""dequantd._parallel.run_all: every client path that runs calls on several threads stops the same
way, so its stopping rule is pinned here without a server."""

import signal
import sys
import threading
import time

import pytest

from dequantd._parallel import CallGroup, current_group, run_all


def test_every_item_runs_once_when_nothing_fails():
    seen, lock = [], threading.Lock()

    def record(item):
        with lock:
            seen.append(item)

    run_all(record, range(100), 8)
    assert sorted(seen) == list(range(100))


def test_one_thread_starts_no_item_after_the_first_failure():
    started = []

    def fail_at_five(item):
        started.append(item)
        if item == 5:
            raise ValueError(f"item {item}")

    with pytest.raises(ValueError, match="item 5"):
        run_all(fail_at_five, range(60), 1)
    assert started == [0, 1, 2, 3, 4, 5]


def test_the_failure_that_stopped_the_run_is_raised_not_what_followed_it():
    # Item 1 fails first; item 0 fails afterwards (as a call cancelled by the stop would, with
    # CANCELLED): raised is item 1's, the cause. Two failures before any stop: item order.
    one_failed = threading.Event()
    finished = []

    def call(item):
        if item == 1:
            one_failed.set()
            raise KeyError("second")
        if item == 0:
            assert one_failed.wait(10)
            group = current_group()
            for _ in range(10_000):  # until item 1's failure has stopped the run
                if group.cancelled:
                    break
                time.sleep(0.001)
            assert group.cancelled
            finished.append(0)
            raise ValueError("first")

    with pytest.raises(KeyError, match="second"):
        run_all(call, [0, 1, 2, 3], 2)
    assert finished == [0]

    both_started = threading.Barrier(2)

    def both_fail(item):
        both_started.wait(10)
        raise ValueError(f"item {item}")

    with pytest.raises(ValueError, match="item [01]"):
        run_all(both_fail, [0, 1], 2)


def test_zero_threads_means_one():
    seen = []
    run_all(seen.append, [3, 1, 2], 0)
    assert seen == [3, 1, 2]


class StalledCall:
    """A streamed RPC whose server stopped answering: it ends only when cancelled."""

    def __init__(self):
        self.cancelled = threading.Event()

    def cancel(self):
        self.cancelled.set()
        return True


def test_an_interrupted_caller_cancels_the_streams_in_flight_and_no_worker_is_left():
    # Every worker's call hangs until cancelled (a stopped server, no stream deadline). The
    # caller's thread gets KeyboardInterrupt: run_all cancels the calls its workers registered
    # (Client._stream does so through current_group()), the workers end, and the interrupt
    # reaches the caller; a call registered after that is cancelled at once.
    calls, started = [], threading.Semaphore(0)

    def stalled(_item):
        call = StalledCall()
        calls.append(call)
        current_group().add(call)
        started.release()
        assert call.cancelled.wait(30), "never cancelled"

    main = threading.main_thread().ident

    def interrupt():  # SIGINT to the main thread, as a terminal's Ctrl-C, once it waits
        for _ in range(4):
            started.acquire()
        while sys._current_frames()[main].f_code.co_name != "wait":  # pylint: disable=protected-access
            time.sleep(0.01)
        time.sleep(0.05)  # into the lock's wait, which the signal interrupts
        signal.pthread_kill(main, signal.SIGINT)

    before = threading.active_count()
    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        run_all(stalled, range(4), 4)
    interrupter.join()
    assert len(calls) == 4 and all(c.cancelled.is_set() for c in calls)
    assert threading.active_count() <= before  # the pool's threads have ended
    assert current_group() is None  # not a worker
    late = StalledCall()
    group = CallGroup()
    group.cancel()
    group.add(late)
    assert late.cancelled.is_set()


def test_a_failing_call_cancels_the_others_in_flight_and_is_the_one_raised():
    # A stalled sibling (a server that stopped answering) would otherwise keep the run, and the
    # caller, waiting for ever: the first failure cancels it, and its CANCELLED is not raised.
    registered = threading.Event()

    def work(item):
        if item == 0:
            call = StalledCall()
            current_group().add(call)
            registered.set()
            assert call.cancelled.wait(30), "never cancelled"
            raise RuntimeError("CANCELLED")
        assert registered.wait(10)
        raise ValueError("item 1")

    with pytest.raises(ValueError, match="item 1"):
        run_all(work, range(2), 2)
