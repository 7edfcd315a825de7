"""Render workers as Ray actors: one actor per device, on one machine or a cluster.

``renderq run --backend ray [--address auto] --devices ...`` starts one actor per device
(``num_gpus=1`` for a GPU, ``num_cpus=THREADS`` for a CPU worker), each holding its own
loaded pipeline. renderq's scheduler stays in the driver: the engine hands each batch to
an idle actor through that actor's executor (:class:`RayWorker`) and Ray only carries it
there and the images back; there is no batcher on the Ray side.

An actor that dies holding a batch (``ray.kill``, a crashed process, a lost node) makes
its executor raise :class:`WorkerLost`, so the engine returns the batch to the queue
through the scheduler's ``on_lost``; a new actor is created for the next batch.

With ``--scorer-devices`` the scorer is an actor too (:class:`RayScorer`), so the driver
needs no accelerator: a score batch whose actor dies fails like any score batch (the
engine's score stage tries it again) and a new actor is created for the next one.

With ``--devices auto`` the actors are what the cluster offers, and actors are started on
nodes that join while the run goes on (:mod:`renderq.backends.ray_cluster`; the driver
hands them to the engine through :meth:`RayPool.watch`). Each such actor is pinned to its
node; a worker whose node has left raises :class:`WorkerLost` at once instead of waiting
for an actor that cannot be placed, so the engine retires it after its losses.

The model id is resolved on the driver: on a cluster of several machines it must name a
hub id or a folder that every node sees at the same path.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from renderq.backends.pool import Loader, WorkerSpec, by_class
from renderq.backends.ray_cluster import NodeSpec, NodeWatcher, cluster_devices, is_auto
from renderq.core.errors import ConfigError, WorkerLost
from renderq.core.protocols import Executor, Scorer
from renderq.core.types import Batch, BatchResult, ScoreResult

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
    """The executor of one render actor.

    Used by one engine worker thread at a time, or by ``depth`` threads of a pool that
    queues batches on its actors (:class:`RayPool`): Ray runs an actor's calls one after
    another, so a second batch waits on the actor and starts as the first ends. Several
    threads may see the actor die; one restarts it, and a thread that held a call to the
    dead actor never drops the new one.
    """

    def __init__(self, spec: WorkerSpec, load: Loader) -> None:
        """A worker for ``spec``; the actor is created by :meth:`start` (or the first run)."""
        self.spec = spec
        self.load = load
        self.device_class = spec.device_class
        self.actor: Any = None
        self.starts = 0
        #: Set while the actor holds a batch (sent, no result yet), for drills that kill it.
        self.busy = threading.Event()
        self._guard = threading.Lock()  # the actor handle, between threads sharing it

    def start(self) -> Any:
        """Create the actor (it loads the pipeline in the background); returns a ready ref."""
        self.actor = _actor_class(RenderActor, self.spec).remote(self.spec, self.load)
        self.starts += 1
        return self.actor.pid.remote()

    @property
    def where(self) -> str:
        """The worker's device, and its node when it is pinned to one (for messages)."""
        spec = self.spec
        return f"{spec.device} of node {spec.node}" if isinstance(spec, NodeSpec) else spec.device

    def _restart(self, batch: Batch) -> None:
        """A new actor for ``batch``; WorkerLost if its node has left or it cannot start."""
        ray = import_ray()
        spec = self.spec
        if isinstance(spec, NodeSpec) and spec.node_id and not _node_alive(spec.node_id):
            raise WorkerLost(f"render actor on {self.where}: the node has left the cluster")
        try:
            ray.get(self.start())
        except ray.exceptions.RayError as exc:  # died loading, or cannot be placed
            self.actor = None
            raise WorkerLost(
                f"render actor on {self.where} did not start for batch {batch.id}: {_first(exc)}"
            ) from None

    def run(self, batch: Batch) -> BatchResult:
        """Render ``batch`` on the actor; WorkerLost if the actor dies before answering."""
        ray = import_ray()
        with self._guard:
            if self.actor is None:
                self._restart(batch)
            actor = self.actor
        try:
            ref = actor.render.remote(batch)
            self.busy.set()
            result: BatchResult = ray.get(ref)
            return result
        except ray.exceptions.RayActorError as exc:  # died, or its node was lost
            with self._guard:
                if self.actor is actor:  # not one another thread has started since
                    self.actor = None
            raise WorkerLost(
                f"render actor on {self.where} died holding batch {batch.id}: {_first(exc)}"
            ) from None
        finally:
            self.busy.clear()

    def close(self) -> None:
        """End the actor."""
        if self.actor is not None:
            import_ray().kill(self.actor)
            self.actor = None


@dataclass(frozen=True, slots=True)
class ScorerLoad:
    """What a scorer actor loads: a CLIP folder or hub id, its label and score scale."""

    model: str
    name: str
    scale100: bool = False

    def build(self, spec: WorkerSpec, device: str) -> Scorer:
        """Load the scorer on ``device`` with ``spec``'s CPU threads and device class."""
        from renderq.backends.clip import ClipScorer
        from renderq.backends.diffusers import import_torch, quiet_libraries

        if spec.threads > 0:
            import_torch().set_num_threads(spec.threads)
        quiet_libraries()
        scorer = ClipScorer.load(self.model, device=device, scale100=self.scale100, name=self.name)
        scorer.device_class = spec.device_class
        return scorer


class ScoreActor:
    """The body of a scorer actor: a loaded CLIP scorer."""

    def __init__(self, spec: WorkerSpec, load: ScorerLoad) -> None:
        """Load the scorer; Ray gives a GPU actor its GPU as ``cuda:0``."""
        device = "cuda:0" if spec.device.startswith("cuda") else "cpu"
        self.scorer = load.build(spec, device)

    def pid(self) -> int:
        """The actor's process id (it answers once the scorer is loaded)."""
        return os.getpid()

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        """Score one batch."""
        return self.scorer.score(images, prompts)


class RayScorer:
    """The engine's scorer, run by a scorer actor (the engine calls it from one thread)."""

    def __init__(self, spec: WorkerSpec, load: ScorerLoad) -> None:
        """A scorer for ``spec``; the actor is created by :meth:`start` (or the first call)."""
        self.spec = spec
        self.load = load
        self.device_class = spec.device_class
        self.actor: Any = None
        self.starts = 0

    def start(self) -> Any:
        """Create the actor; returns a ref that is ready once the scorer has loaded."""
        self.actor = _actor_class(ScoreActor, self.spec).remote(self.spec, self.load)
        self.starts += 1
        return self.actor.pid.remote()

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        """Score on the actor; an actor that died raises (the score stage tries again)."""
        ray = import_ray()
        try:
            if self.actor is None:
                ray.get(self.start())
            result: ScoreResult = ray.get(self.actor.score.remote(list(images), list(prompts)))
            return result
        except ray.exceptions.RayActorError as exc:
            self.actor = None
            raise RuntimeError(f"scorer actor on {self.spec.device} died: {exc}") from None

    def close(self) -> None:
        """End the actor."""
        if self.actor is not None:
            import_ray().kill(self.actor)
            self.actor = None


def _actor_class(body: type, spec: WorkerSpec) -> Any:
    """``body`` as a Ray actor class with ``spec``'s resources: a GPU, or its CPU threads;
    pinned to its node when ``spec`` names one."""
    gpu = spec.device.startswith("cuda")
    options: dict[str, Any] = {
        "num_cpus": 0 if gpu else max(1, spec.threads),
        "num_gpus": 1 if gpu else 0,
        "max_restarts": 0,  # a dead actor is replaced by its owner, its work requeued
    }
    if isinstance(spec, NodeSpec) and spec.node_id:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # Not soft: the device found on that node is the one the class was read from.
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(spec.node_id, soft=False)
    return import_ray().remote(body).options(**options)


def _node_alive(node_id: str) -> bool:
    """Whether the cluster lists node ``node_id`` as alive."""
    return any(n.get("NodeID") == node_id and n.get("Alive") for n in import_ray().nodes())


def _first(exc: BaseException) -> str:
    """The first line of an error's message (Ray's run to many lines), else its type."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_depth(depth: int) -> None:
    """ConfigError unless ``depth`` (batches queued per actor) is 1 to 8."""
    if not 1 <= depth <= 8:
        raise ConfigError(f"--actor-depth must be from 1 to 8, got {depth}")


class RayPool:
    """Render actors, one per device, grouped by device class."""

    def __init__(
        self,
        workers: Sequence[RayWorker],
        *,
        scorer: RayScorer | None = None,
        owns_connection: bool = False,
        auto: WorkerSpec | None = None,
        known_nodes: Sequence[str] = (),
        depth: int = 1,
    ) -> None:
        """A pool of workers (and a scorer actor); ``owns_connection``: disconnect from
        Ray on :meth:`close`. ``auto``: the ``--devices auto`` spec the workers were read
        from, with the ids of the nodes seen then (``known_nodes``), for :meth:`watch`.
        ``depth``: batches each actor is handed at once (the engine gets each worker
        ``depth`` times); above 1 the next batch waits on the actor while one renders,
        which hides Ray's hop between batches but cuts batches sooner."""
        if not workers:
            raise ConfigError("a device pool needs at least one device")
        check_depth(depth)
        self.depth = depth
        self.workers = list(workers)
        self.scorer = scorer
        self.auto = auto
        self.known_nodes = tuple(known_nodes)
        self.watcher: NodeWatcher | None = None
        self._owns = owns_connection
        self._lock = threading.Lock()  # workers: the watcher adds, close ends
        self._closed = False

    @classmethod
    def start(
        cls,
        specs: Sequence[WorkerSpec],
        load: Loader,
        *,
        address: str | None = None,
        scorer: tuple[WorkerSpec, ScorerLoad] | None = None,
        depth: int = 1,
    ) -> RayPool:
        """Connect to Ray, start an actor per spec (and a scorer actor) and wait until every
        one has loaded. ``specs`` may be ``--devices auto``: the cluster's devices
        (:func:`~renderq.backends.ray_cluster.cluster_devices`), room left for the scorer."""
        owns = connect(address)
        ray = import_ray()
        auto, known = None, []
        if is_auto(specs):
            auto = specs[0]
            try:
                nodes = ray.nodes()
                known = [str(n.get("NodeID", "")) for n in nodes if n.get("Alive")]
                specs = cluster_devices(
                    nodes, device_class=None if auto.device_class == auto.device else
                    auto.device_class, cpu_threads=auto.threads,
                    reserve=None if scorer is None else scorer[0],
                )  # fmt: skip
            except BaseException:
                if owns:
                    ray.shutdown()
                raise
        score = None if scorer is None else RayScorer(*scorer)
        pool = cls(
            [RayWorker(s, load) for s in specs], scorer=score, owns_connection=owns,
            auto=auto, known_nodes=known, depth=depth,
        )  # fmt: skip
        try:
            ready = [w.start() for w in pool.workers]
            ray.get(ready + ([] if score is None else [score.start()]))
        except ray.exceptions.RayActorError as exc:
            pool.close()
            raise ConfigError(f"a render or scorer actor cannot start: {exc}") from None
        except BaseException:
            pool.close()
            raise
        return pool

    def executors(self) -> dict[str, list[Executor]]:
        """The engine's executors: each device class's actors, each ``depth`` times."""
        with self._lock:
            return by_class([w for w in self.workers for _ in range(self.depth)])

    def watch(
        self,
        add: Callable[[str, list[Executor]], object],
        *,
        prices: Mapping[str, float] | None = None,
        interval_s: float = 5.0,
        nodes: Callable[[], Sequence[Mapping[str, Any]]] | None = None,
    ) -> NodeWatcher | None:
        """Start actors on the nodes that join the cluster and hand them to ``add`` (the
        engine's ``add_workers``), for the pool's device class and, where ``prices`` are
        given, only a priced one; polled every ``interval_s`` in a thread until
        :meth:`close`. ``nodes``: the node list (``ray.nodes`` by default).

        Only a pool read from the cluster (``--devices auto``) grows: one given its
        devices is left as it is (None is returned).
        """
        if self.auto is None:
            return None
        first = self.workers[0].spec
        self.watcher = NodeWatcher(
            nodes or import_ray().nodes, self.known_nodes, self._start_more, add,
            gpus=first.device.startswith("cuda"), cpu_threads=self.auto.threads,
            classes={w.device_class for w in self.workers}, prices=prices,
            interval_s=interval_s,
        )  # fmt: skip
        self.watcher.start_thread()
        return self.watcher

    def _start_more(self, specs: list[NodeSpec]) -> list[Executor]:
        """Start actors for ``specs`` and wait until they have loaded; the pool keeps them
        (none if it was closed meanwhile)."""
        workers = [RayWorker(s, self.workers[0].load) for s in specs]
        with self._lock:
            if self._closed:
                return []
            ready = [w.start() for w in workers]
            self.workers += workers  # close() ends them even while they load
        ray = import_ray()
        try:
            ray.get(ready)
        except ray.exceptions.RayError as exc:
            with self._lock:
                if self._closed:
                    return []  # ended by close() while loading
                self.workers = [w for w in self.workers if w not in workers]
            for w in workers:
                w.close()
            raise ConfigError(f"render actors cannot start: {_first(exc)}") from None
        with self._lock:
            return [] if self._closed else [w for w in workers for _ in range(self.depth)]

    def close(self) -> None:
        """End every actor (and the Ray connection this pool made)."""
        if self.watcher is not None:
            self.watcher.stop(timeout=0)  # it may be loading a model: close ends its actors
        with self._lock:
            self._closed = True
            workers = list(self.workers)
        for w in workers:
            w.close()
        if self.scorer is not None:
            self.scorer.close()
        if self._owns:
            import_ray().shutdown()

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
