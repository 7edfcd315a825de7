"""A local device pool: one render worker process per device, each with its own pipeline.

``--devices cuda:0,cuda:1`` (or ``cuda`` for every visible GPU) starts one worker per GPU;
``--devices cpu:1,cpu:1`` starts two CPU workers with one torch thread each. Every worker
is a process of its own (the ``spawn`` start method: no forked CUDA or OpenMP state), so
on CPU each worker's OpenMP team owns its cores instead of fighting another team in the
same process (see :mod:`renderq.backends.device`).

The pool hands the engine one executor per worker (:meth:`DevicePool.executors`); the
scheduler counts the free workers of each device class and cuts every batch, the pool
decides nothing. A worker process that exits while it holds a batch makes its executor
raise :class:`WorkerLost`, so the engine hands the batch back to the queue through the
scheduler's ``on_lost``; the process is started again for the next batch.

A device may name its class after ``=`` (``cuda:0=cuda-a100``), so that a ledger can
price each class; by default a CPU worker's class is ``cpu`` and a GPU's is ``cuda``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from renderq.core.errors import ConfigError, WorkerLost
from renderq.core.protocols import Executor
from renderq.core.types import Batch, BatchResult


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One worker of a pool: its torch device, its CPU threads and its device class.

    ``threads``: torch's thread count in the worker (0: torch's own default).
    """

    device: str
    device_class: str
    threads: int = 0


AUTO = "auto"
"""``--devices auto``: the devices a Ray cluster offers, read when the pool starts. Parsed
into one placeholder spec, ``WorkerSpec(AUTO, CLASS or AUTO, THREADS)``, that the Ray
backend replaces with the cluster's devices (:mod:`renderq.backends.ray_cluster`)."""


def parse_devices(text: str, *, cuda_count: Callable[[], int] | None = None) -> list[WorkerSpec]:
    """Parse ``--devices``: a comma-separated list of ``cpu[:THREADS]``, ``cuda[:N]``, or
    ``auto[:THREADS]`` alone.

    ``cuda`` alone means every visible GPU (``cuda_count`` says how many; torch's count
    by default). Each entry may end in ``=CLASS`` to name its device class. ``auto``
    stands for what the Ray cluster offers (see :data:`AUTO`): ``=CLASS`` keeps only that
    class's devices, ``:THREADS`` sets a CPU actor's threads on a cluster without GPUs.
    """
    specs: list[WorkerSpec] = []
    entries = [e.strip() for e in text.split(",")]
    if not text.strip() or any(not e for e in entries):
        raise ConfigError(f"--devices needs a comma-separated list of devices, got {text!r}")
    for entry in entries:
        device, _, label = entry.partition("=")
        if "=" in entry and not _is_name(label):
            raise ConfigError(f"device class in {entry!r} must be letters, digits, - or _")
        if label == AUTO:
            raise ConfigError(f"--devices entry {entry!r}: {AUTO!r} is not a device class name")
        name, _, arg = device.partition(":")
        if name == AUTO:
            if len(entries) > 1:
                raise ConfigError(f"--devices {text!r}: {AUTO!r} stands alone")
            threads = _number(arg, entry, "threads") if arg else 1
            return [WorkerSpec(AUTO, label or AUTO, threads)]
        if name == "cpu":
            threads = _number(arg, entry, "threads") if arg else 0
            specs.append(WorkerSpec("cpu", label or "cpu", threads))
        elif name == "cuda" and arg:
            specs.append(
                WorkerSpec(f"cuda:{_number(arg, entry, 'GPU index', low=0)}", label or "cuda")
            )
        elif name == "cuda":
            count = (cuda_count or _cuda_count)()
            if count < 1:
                raise ConfigError(f"--devices {entry!r}: no CUDA device is visible")
            specs.extend(WorkerSpec(f"cuda:{i}", label or "cuda") for i in range(count))
        else:
            raise ConfigError(
                f"--devices entry {entry!r} is not cpu[:THREADS], cuda[:N] or auto[:THREADS]"
            )
    cuda = [s.device for s in specs if s.device.startswith("cuda")]
    if len(set(cuda)) != len(cuda):
        raise ConfigError(f"--devices {text!r} names a GPU twice: one worker per GPU")
    return specs


def _is_name(label: str) -> bool:
    return bool(label) and all(c.isalnum() or c in "-_" for c in label)


def _number(arg: str, entry: str, what: str, low: int = 1) -> int:
    if not arg.isdigit() or int(arg) < low:
        raise ConfigError(f"--devices entry {entry!r}: {what} must be a whole number >= {low}")
    return int(arg)


def _cuda_count() -> int:
    from renderq.backends.diffusers import import_torch

    torch = import_torch()
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def by_class(workers: Sequence[Executor]) -> dict[str, list[Executor]]:
    """Workers grouped by device class, as the engine takes them."""
    out: dict[str, list[Executor]] = {}
    for w in workers:
        out.setdefault(w.device_class, []).append(w)
    return out


class Loader(Protocol):
    """Builds a worker's executor inside the worker (a picklable value: it travels there)."""

    def build(self, spec: WorkerSpec, device: str) -> Executor:
        """The executor of the worker for ``spec``, on torch device ``device``."""
        ...


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What each worker loads: a pipeline folder or hub id, its label and precision."""

    model: str
    name: str
    precision: str = "fp32"
    adapters: tuple[tuple[str, str], ...] = ()
    compile: bool = False
    channels_last: bool = False

    def build(self, spec: WorkerSpec, device: str) -> Executor:
        """Load the pipeline on ``device`` with ``spec``'s CPU threads and device class."""
        from renderq.backends.diffusers import DiffusersExecutor, import_torch, quiet_libraries

        if spec.threads > 0:
            import_torch().set_num_threads(spec.threads)
        quiet_libraries()
        executor = DiffusersExecutor.load(
            self.model, device=device, precision=self.precision, name=self.name,
            compile=self.compile, channels_last=self.channels_last, adapters=dict(self.adapters),
        )  # fmt: skip
        executor.device_class = spec.device_class
        return executor


def _serve(conn: Any, spec: WorkerSpec, load: Loader) -> None:
    """A worker process's main: load the pipeline, then render batches until told to stop."""
    try:
        executor = load.build(spec, spec.device)
    except Exception as exc:  # the parent reports it: a bad model is the user's to fix
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            batch = conn.recv()
        except EOFError:  # the parent went away
            return
        if batch is None:
            return
        # Said before rendering, so the parent knows the batch is on the device.
        conn.send(("started", batch.id))
        conn.send(("result", executor.run(batch)))


class WorkerProcess:
    """The executor of one pool worker: it sends batches to its process and reads results.

    Used by one engine worker thread at a time. A process that exits (killed, crashed,
    out of host memory) makes :meth:`run` raise :class:`WorkerLost`; the next call
    starts a new process with a freshly loaded pipeline.
    """

    def __init__(self, spec: WorkerSpec, load: Loader) -> None:
        """A worker for ``spec`` that loads ``load``; call :meth:`start` (or just run)."""
        self.spec = spec
        self.load = load
        self.device_class = spec.device_class
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()
        #: Set while the process renders a batch (it said so), for drills that kill it.
        self.busy = threading.Event()
        self.starts = 0

    @property
    def pid(self) -> int | None:
        """The worker process's id (None before it is started)."""
        return None if self._proc is None else int(self._proc.pid)

    def start(self) -> None:
        """Start the process (it loads the pipeline); :meth:`wait_ready` waits for it."""
        with self._lock:
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(
                target=_serve,
                args=(child, self.spec, self.load),
                name=f"renderq-{self.spec.device}",
                daemon=True,
            )
            proc.start()
            child.close()  # only the child holds its end: EOF here when it exits
            self._proc, self._conn = proc, parent
            self.starts += 1

    def wait_ready(self) -> None:
        """Wait until the pipeline is loaded; ConfigError if loading failed, WorkerLost if
        the process exited before saying so."""
        kind, payload = self._receive("while loading the pipeline")
        if kind == "error":
            self.close()
            raise ConfigError(f"render worker on {self.spec.device} cannot start: {payload}")
        if kind != "ready":  # pragma: no cover - a protocol bug
            raise RuntimeError(f"unexpected message {kind!r} from a starting worker")

    def run(self, batch: Batch) -> BatchResult:
        """Render ``batch`` in the worker process; WorkerLost if the process exits first."""
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:  # it exited between batches: nothing was lost
                self._proc.join(timeout=10)
                self._drop()
            self.start()
            try:
                self.wait_ready()
            except ConfigError as exc:  # it loaded before: the device, not the input, failed
                raise WorkerLost(f"{exc} (restarting for batch {batch.id})") from None
        try:
            self._conn.send(batch)
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise self._lost(f"holding batch {batch.id}") from None
        try:
            while True:
                kind, payload = self._receive(f"holding batch {batch.id}")
                if kind == "started":
                    self.busy.set()
                elif kind == "result":
                    result: BatchResult = payload
                    return result
        finally:
            self.busy.clear()

    def _receive(self, doing: str) -> tuple[str, Any]:
        """The next message, or WorkerLost when the process exits (``doing``: what it held)."""
        conn, proc = self._conn, self._proc
        multiprocessing.connection.wait([conn, proc.sentinel])
        # A message sent just before the exit is still read: poll the pipe first.
        if conn.poll():
            try:
                msg: tuple[str, Any] = conn.recv()
                return msg
            except (EOFError, OSError):
                pass
        raise self._lost(doing)

    def _lost(self, doing: str) -> WorkerLost:
        proc = self._proc
        proc.join(timeout=10)
        code = proc.exitcode
        self._drop()
        return WorkerLost(
            f"render worker process {proc.pid} on {self.spec.device} exited (code {code}) {doing}"
        )

    def _drop(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._proc, self._conn = None, None

    def close(self) -> None:
        """Ask the process to stop, then end it if it does not (idempotent)."""
        proc, conn = self._proc, self._conn
        if proc is None:
            return
        with contextlib.suppress(OSError):
            conn.send(None)
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)
        self._drop()


class DevicePool:
    """Render worker processes, one per device, grouped by device class."""

    def __init__(self, workers: Sequence[WorkerProcess]) -> None:
        """A pool of started (or not yet started) workers."""
        if not workers:
            raise ConfigError("a device pool needs at least one device")
        self.workers = list(workers)

    @classmethod
    def start(cls, specs: Sequence[WorkerSpec], load: Loader) -> DevicePool:
        """Start a worker per spec, loading in parallel; returns once every one is ready."""
        pool = cls([WorkerProcess(s, load) for s in specs])
        try:
            for w in pool.workers:
                w.start()
            for w in pool.workers:
                w.wait_ready()
        except BaseException:
            pool.close()
            raise
        return pool

    def executors(self) -> dict[str, list[Executor]]:
        """The engine's executors: each device class's workers."""
        return by_class(self.workers)

    def close(self) -> None:
        """Stop every worker process."""
        for w in self.workers:
            w.close()

    def __enter__(self) -> DevicePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
