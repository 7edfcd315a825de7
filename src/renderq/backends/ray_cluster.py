"""What a Ray cluster offers to render on, and render actors for the nodes that join a run.

``--devices auto`` (with ``--backend ray``) reads the cluster's alive nodes (the list
``ray.nodes()`` returns) and makes one render actor per device found there:

- **GPUs.** Each GPU of a node (its ``GPU`` resource) gets an actor pinned to that node.
  Its device class is the node's ``renderq_class:<NAME>`` custom resource when it has one
  (``ray start --resources '{"renderq_class:cuda-a100-80g": 1}'``): an operator's name
  wins, because Ray labels a 40 GB and an 80 GB A100 alike. Otherwise it is Ray's own
  ``accelerator_type:<TYPE>`` resource, lower-cased after ``cuda-`` (``accelerator_type:A100``
  -> ``cuda-a100``), and plain ``cuda`` on a node that reports no type.
- **No GPU anywhere.** Each node's CPUs get one-thread actors (``auto:THREADS`` for more
  threads each), ``CPUs // THREADS`` per node, of class ``renderq_class`` or ``cpu``. One
  thread each because a worker's OpenMP team waits for its slowest thread at every kernel:
  on a shared machine two one-thread workers rendered about 12 times as fast as one
  two-thread worker (docs/benchmarks.md), and one-thread workers never wait for a partner.

The render stage runs on one device class, so a cluster of several classes needs
``auto=CLASS`` to say which (the others are left alone). A cluster with nothing usable is
refused with what was found.

While a run goes on, a :class:`NodeWatcher` polls the node list and starts actors on the
nodes that join, for the run's class (and, where prices are given, only for priced
classes); the engine takes them as more workers of the class. A node that leaves takes its
actors with it: their batches come back through the engine's ``WorkerLost`` path, and a
worker of a departed node, unable to start again there, is retired after its losses while
other workers of its class go on.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from renderq.backends.pool import AUTO, WorkerSpec
from renderq.core.errors import ConfigError

CLASS_RESOURCE = "renderq_class:"
"""Prefix of the custom resource that names a node's device class."""
ACCELERATOR_RESOURCE = "accelerator_type:"
"""Prefix of the resource Ray gives a node with accelerators of a known type."""

Node = Mapping[str, Any]
"""One node as ``ray.nodes()`` describes it (``NodeID``, ``Alive``, ``Resources``, ...)."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeSpec(WorkerSpec):
    """A worker on one node of a Ray cluster: its actor is pinned there.

    ``node_id``: Ray's id of the node; ``node``: its address, for messages.
    """

    node_id: str = ""
    node: str = ""


def node_class(resources: Mapping[str, float], *, gpu: bool) -> str:
    """A node's device class from its resources (see the module's rules)."""
    named = sorted(
        k.removeprefix(CLASS_RESOURCE) for k in resources if k.startswith(CLASS_RESOURCE)
    )
    if named:
        return _clean(named[0])
    if not gpu:
        return "cpu"
    types = [
        k[len(ACCELERATOR_RESOURCE) :] for k in resources if k.startswith(ACCELERATOR_RESOURCE)
    ]
    if not types:
        return "cuda"
    # A node may carry a size label beside its type (A100 and A100-80G): the longer is
    # the more specific.
    kind = sorted(types, key=lambda t: (-len(t), t))[0]
    return "cuda-" + _clean(kind.lower())


def _clean(name: str) -> str:
    """``name`` as a device class: letters, digits, - and _ (others become -)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "unnamed"


def node_specs(
    nodes: Iterable[Node], *, gpus: bool | None = None, cpu_threads: int = 1
) -> list[NodeSpec]:
    """One spec per device of the alive ``nodes``: their GPUs, or with ``gpus=False`` (or
    ``None`` on a cluster without any GPU) their CPUs in actors of ``cpu_threads`` threads."""
    if cpu_threads < 1:
        raise ConfigError(f"CPU actors need at least one thread, got {cpu_threads}")
    alive = [n for n in nodes if n.get("Alive", False)]
    if gpus is None:
        gpus = any(_count(n, "GPU") > 0 for n in alive)
    specs: list[NodeSpec] = []
    for n in alive:
        res = n.get("Resources", {})
        node_id, where = str(n.get("NodeID", "")), str(n.get("NodeManagerAddress", "?"))
        dc = node_class(res, gpu=gpus)
        if gpus:
            specs += [NodeSpec("cuda", dc, 0, node_id, where) for _ in range(_count(n, "GPU"))]
        else:
            count = _count(n, "CPU") // cpu_threads
            specs += [NodeSpec("cpu", dc, cpu_threads, node_id, where) for _ in range(count)]
    return specs


def _count(node: Node, resource: str) -> int:
    return int(node.get("Resources", {}).get(resource, 0))


def cluster_devices(
    nodes: Sequence[Node],
    *,
    device_class: str | None = None,
    cpu_threads: int = 1,
    reserve: WorkerSpec | None = None,
) -> list[NodeSpec]:
    """The render workers for ``--devices auto`` on a cluster of ``nodes``.

    ``device_class``: keep only the devices of that class (``auto=CLASS``). ``reserve``:
    a scorer actor that needs one of the devices (a GPU, or its CPU threads): the last
    node's share is made smaller by it, so the scorer has room. ConfigError, naming what
    the cluster has, when nothing is left or the devices are of several classes.
    """
    specs = node_specs(nodes, cpu_threads=cpu_threads)
    if reserve is not None and specs:
        specs = _reserve(specs, reserve)
    if device_class is not None:
        specs = [s for s in specs if s.device_class == device_class]
    if not specs:
        wanted = f" of class {device_class!r}" if device_class else ""
        raise ConfigError(
            f"--devices auto: the Ray cluster offers no device{wanted} to render on; "
            f"found {describe(nodes)}"
        )
    classes = sorted({s.device_class for s in specs})
    if len(classes) > 1:
        raise ConfigError(
            f"--devices auto: the Ray cluster's devices are of the classes {classes}; the "
            f"render stage runs on one: name it with --devices auto=CLASS"
        )
    return specs


def _reserve(specs: list[NodeSpec], scorer: WorkerSpec) -> list[NodeSpec]:
    """``specs`` less what a scorer actor takes on the last node."""
    if specs[0].device.startswith("cuda"):
        return specs[:-1] if scorer.device.startswith("cuda") else specs
    if scorer.device.startswith("cuda"):
        return specs
    cpus = max(1, scorer.threads)
    last = specs[-1].node_id
    drop = -(-cpus // specs[-1].threads)  # whole actors, rounded up
    kept = [s for s in specs if s.node_id != last]
    on_last = [s for s in specs if s.node_id == last]
    return kept + on_last[: max(0, len(on_last) - drop)]


def describe(nodes: Sequence[Node]) -> str:
    """What the nodes offer, briefly, for an error message."""
    alive = [n for n in nodes if n.get("Alive", False)]
    if not alive:
        return f"no alive node ({len(nodes)} listed)"
    parts = []
    for n in alive[:5]:
        res = n.get("Resources", {})
        extra = sorted(k for k in res if k.startswith((CLASS_RESOURCE, ACCELERATOR_RESOURCE)))
        parts.append(
            f"{n.get('NodeManagerAddress', '?')} (CPU {_count(n, 'CPU')}, GPU {_count(n, 'GPU')}"
            + "".join(f", {k}" for k in extra)
            + ")"
        )
    more = f" and {len(alive) - 5} more" if len(alive) > 5 else ""
    return f"{len(alive)} alive node(s): " + ", ".join(parts) + more


def is_auto(specs: Sequence[WorkerSpec]) -> bool:
    """Whether ``specs`` is ``--devices auto`` (to be read from the cluster)."""
    return len(specs) == 1 and specs[0].device == AUTO


class NodeWatcher:
    """Starts render actors on the nodes that join a cluster while a run goes on.

    Every ``interval_s`` it reads ``nodes()``; each alive node not seen before gets specs
    as :func:`node_specs` makes them (``gpus``, ``cpu_threads``: the run's kind of
    device), and each of its device classes the run takes is started with ``start`` (it
    returns the executors, once their actors have loaded) and handed to ``add(class,
    executors)`` (the engine's ``add_workers``). A class outside ``classes`` (when given),
    or without a price where ``prices`` are given, is logged and skipped. A node is looked
    at once: one that cannot start is logged, not tried again.
    """

    def __init__(
        self,
        nodes: Callable[[], Sequence[Node]],
        known: Iterable[str],
        start: Callable[[list[NodeSpec]], Sequence[Any]],
        add: Callable[[str, list[Any]], object],
        *,
        gpus: bool,
        cpu_threads: int = 1,
        classes: Iterable[str] | None = None,
        prices: Mapping[str, float] | None = None,
        interval_s: float = 5.0,
        log: Callable[[str], None] = _log.warning,
    ) -> None:
        """A watcher that has seen the nodes ``known`` (ids); :meth:`start_thread` runs it."""
        if interval_s <= 0:
            raise ConfigError(f"the node watcher's interval must be > 0 s, got {interval_s}")
        self._nodes, self._start, self._add = nodes, start, add
        self.known = set(known)
        self.gpus, self.cpu_threads = gpus, cpu_threads
        self.classes = None if classes is None else set(classes)
        self.prices = dict(prices or {})
        self.interval_s = interval_s
        self._log = log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> list[NodeSpec]:
        """Look once: start actors on the nodes that joined; returns the specs added."""
        added: list[NodeSpec] = []
        for node in self._nodes():
            node_id = str(node.get("NodeID", ""))
            if not node.get("Alive", False) or node_id in self.known:
                continue
            self.known.add(node_id)
            where = node.get("NodeManagerAddress", node_id)
            specs = node_specs([node], gpus=self.gpus, cpu_threads=self.cpu_threads)
            if not specs:
                kind = "GPU" if self.gpus else f"{self.cpu_threads} CPU(s)"
                self._log(f"Ray node {where} joined without a {kind} to render on")
            for dc in sorted({s.device_class for s in specs}):
                if self._stop.is_set():
                    return added
                group = [s for s in specs if s.device_class == dc]
                if self.classes is not None and dc not in self.classes:
                    self._log(
                        f"Ray node {where} joined with {len(group)} {dc!r} device(s); this "
                        f"run renders on {sorted(self.classes)}: left alone"
                    )
                    continue
                if self.prices and dc not in self.prices:
                    self._log(
                        f"Ray node {where} joined with {len(group)} {dc!r} device(s) that "
                        f"--price does not price: left alone"
                    )
                    continue
                try:
                    executors = list(self._start(group))
                except Exception as exc:  # a node that cannot host the model: say so, go on
                    self._log(f"render actors on Ray node {where} did not start: {exc}")
                    continue
                if executors:
                    self._add(dc, executors)
                    added += group
        return added

    def start_thread(self) -> None:
        """Poll in a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._loop, daemon=True, name="ray-nodes")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception as exc:  # a failed look (the cluster busy): try again later
                if not self._stop.is_set():  # after stop, Ray may be gone: nothing to say
                    self._log(f"reading the Ray cluster's nodes failed: {exc}")

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop polling; waits up to ``timeout`` for a look in progress to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
