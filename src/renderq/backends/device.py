"""One thread per CPU device: all of a CPU device's torch work runs on it.

torch's CPU kernels run on an OpenMP thread team, and with GNU OpenMP every thread that
starts parallel work keeps a team of its own for as long as it lives. Once the teams in a
process hold more threads than there are cores, the library stops letting idle team
threads spin between kernels and puts them to sleep instead, and every kernel then waits
for its team to be woken. A pipeline with thousands of small kernels (every diffusion
step, the VAE, a CLIP scorer) slows down by a third or more: on a 2-core machine, with the
models loaded on the main thread, rendering on a worker thread and scoring on a third,
mini-SD batches of 16 took 1.4-1.5 times as long in the engine as run directly, the cores
a quarter idle (``python benchmarks/engine_batches.py --without-device-thread``).

So the loading, rendering and scoring for a CPU device all go through :func:`on_device`,
which runs them on that device's one thread: one team, full speed, and stages sharing
the device take turns on it by construction. Other devices (CUDA) run their calls where
they are made: their kernels are queued on streams, not run by thread teams.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class DeviceThread:
    """A daemon thread that runs submitted calls one at a time, in order."""

    def __init__(self, name: str) -> None:
        """Start the thread (named ``name``)."""
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        """The thread's identifier."""
        return self._thread.ident

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on this thread and return its result (or raise its exception).

        A call made from this thread itself runs at once (no deadlock on nesting).
        """
        if threading.current_thread() is self._thread:
            return fn()
        fut: Future[T] = Future()
        self._jobs.put((fn, fut))
        return fut.result()

    def _loop(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller, never lost
                fut.set_exception(exc)


_THREADS: dict[str, DeviceThread] = {}
_LOCK = threading.Lock()


def device_thread(device: str) -> DeviceThread | None:
    """The thread of a CPU device (``cpu``, ``cpu:0``...), created on first use; else None."""
    if not device.startswith("cpu"):
        return None
    with _LOCK:
        if device not in _THREADS:
            _THREADS[device] = DeviceThread(f"renderq-{device}")
        return _THREADS[device]


def on_device(device: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on ``device``'s thread if it is a CPU device, else right here."""
    thread = device_thread(device)
    return fn() if thread is None else thread.call(fn)
