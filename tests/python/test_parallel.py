"""dequantd._parallel.run_all: every client path that runs calls on several threads stops the same
way, so its stopping rule is pinned here without a server."""

import threading

import pytest

from dequantd._parallel import run_all


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


def test_the_first_failure_in_item_order_is_raised_and_the_running_calls_finish():
    # Item 0 waits until item 1 has failed, then fails itself: both failures happen, and the one
    # raised is item 0's (item order), after item 0's call has finished.
    one_failed = threading.Event()
    finished = []

    def call(item):
        if item == 1:
            one_failed.set()
            raise KeyError("second")
        if item == 0:
            assert one_failed.wait(10)
            finished.append(0)
            raise ValueError("first")

    with pytest.raises(ValueError, match="first"):
        run_all(call, [0, 1, 2, 3], 2)
    assert finished == [0]


def test_zero_threads_means_one():
    seen = []
    run_all(seen.append, [3, 1, 2], 0)
    assert seen == [3, 1, 2]
