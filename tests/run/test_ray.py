"""The Ray backend on a local two-CPU Ray: render actors on the embedded models.

A job on two actors accepts what one in-process worker accepts; an actor killed while it
holds a batch loses nothing and repeats nothing; a render actor and the scorer on their
own device classes (the scorer an actor too) book to their classes, and a scorer actor
that dies is replaced.

``--devices auto``: the devices are read from the node list ``ray.nodes()`` returns (unit
tests on made-up lists, and one on this module's local Ray, started with a logical GPU
and Ray's ``accelerator_type:A100`` resource); a watcher starts actors on nodes that join
and the engine takes them mid-run, while a worker whose node has left is retired.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from renderq.backends.null import NullScorer, SleepLoad
from renderq.backends.pool import WorkerSpec, parse_devices
from renderq.backends.ray_backend import RayPool, RayWorker
from renderq.backends.ray_cluster import NodeSpec, NodeWatcher, cluster_devices, node_specs
from renderq.core.errors import ConfigError, WorkerLost
from renderq.core.events import Accepted
from renderq.core.policies import Dynamic
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.types import Batch, BatchKey, BatchResult, Request
from renderq.jobs.workers import check_prices, start_pool
from renderq.runtime.realtime import MAX_LOSSES, RealtimeEngine
from renderq.testing.fakes import FakeExecutor, RecordingListener

from .test_pool import _accepted, _run, _same_images, embedded

ray = pytest.importorskip("ray")

STEPS = 8


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray with two CPUs for this module's tests, and one logical GPU that Ray is
    told is an A100 (no GPU is used: the actors that render on it sleep)."""
    ray.init(
        num_cpus=2, num_gpus=1, resources={"accelerator_type:A100": 1},
        include_dashboard=False, logging_level="ERROR",
    )  # fmt: skip
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Path]:
    """The job on one in-process worker."""
    tmp = tmp_path_factory.mktemp("ray")
    summary, out = _run(tmp, "one", steps=STEPS)
    return tmp, summary, out


@pytest.mark.slow
@embedded
def test_a_job_on_two_actors_accepts_what_one_worker_accepts(
    local_ray: None, reference: tuple[Path, dict[str, Any], Path]
) -> None:
    tmp, ref, ref_out = reference
    summary, out = _run(
        tmp, "two", "--backend", "ray", "--devices", "cpu:1,cpu:1", steps=STEPS
    )  # fmt: skip
    assert summary["accepted"] == ref["accepted"] and summary["escalated"] == ref["escalated"]
    _same_images(_accepted(out), _accepted(ref_out))
    assert not json.loads((out / "ledger.json").read_text())["device_seconds"].get("lost")
    # The driver ended its actors when the job finished: their CPUs come back (Ray frees
    # a killed actor's resources asynchronously, so wait for it, bounded).
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) == 2


@pytest.mark.slow
@embedded
def test_an_actor_killed_holding_a_batch_loses_nothing_and_repeats_nothing(
    local_ray: None,
    reference: tuple[Path, dict[str, Any], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from renderq.jobs import runner

    tmp, ref, ref_out = reference
    pools: list[Any] = []
    start_pool = runner.start_pool

    def capture(*args: Any, **kwargs: Any) -> Any:
        pools.append(start_pool(*args, **kwargs))
        return pools[-1]

    monkeypatch.setattr(runner, "start_pool", capture)
    killed: list[str] = []

    def kill_one_while_it_holds_a_batch() -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not killed:
            for w in pools[0].workers if pools else ():
                actor = w.actor
                if w.busy.wait(0.01) and actor is not None:
                    ray.kill(actor)
                    killed.append(w.spec.device)
                    return

    killer = threading.Thread(target=kill_one_while_it_holds_a_batch, daemon=True)
    killer.start()
    summary, out = _run(
        tmp, "killed", "--backend", "ray", "--devices", "cpu:1,cpu:1", steps=STEPS
    )  # fmt: skip
    killer.join(timeout=5)
    assert killed, "no actor was seen holding a batch"
    [pool] = pools
    assert isinstance(pool, RayPool)
    assert sorted(w.starts for w in pool.workers) == [1, 2]  # the killed one was replaced
    assert summary["accepted"] == ref["accepted"]
    _same_images(_accepted(out), _accepted(ref_out))  # nothing lost, twice or at a later seed
    assert json.loads((out / "ledger.json").read_text())["device_seconds"]["lost"] > 0


@pytest.mark.slow
@embedded
def test_render_and_scorer_actors_book_to_their_classes_and_a_dead_scorer_is_replaced(
    local_ray: None,
    reference: tuple[Path, dict[str, Any], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from renderq.jobs import runner

    tmp, ref, ref_out = reference
    pools: list[RayPool] = []
    start_pool = runner.start_pool

    def start_then_kill_the_scorer(*args: Any, **kwargs: Any) -> Any:
        pool = start_pool(*args, **kwargs)
        assert isinstance(pool, RayPool) and pool.scorer is not None
        ray.kill(pool.scorer.actor)  # before its first batch: that batch must be retried
        pools.append(pool)
        return pool

    monkeypatch.setattr(runner, "start_pool", start_then_kill_the_scorer)
    summary, out = _run(
        tmp, "classes", "--backend", "ray", "--devices", "cpu:1=ray-cpu",
        "--scorer-devices", "cpu=score-cpu", "--price", "ray-cpu=0.05,score-cpu=0.02",
        steps=STEPS,
    )  # fmt: skip
    [pool] = pools
    assert pool.scorer is not None and pool.scorer.starts == 2  # replaced after the kill
    by = summary["by_device_class"]
    assert summary["accepted"] == ref["accepted"]
    _same_images(_accepted(out), _accepted(ref_out))
    assert set(by["ray-cpu"]["device_seconds"]) <= {"render", "regen"}
    assert set(by["score-cpu"]["device_seconds"]) <= {"score", "rescore"}
    assert by["ray-cpu"]["cost"] == pytest.approx(by["ray-cpu"]["gpu_hours"] * 0.05)


@pytest.mark.slow
@embedded
def test_an_actor_that_cannot_load_its_model_is_a_config_error(
    local_ray: None, tmp_path: Path
) -> None:
    from renderq.backends.pool import LoadSpec

    (tmp_path / "model_index.json").write_text("{}")
    with pytest.raises(ConfigError, match="a render or scorer actor cannot start"):
        RayPool.start([WorkerSpec("cpu", "cpu", 1)], LoadSpec(str(tmp_path), "broken"))


# -- --devices auto: the cluster's devices ---------------------------------------------------


def _node(
    node_id: str, cpus: int = 8, gpus: int = 0, alive: bool = True, **extra: float
) -> dict[str, Any]:
    """A node as ``ray.nodes()`` lists it (the keys renderq reads)."""
    resources = {"CPU": float(cpus), "memory": 1e9, f"node:10.0.0.{node_id}": 1.0, **extra}
    if gpus:
        resources["GPU"] = float(gpus)
    return {
        "NodeID": node_id, "Alive": alive, "NodeManagerAddress": f"10.0.0.{node_id}",
        "Resources": resources,
    }  # fmt: skip


A100 = {"accelerator_type:A100": 1.0}
KEY = BatchKey("null", 8, 8, 1, True, "null", "fp32", "cuda-a100")


def test_each_gpu_gets_an_actor_of_its_node_class() -> None:
    nodes = [
        _node("1", gpus=2, **A100),
        _node("2", gpus=1, **{"accelerator_type:A100": 1.0, "accelerator_type:A100-80G": 1.0}),
        _node("3", gpus=1, **{"accelerator_type:L4": 1.0, "renderq_class:cuda-l4-spot": 1.0}),
        _node("4", gpus=1),
        _node("5", cpus=64),  # no GPU: not a render device while the cluster has GPUs
        _node("6", gpus=4, alive=False, **A100),
    ]
    specs = node_specs(nodes)
    assert [(s.device, s.device_class, s.node_id) for s in specs] == [
        ("cuda", "cuda-a100", "1"), ("cuda", "cuda-a100", "1"),
        ("cuda", "cuda-a100-80g", "2"), ("cuda", "cuda-l4-spot", "3"), ("cuda", "cuda", "4"),
    ]  # fmt: skip
    assert specs[0] == NodeSpec("cuda", "cuda-a100", 0, "1", "10.0.0.1")


def test_a_cluster_without_gpus_gets_cpu_actors_per_node() -> None:
    nodes = [_node("1", cpus=4), _node("2", cpus=3, **{"renderq_class:c7i": 1.0})]
    assert [(s.device_class, s.threads, s.node_id) for s in node_specs(nodes)] == [
        ("cpu", 1, "1"), ("cpu", 1, "1"), ("cpu", 1, "1"), ("cpu", 1, "1"),
        ("c7i", 1, "2"), ("c7i", 1, "2"), ("c7i", 1, "2"),
    ]  # fmt: skip
    two = node_specs(nodes, cpu_threads=2)
    assert [(s.device_class, s.threads) for s in two] == [("cpu", 2)] * 2 + [("c7i", 2)]


def test_auto_takes_one_class_and_leaves_room_for_a_scorer() -> None:
    nodes = [_node("1", gpus=2, **A100), _node("2", gpus=2, **{"accelerator_type:L4": 1.0})]
    with pytest.raises(ConfigError, match=r"classes \['cuda-a100', 'cuda-l4'\].*auto=CLASS"):
        cluster_devices(nodes)
    assert len(cluster_devices(nodes, device_class="cuda-a100")) == 2
    # A scorer actor on a GPU takes one of the last node's GPUs.
    kept = cluster_devices(nodes, device_class="cuda-l4", reserve=WorkerSpec("cuda:0", "s"))
    assert [s.node_id for s in kept] == ["2"]
    cpu = cluster_devices([_node("1", cpus=2)], reserve=WorkerSpec("cpu", "score", 1))
    assert len(cpu) == 1


@pytest.mark.parametrize(
    ("nodes", "cls", "message"),
    [
        ([], None, "offers no device to render on; found no alive node \\(0 listed\\)"),
        ([_node("1", cpus=0)], None, r"found 1 alive node\(s\): 10.0.0.1 \(CPU 0, GPU 0\)"),
        ([_node("1", gpus=1, **A100)], "cuda-h100", "no device of class 'cuda-h100'.*A100"),
        ([_node("1", gpus=1, alive=False)], None, "no alive node \\(1 listed\\)"),
    ],
)
def test_a_cluster_with_nothing_usable_is_refused_with_what_it_has(
    nodes: list[dict[str, Any]], cls: str | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        cluster_devices(nodes, device_class=cls)


def test_auto_parses_alone_and_needs_ray_and_a_named_class_to_be_priced() -> None:
    assert parse_devices("auto") == [WorkerSpec("auto", "auto", 1)]
    assert parse_devices("auto:4=cuda-a100") == [WorkerSpec("auto", "cuda-a100", 4)]
    for text, message in [
        ("auto,cpu:1", "'auto' stands alone"),
        ("auto:0", "threads must be a whole number >= 1"),
        ("cpu:1=auto", "'auto' is not a device class name"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_devices(text)
    with pytest.raises(ConfigError, match=r"--devices auto=CLASS, CLASS one of \['cuda-a100'\]"):
        check_prices({"cuda-a100": 1.9}, {"auto", "cpu"})
    check_prices({"cuda-a100": 1.9, "cpu": 0.1}, {"cuda-a100", "cpu"})
    from renderq.core.settings import ModelSpec

    with pytest.raises(ConfigError, match="add --backend ray"):
        start_pool(ModelSpec("no-such-model"), parse_devices("auto"), backend="local")


# -- nodes that join --------------------------------------------------------------------------


class Nodes:
    """A node list that the test changes (what ``ray.nodes()`` would say)."""

    def __init__(self, *nodes: dict[str, Any]) -> None:
        self.nodes = list(nodes)

    def __call__(self) -> list[dict[str, Any]]:
        return list(self.nodes)


def _watcher(nodes: Nodes, **kw: Any) -> tuple[NodeWatcher, list[Any], list[str]]:
    added: list[Any] = []
    logged: list[str] = []
    watcher = NodeWatcher(
        nodes, ["1"],
        lambda specs: [FakeExecutor(device_class=s.device_class) for s in specs],
        lambda dc, executors: added.append((dc, executors)),
        gpus=True, log=logged.append, **kw,
    )  # fmt: skip
    return watcher, added, logged


def test_the_watcher_starts_actors_on_new_nodes_of_the_run_class_once() -> None:
    nodes = Nodes(_node("1", gpus=2, **A100))
    watcher, added, logged = _watcher(nodes, classes={"cuda-a100"})
    assert watcher.poll() == [] and not added  # the nodes seen at the start are not new
    nodes.nodes += [
        _node("2", gpus=2, **A100),
        _node("3", gpus=1, **{"accelerator_type:L4": 1.0}),
        _node("4", cpus=16),
        _node("5", gpus=1, alive=False, **A100),
    ]
    got = watcher.poll()
    assert [(s.node_id, s.device_class) for s in got] == [("2", "cuda-a100")] * 2
    [(dc, executors)] = added
    assert dc == "cuda-a100" and len(executors) == 2
    assert any("10.0.0.3" in m and "'cuda-l4'" in m and "left alone" in m for m in logged)
    assert any("10.0.0.4" in m and "without a GPU" in m for m in logged)
    assert watcher.poll() == [] and len(added) == 1  # each node is looked at once


def test_a_new_class_needs_a_price_when_prices_are_given() -> None:
    nodes = Nodes(_node("1", gpus=1, **A100))
    watcher, added, logged = _watcher(nodes, prices={"cuda-a100": 1.9, "cuda-h100": 4.0})
    nodes.nodes += [
        _node("2", gpus=1, **{"accelerator_type:H100": 1.0}),
        _node("3", gpus=1, **{"accelerator_type:L4": 1.0}),
    ]
    watcher.poll()
    assert [dc for dc, _ in added] == ["cuda-h100"]
    assert any("'cuda-l4'" in m and "--price does not price" in m for m in logged)


def test_a_node_whose_actors_cannot_start_is_logged_and_not_tried_again() -> None:
    nodes = Nodes(_node("1", gpus=1, **A100), _node("2", gpus=1, **A100))
    calls: list[int] = []
    logged: list[str] = []

    def fails(specs: list[NodeSpec]) -> list[Any]:
        calls.append(len(specs))
        raise ConfigError("render actors cannot start: out of memory")

    watcher = NodeWatcher(nodes, ["1"], fails, lambda *a: None, gpus=True, log=logged.append)
    assert watcher.poll() == [] and watcher.poll() == []
    assert calls == [1] and "did not start: render actors cannot start" in logged[0]


def test_the_watcher_thread_hands_a_joining_node_to_a_running_engine() -> None:
    # The engine's first worker holds its first batch until the joining node's worker
    # has rendered one, so that worker can only have come from the watcher's thread.
    joined = threading.Event()
    rendered = threading.Event()

    class Joins(FakeExecutor):
        def run(self, batch: Batch) -> BatchResult:
            result = FakeExecutor.run(self, batch)
            rendered.set()
            return result

    class Holds(FakeExecutor):
        waited: bool | None = None

        def run(self, batch: Batch) -> BatchResult:
            if not joined.is_set():
                joined.set()
                nodes.nodes.append(_node("2", gpus=1, **A100))
                Holds.waited = rendered.wait(timeout=30)
            return FakeExecutor.run(self, batch)

    nodes = Nodes(_node("1", gpus=1, **A100))
    sched = Scheduler(Dynamic(0.01, 4), qa=QAPolicy(threshold=0.5))
    rec = RecordingListener()
    first = Holds(device_class="cuda-a100")
    engine = RealtimeEngine(sched, {"cuda-a100": first}, NullScorer(), rec)
    for i in range(16):
        engine.submit(Request(f"r{i}", f"prompt {i}", KEY, base_seed=i))
    new: list[Any] = []

    def start(specs: list[NodeSpec]) -> list[Any]:
        new.extend(Joins(device_class=s.device_class) for s in specs)
        return new

    watcher = NodeWatcher(nodes, ["1"], start, engine.add_workers, gpus=True, interval_s=0.01)
    watcher.start_thread()
    try:
        engine.run()
    finally:
        watcher.stop()
    assert Holds.waited is True and new and new[0].batches
    accepted = sorted(ev.request.id for ev in rec.events(Accepted))
    assert accepted == sorted(f"r{i}" for i in range(16))


# -- on the local Ray --------------------------------------------------------------------------


def test_the_devices_of_a_real_local_ray_are_read_from_its_resources(local_ray: None) -> None:
    [node] = [n for n in ray.nodes() if n["Alive"]]
    specs = cluster_devices(ray.nodes())
    assert specs == [NodeSpec("cuda", "cuda-a100", 0, node["NodeID"], node["NodeManagerAddress"])]
    cpus = node_specs(ray.nodes(), gpus=False)
    assert [(s.device_class, s.threads) for s in cpus] == [("cpu", 1), ("cpu", 1)]
    with pytest.raises(ConfigError, match=r"no device to render on.*GPU 1, accelerator_type:A100"):
        cluster_devices(ray.nodes(), reserve=WorkerSpec("cuda:0", "score"))


def test_a_worker_of_a_departed_node_is_retired_and_a_joining_node_takes_the_run(
    local_ray: None,
) -> None:
    # The pool's one worker is pinned to a node that has left; the local node is "new".
    gone = RayWorker(NodeSpec("cuda", "cuda-a100", 0, "ff" * 28, "10.9.9.9"), SleepLoad(0.0))
    pool = RayPool([gone], auto=WorkerSpec("auto", "auto", 1), known_nodes=())
    with pytest.raises(WorkerLost, match=r"10\.9\.9\.9: the node has left the cluster"):
        gone.run(Batch(0, KEY, (), 0.0, 4))
    assert gone.starts == 0  # no actor was tried on the departed node
    sched = Scheduler(Dynamic(0.01, 4), qa=QAPolicy(threshold=0.5, max_attempts=1))
    rec = RecordingListener()
    engine = RealtimeEngine(sched, pool.executors(), NullScorer(), rec)
    for i in range(48):
        engine.submit(Request(f"r{i}", "a red circle", KEY, base_seed=i))
    try:
        watcher = pool.watch(engine.add_workers, interval_s=3600)  # polled by hand below
        assert watcher is not None and watcher.classes == {"cuda-a100"}
        [spec] = watcher.poll()  # before the run: applied as the loop starts
        engine.run()
        [joined] = pool.workers[1:]
        assert spec.node_id == ray.get_runtime_context().get_node_id()
        assert joined.starts == 1 and joined.actor is not None
    finally:
        pool.close()
    # The departed node's worker loses each batch it takes until it is retired, unless
    # the joined worker has emptied the queue first (the engine's own test of retirement
    # is tests/runtime/test_engine_growth.py); nothing is lost or accepted twice.
    lost = [st for st in rec.steps if st.kind == "lost"]
    assert 1 <= len(lost) <= MAX_LOSSES + 1
    accepted = sorted(ev.request.id for ev in rec.events(Accepted))
    assert accepted == sorted(f"r{i}" for i in range(48))  # each once


@pytest.mark.slow
@embedded
def test_actors_that_write_their_own_images_accept_what_one_worker_accepts(
    local_ray: None, reference: tuple[Path, dict[str, Any], Path]
) -> None:
    tmp, ref, ref_out = reference
    tree = tmp / "tree"
    summary, out = _run(
        tmp, "writes", "--backend", "ray", "--devices", "cpu:1,cpu:1", "--images", tree.as_uri(),
        steps=STEPS,
    )  # fmt: skip
    assert summary["accepted"] == ref["accepted"] and summary["escalated"] == ref["escalated"]
    assert not (out / "images").exists()  # the actors wrote the images; the driver moved them
    _same_images(_accepted(tree), _accepted(ref_out))
    seconds = json.loads((out / "ledger.json").read_text())["device_seconds"]
    assert seconds["score"] > 0 and not seconds.get("lost")


SLEEP_KEY = BatchKey("null", 8, 8, 1, True, "null", "fp32", "sleep")


def test_actors_handed_two_batches_at_once_lose_neither_when_one_dies(local_ray: None) -> None:
    specs = [WorkerSpec("cpu", "sleep", 1)] * 2
    with pytest.raises(ConfigError, match="--actor-depth must be from 1 to 8, got 0"):
        RayPool.start(specs, SleepLoad(0.0), depth=0)
    pool = RayPool.start(specs, SleepLoad(0.05), depth=2)
    try:
        lanes = pool.executors()["sleep"]
        # Each actor twice: two engine threads queue their batches on one actor.
        assert [id(x) for x in lanes] == [id(w) for w in pool.workers for _ in range(2)]
        sched = Scheduler(Dynamic(0.01, 4), qa=QAPolicy(threshold=0.5, max_attempts=1))
        rec = RecordingListener()
        engine = RealtimeEngine(sched, {"sleep": lanes}, NullScorer(), rec)
        for i in range(96):
            engine.submit(Request(f"r{i}", "a red circle", SLEEP_KEY, base_seed=i))
        victim = pool.workers[0]
        killed: list[bool] = []

        def kill_while_it_holds_a_batch() -> None:
            if victim.busy.wait(60) and victim.actor is not None:
                ray.kill(victim.actor)
                killed.append(True)

        killer = threading.Thread(target=kill_while_it_holds_a_batch, daemon=True)
        killer.start()
        engine.run()
        killer.join(timeout=5)
    finally:
        pool.close()
    assert killed
    # Both of its lanes may have held a batch on it: each comes back once, and the actor
    # is started again once, not once per lane.
    lost = [st for st in rec.steps if st.kind == "lost"]
    assert 1 <= len(lost) <= 2 and victim.starts == 2
    accepted = sorted(ev.request.id for ev in rec.events(Accepted))
    assert accepted == sorted(f"r{i}" for i in range(96))  # each once
