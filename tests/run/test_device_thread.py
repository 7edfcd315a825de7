"""Every CPU device's torch work runs on the device's one thread."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from renderq.backends.device import device_thread, on_device


def test_calls_from_any_thread_run_on_the_device_thread_in_turn() -> None:
    seen: list[int] = []
    running = threading.Semaphore(1)

    def work() -> int:
        assert running.acquire(blocking=False), "two calls ran at once on one device"
        seen.append(threading.get_ident())
        running.release()
        return len(seen)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: on_device("cpu", work), range(40)))
    thread = device_thread("cpu")
    assert thread is not None
    assert set(seen) == {thread.ident}
    assert sorted(results) == list(range(1, 41))
    assert threading.get_ident() != thread.ident


def test_each_cpu_device_has_its_own_thread_and_other_devices_run_in_place() -> None:
    a, b = device_thread("cpu"), device_thread("cpu:1")
    assert a is not None and b is not None and a is not b
    assert device_thread("cpu") is a
    assert device_thread("cuda:0") is None
    assert on_device("cuda:0", threading.get_ident) == threading.get_ident()


def test_nested_calls_run_inline_and_errors_reach_the_caller() -> None:
    inner = on_device("cpu", lambda: on_device("cpu", threading.get_ident))
    thread = device_thread("cpu")
    assert thread is not None and inner == thread.ident

    def boom() -> None:
        raise MemoryError("out of memory on the device")

    with pytest.raises(MemoryError, match="out of memory"):
        on_device("cpu", boom)
    # The thread survives a failed call.
    assert on_device("cpu", lambda: 7) == 7
