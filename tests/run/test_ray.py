"""The Ray backend on a local two-CPU Ray: render actors on the embedded models.

A job on two actors accepts what one in-process worker accepts; an actor killed while it
holds a batch loses nothing and repeats nothing; a render actor and the scorer on their
own device classes (the scorer an actor too) book to their classes, and a scorer actor
that dies is replaced.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from renderq.backends.ray_backend import RayPool
from renderq.core.errors import ConfigError

from .test_pool import _accepted, _run, _same_images, embedded

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, embedded]
STEPS = 8


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray with two CPUs for this module's tests."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
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


def test_an_actor_that_cannot_load_its_model_is_a_config_error(
    local_ray: None, tmp_path: Path
) -> None:
    from renderq.backends.pool import LoadSpec, WorkerSpec

    (tmp_path / "model_index.json").write_text("{}")
    with pytest.raises(ConfigError, match="a render or scorer actor cannot start"):
        RayPool.start([WorkerSpec("cpu", "cpu", 1)], LoadSpec(str(tmp_path), "broken"))
