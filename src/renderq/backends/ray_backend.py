"""Render workers as Ray actors: one actor per device, on one machine or a cluster.

``renderq run --backend ray [--address auto] --devices ...`` starts one actor per device
(``num_gpus=1`` for a GPU, ``num_cpus=THREADS`` for a CPU worker), each holding its own
loaded pipeline. renderq's scheduler stays in the driver: the engine hands each batch to
an idle actor through that actor's executor (:class:`RayWorker`) and Ray only carries it
there and the images back; there is no batcher on the Ray side.

An actor that dies holding a batch (``ray.kill``, a crashed process, a lost node) makes
its executor raise :class:`WorkerLost`, so the engine returns the batch to the queue
through the scheduler's ``on_lost``; a new actor is created for the next batch.

The model id is resolved on the driver: on a cluster of several machines it must name a
hub id or a folder that every node sees at the same path.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from renderq.backends.pool import Loader, WorkerSpec
from renderq.core.errors import ConfigError, WorkerLost
from renderq.core.protocols import Executor
from renderq.core.types import Batch, BatchResult

_INSTALL = "the Ray backend needs ray: pip install 'renderq[ray]'"


def import_ray() -> Any:
    """Import ray, or raise a ConfigError that says what to install."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(_INSTALL) from exc
    return ray


def connect(address: str | None = None) -> bool:
    """Join the Ray cluster at ``address`` (``auto``: the running one), or start a local
    one when ``address`` is None; nothing if this process is connected already.

    Returns whether this call connected (and so should disconnect when done).
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, include_dashboard=False, logging_level="WARNING")
    except (ConnectionError, ValueError, RuntimeError) as exc:
        where = "a new local cluster" if address is None else repr(address)
        raise ConfigError(f"cannot connect to Ray ({where}): {exc}") from exc
    return True


def cluster_gpus() -> int:
    """GPUs the connected Ray cluster offers (for ``--devices cuda``)."""
    return int(import_ray().cluster_resources().get("GPU", 0))


class RenderActor:
    """The body of a render actor: a loaded pipeline that renders batches."""

    def __init__(self, spec: WorkerSpec, load: Loader) -> None:
        """Load the pipeline; Ray gives a GPU actor its GPU as ``cuda:0``."""
        device = "cuda:0" if spec.device.startswith("cuda") else "cpu"
        self.executor = load.build(spec, device)

    def pid(self) -> int:
        """The actor's process id (it answers once the pipeline is loaded)."""
        return os.getpid()

    def render(self, batch: Batch) -> BatchResult:
        """Render one batch."""
        return self.executor.run(batch)


class RayWorker:
    """The executor of one render actor, used by one engine worker thread at a time."""

    def __init__(self, spec: WorkerSpec, load: Loader) -> None:
        """A worker for ``spec``; the actor is created by :meth:`start` (or the first run)."""
        self.spec = spec
        self.load = load
        self.device_class = spec.device_class
        self.actor: Any = None
        self.starts = 0
        #: Set while the actor holds a batch (sent, no result yet), for drills that kill it.
        self.busy = threading.Event()

    def start(self) -> Any:
        """Create the actor (it loads the pipeline in the background); returns a ready ref."""
        ray = import_ray()
        gpu = self.spec.device.startswith("cuda")
        cls = ray.remote(RenderActor).options(
            num_cpus=0 if gpu else max(1, self.spec.threads),
            num_gpus=1 if gpu else 0,
            max_restarts=0,  # a dead actor is replaced by this worker, its batch requeued
        )
        self.actor = cls.remote(self.spec, self.load)
        self.starts += 1
        return self.actor.pid.remote()

    def run(self, batch: Batch) -> BatchResult:
        """Render ``batch`` on the actor; WorkerLost if the actor dies before answering."""
        ray = import_ray()
        try:
            if self.actor is None:
                ray.get(self.start())
            ref = self.actor.render.remote(batch)
            self.busy.set()
            result: BatchResult = ray.get(ref)
            return result
        except ray.exceptions.RayActorError as exc:  # died, or its node was lost
            self.actor = None
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WorkerLost(
                f"render actor on {self.spec.device} died holding batch {batch.id}: {first}"
            ) from None
        finally:
            self.busy.clear()

    def close(self) -> None:
        """End the actor."""
        if self.actor is not None:
            import_ray().kill(self.actor)
            self.actor = None


class RayPool:
    """Render actors, one per device, grouped by device class."""

    def __init__(self, workers: Sequence[RayWorker], *, owns_connection: bool = False) -> None:
        """A pool of workers; ``owns_connection``: disconnect from Ray on :meth:`close`."""
        if not workers:
            raise ConfigError("a device pool needs at least one device")
        self.workers = list(workers)
        self._owns = owns_connection

    @classmethod
    def start(
        cls, specs: Sequence[WorkerSpec], load: Loader, *, address: str | None = None
    ) -> RayPool:
        """Connect to Ray, start an actor per spec and wait until every one has loaded."""
        owns = connect(address)
        pool = cls([RayWorker(s, load) for s in specs], owns_connection=owns)
        ray = import_ray()
        try:
            ray.get([w.start() for w in pool.workers])
        except ray.exceptions.RayActorError as exc:
            pool.close()
            raise ConfigError(f"a render actor cannot start: {exc}") from None
        except BaseException:
            pool.close()
            raise
        return pool

    def executors(self) -> dict[str, list[Executor]]:
        """The engine's executors: each device class's actors."""
        out: dict[str, list[Executor]] = {}
        for w in self.workers:
            out.setdefault(w.device_class, []).append(w)
        return out

    def close(self) -> None:
        """End every actor (and the Ray connection this pool made)."""
        for w in self.workers:
            w.close()
        if self._owns:
            import_ray().shutdown()

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
