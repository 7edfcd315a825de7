"""The local device pool: ``--devices`` parsing, several workers per class, worker processes.

The engine tests use fakes; the pool tests run ``renderq run`` on the embedded models with
two one-thread CPU worker processes, and kill one of them while it renders a batch.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from renderq.backends.pool import DevicePool, WorkerSpec, parse_devices
from renderq.backends.registry import DEFAULT_MODEL, DEFAULT_SCORER, resolve
from renderq.core.errors import ConfigError, WorkerLost
from renderq.core.events import Accepted
from renderq.core.policies import Window
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.types import Batch, BatchResult, RequestState, Stage
from renderq.runtime.realtime import MAX_LOSSES, RealtimeEngine
from renderq.testing.fakes import FakeExecutor, RecordingListener, ScriptedScorer

from .test_realtime import _requests

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "renderq" / "examples" / "shapes-200.txt"


# -- --devices ------------------------------------------------------------------------------


def test_devices_parse_into_one_worker_each() -> None:
    assert parse_devices("cpu:1,cpu:1") == [WorkerSpec("cpu", "cpu", 1)] * 2
    assert parse_devices("cpu") == [WorkerSpec("cpu", "cpu", 0)]
    assert parse_devices("cuda:0, cuda:1") == [
        WorkerSpec("cuda:0", "cuda"),
        WorkerSpec("cuda:1", "cuda"),
    ]
    assert parse_devices("cuda", cuda_count=lambda: 3) == [
        WorkerSpec(f"cuda:{i}", "cuda") for i in range(3)
    ]
    assert parse_devices("cuda:1=cuda-a100,cpu:2=host") == [
        WorkerSpec("cuda:1", "cuda-a100"),
        WorkerSpec("cpu", "host", 2),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "comma-separated list of devices, got ''"),
        ("cpu:1,", "comma-separated list of devices, got 'cpu:1,'"),
        ("gpu:0", "'gpu:0' is not cpu"),
        ("cpu:0", "'cpu:0': threads must be a whole number >= 1"),
        ("cpu:x", "'cpu:x': threads"),
        ("cuda:-1", "'cuda:-1': GPU index"),
        ("cuda:0,cuda:0", "names a GPU twice"),
        ("cpu:1=a b", "device class in 'cpu:1=a b'"),
    ],
)
def test_bad_devices_are_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_devices(text)


def test_cuda_without_a_gpu_says_so() -> None:
    with pytest.raises(ConfigError, match="'cuda': no CUDA device is visible"):
        parse_devices("cuda", cuda_count=lambda: 0)


def test_an_empty_pool_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least one device"):
        DevicePool([])


# -- several workers per device class in the engine -----------------------------------------


@dataclass
class MeetingExecutor(FakeExecutor):
    """Waits (bounded) at a barrier on its first batch: returns only if a peer ran alongside."""

    barrier: threading.Barrier | None = None
    met: list[bool] = field(default_factory=list)

    def run(self, batch: Batch) -> BatchResult:
        if self.barrier is not None and not self.met:
            try:
                self.barrier.wait(timeout=30)
                self.met.append(True)
            except threading.BrokenBarrierError:
                self.met.append(False)
        return FakeExecutor.run(self, batch)


def _engine(
    executors: list[Any], n: int, scorer: Any = None
) -> tuple[RealtimeEngine, RecordingListener]:
    sched = Scheduler(Window(batch_size=2), qa=QAPolicy(threshold=0.5, max_attempts=2))
    rec = RecordingListener()
    engine = RealtimeEngine(sched, {"cpu": executors}, scorer or ScriptedScorer(), rec)
    for r in _requests(n):
        engine.submit(r)
    return engine, rec


def test_two_workers_of_one_class_render_at_the_same_time() -> None:
    barrier = threading.Barrier(2)
    a, b = MeetingExecutor(barrier=barrier), MeetingExecutor(barrier=barrier)
    engine, rec = _engine([a, b], 8)
    engine.run()
    assert a.met == [True] and b.met == [True]  # each waited for the other: both ran at once
    assert sorted(ev.request.id for ev in rec.events(Accepted)) == sorted(f"r{i}" for i in range(8))
    assert len(a.batches) + len(b.batches) == 4


class ThreadDeath(BaseException):
    """Ends a worker thread from inside."""


@dataclass
class DiesOnce(MeetingExecutor):
    """Ends its worker thread on its first batch, then meets its peer at the barrier."""

    died: int = 0

    def run(self, batch: Batch) -> BatchResult:
        if not self.died:
            self.died += 1
            raise ThreadDeath("worker thread ended")
        return MeetingExecutor.run(self, batch)


def test_a_dead_worker_of_a_pool_comes_back_with_its_own_executor() -> None:
    # The dying executor is the first worker, so it takes the first batch. The other
    # waits at the barrier on its first batch, so only a restarted thread of the dead
    # worker can take the returned batch and meet it there.
    barrier = threading.Barrier(2)
    dying, steady = DiesOnce(barrier=barrier), MeetingExecutor(barrier=barrier)
    engine, rec = _engine([dying, steady], 8)
    engine.run()
    assert steady.met == [True] and dying.met == [True]
    assert sorted(ev.request.id for ev in rec.events(Accepted)) == sorted(f"r{i}" for i in range(8))
    assert all(s is RequestState.ACCEPTED for s in engine.scheduler.states().values())
    assert dying.died == 1 and dying.batches  # its thread was started again, on it
    assert [st.kind for st in rec.steps].count("lost") == 1


@dataclass
class AlwaysLost(FakeExecutor):
    """Loses every batch (its backend gone, or its thread ending); says when it gave up."""

    how: str = "backend"
    calls: int = 0
    retired: threading.Event = field(default_factory=threading.Event)

    def run(self, batch: Batch) -> BatchResult:
        self.calls += 1
        if self.calls > MAX_LOSSES:
            self.retired.set()
        if self.how == "thread":
            raise ThreadDeath("worker thread ended")
        raise WorkerLost("render process exited")


@dataclass
class WaitsFor(FakeExecutor):
    """Holds its first batch until ``event`` is set (bounded), then renders normally."""

    event: threading.Event = field(default_factory=threading.Event)
    waited: list[bool] = field(default_factory=list)

    def run(self, batch: Batch) -> BatchResult:
        if not self.waited:
            self.waited.append(self.event.wait(timeout=30))
        return FakeExecutor.run(self, batch)


@pytest.mark.parametrize("how", ["backend", "thread"])
def test_a_worker_that_always_loses_is_retired_and_the_class_goes_on(how: str) -> None:
    broken = AlwaysLost(how=how)
    # The steady worker holds its first batch until the broken one has given up, so the
    # broken one is the only worker taking batches meanwhile.
    steady = WaitsFor(event=broken.retired)
    engine, rec = _engine([steady, broken], 8)
    engine.run()
    assert steady.waited == [True]
    assert broken.calls == MAX_LOSSES + 1  # retired after that many in a row, not restarted
    assert [st.kind for st in rec.steps].count("lost") == MAX_LOSSES + 1
    accepted = sorted(ev.request.id for ev in rec.events(Accepted))
    assert accepted == sorted(f"r{i}" for i in range(8))  # each once, on the steady worker
    assert sum(b.size for b in steady.batches) == 8


def test_a_class_without_executors_is_refused() -> None:
    sched = Scheduler(Window(batch_size=2), qa=QAPolicy(threshold=0.5))
    with pytest.raises(ConfigError, match="'cpu' has no executor"):
        RealtimeEngine(sched, {"cpu": []}, ScriptedScorer(), RecordingListener())


# -- worker processes on the embedded models ------------------------------------------------


def _embedded() -> bool:
    try:
        resolve(DEFAULT_MODEL)
        resolve(DEFAULT_SCORER)
    except ConfigError:
        return False
    return True


embedded = pytest.mark.skipif(not _embedded(), reason="the embedded models are not built")


def _run(tmp: Path, out: str, *extra: str, steps: int = 4) -> tuple[dict[str, Any], Path]:
    from renderq.cli.main import app

    prompts = tmp / "prompts.txt"
    if not prompts.exists():
        lines = EXAMPLES.read_text(encoding="utf-8").splitlines()[:8]
        prompts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = [
        "run", str(prompts), "--out", str(tmp / out), "--steps", str(steps),
        "--threshold", "0.75", "--max-batch-size", "4", "--threads", "1", "--json", *extra,
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1]), tmp / out


def _accepted(out: Path) -> dict[tuple[str, int], Any]:
    """(id, seed) of every accepted image, with its pixels; ids must be unique."""
    import numpy as np
    from PIL import Image

    rows = [json.loads(x) for x in (out / "metadata.jsonl").read_text().splitlines()]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    return {
        (r["id"], r["seed"]): np.asarray(Image.open(out / r["file_name"])).astype(int) for r in rows
    }


def _same_images(a: dict[tuple[str, int], Any], b: dict[tuple[str, int], Any]) -> None:
    """The same (id, seed) set, the same pixels up to the last bits of batched kernels.

    A regenerated attempt may be batched with other mates on one worker than on two; CPU
    kernels then round differently in the last bits (seen: one pixel one level apart).
    """
    assert sorted(a) == sorted(b)
    for k in a:
        assert abs(a[k] - b[k]).max() <= 2, k


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Path]:
    """The reference: the job on one in-process worker."""
    tmp = tmp_path_factory.mktemp("pool")
    summary, out = _run(tmp, "one")
    return tmp, summary, out


@pytest.mark.slow
@embedded
def test_two_cpu_worker_processes_accept_what_one_worker_accepts(
    one_worker: tuple[Path, dict[str, Any], Path],
) -> None:
    tmp, ref, ref_out = one_worker
    summary, out = _run(tmp, "two", "--devices", "cpu:1,cpu:1")
    assert summary["accepted"] == ref["accepted"] and summary["escalated"] == ref["escalated"]
    assert summary["prompts"] == 8 and summary["accepted"] > 0
    # Images depend on the seed alone: the same (prompt, seed) set, the same pixels.
    _same_images(_accepted(out), _accepted(ref_out))
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["device_seconds"]["render"] > 0 and not ledger["device_seconds"].get("lost")


@pytest.mark.slow
@embedded
def test_a_worker_process_killed_mid_batch_loses_nothing_and_repeats_nothing(
    one_worker: tuple[Path, dict[str, Any], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from renderq.jobs import runner

    tmp = one_worker[0]
    _, ref_out = _run(tmp, "ref12", steps=12)
    pools: list[DevicePool] = []
    start_pool = runner.start_pool

    def capture(*args: Any, **kwargs: Any) -> DevicePool:
        pools.append(start_pool(*args, **kwargs))
        return pools[-1]

    monkeypatch.setattr(runner, "start_pool", capture)
    killed: list[int] = []

    def kill_one_while_it_renders() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for w in pools[0].workers if pools else ():
                if w.busy.wait(0.01) and w.pid is not None:
                    os.kill(w.pid, signal.SIGKILL)
                    killed.append(w.pid)
                    return

    killer = threading.Thread(target=kill_one_while_it_renders, daemon=True)
    killer.start()
    summary, out = _run(tmp, "killed", "--devices", "cpu:1,cpu:1", steps=12)
    killer.join(timeout=5)
    assert killed, "no worker was seen rendering"
    [pool] = pools
    assert sorted(w.starts for w in pool.workers) == [1, 2]  # the killed one was restarted
    assert summary["accepted"] + summary["escalated"] == 8
    # Nothing lost, nothing twice, nothing at a later seed than without the kill.
    _same_images(_accepted(out), _accepted(ref_out))
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["device_seconds"][Stage.LOST.value] > 0


# -- one device class per stage, priced ------------------------------------------------------


@pytest.mark.slow
@embedded
def test_render_and_score_on_their_own_classes_book_and_price_apart(
    one_worker: tuple[Path, dict[str, Any], Path],
) -> None:
    tmp, ref, _ = one_worker
    summary, out = _run(
        tmp, "classes", "--devices", "cpu:1=render-cpu", "--scorer-devices", "cpu=score-cpu",
        "--price", "render-cpu=0.05,score-cpu=0.02",
    )  # fmt: skip
    assert summary["accepted"] == ref["accepted"]
    ledger = json.loads((out / "ledger.json").read_text())
    for figures in (ledger, summary):
        by = figures["by_device_class"]
        assert set(by) == {"render-cpu", "score-cpu"}
        assert set(by["render-cpu"]["device_seconds"]) <= {"render", "regen"}
        assert set(by["score-cpu"]["device_seconds"]) <= {"score", "rescore"}
        for dc, price in (("render-cpu", 0.05), ("score-cpu", 0.02)):
            hours = by[dc]["gpu_hours"]
            assert hours > 0 and by[dc]["cost"] == pytest.approx(hours * price)
            assert by[dc]["cost_per_10k_accepted"] == pytest.approx(
                hours * price / ref["accepted"] * 10_000
            )
    assert ledger["cost_per_10k_accepted"] == pytest.approx(
        sum(v["cost_per_10k_accepted"] for v in ledger["by_device_class"].values())
    )


@pytest.mark.slow
@embedded
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--price", "cpu=0.05"], "no price for device class 'score-cpu'"),
        (["--scorer-devices", "cpu,cpu"], "--scorer-devices takes one device, got 'cpu,cpu'"),
        (["--price", "cpu=free"], "--price entry 'cpu=free' is not CLASS=PRICE"),
        (["--actor-depth", "2"], "--actor-depth 2 queues batches on Ray actors: add --backend"),
        (["--actor-depth", "9", "--backend", "ray"], "--actor-depth must be from 1 to 8, got 9"),
    ],
)
def test_bad_stage_classes_and_prices_are_named(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    from renderq.cli.main import app

    prompts = tmp_path / "p.txt"
    prompts.write_text("a blue circle\n", encoding="utf-8")
    args = ["run", str(prompts), "--out", str(tmp_path / "out"), "--steps", "2", "--threads", "1"]
    if "--scorer-devices" not in extra:
        args += ["--scorer-devices", "cpu=score-cpu"]
    result = CliRunner().invoke(app, [*args, *extra])
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "out" / "images").exists() or not any(
        (tmp_path / "out" / "images").iterdir()
    )


# -- worker processes without a model: sleeping workers --------------------------------------


def test_sleeping_worker_processes_take_every_batch_and_survive_a_kill() -> None:
    from renderq.backends.null import NullScorer, SleepLoad

    with DevicePool.start([WorkerSpec("cpu", "cpu", 1)] * 2, SleepLoad(0.3)) as pool:
        assert len({w.pid for w in pool.workers}) == 2
        engine, rec = _engine(pool.executors()["cpu"], 8, NullScorer())
        killed: list[int] = []

        def kill_first_busy() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not killed:
                for w in pool.workers:
                    if w.busy.wait(0.01) and w.pid is not None:
                        os.kill(w.pid, signal.SIGKILL)
                        killed.append(w.pid)
                        return

        killer = threading.Thread(target=kill_first_busy, daemon=True)
        killer.start()
        engine.run()
        killer.join(timeout=5)
        assert killed
        assert sorted(ev.request.id for ev in rec.events(Accepted)) == [f"r{i}" for i in range(8)]
        assert [st.kind for st in rec.steps].count("lost") == 1
        assert sorted(w.starts for w in pool.workers) == [1, 2]
        assert killed[0] not in {w.pid for w in pool.workers}
    assert all(w.pid is None for w in pool.workers)  # closed


def test_a_worker_that_cannot_load_is_a_config_error_naming_its_device() -> None:
    from renderq.backends.null import SleepLoad

    with pytest.raises(ConfigError, match=r"render worker on cpu cannot start: .*-1"):
        DevicePool.start([WorkerSpec("cpu", "cpu", 1)], SleepLoad(-1.0))


@pytest.mark.slow
@embedded
def test_step_mode_on_two_devices_runs_a_loop_on_each_and_accepts_what_one_loop_does(
    one_worker: tuple[Path, dict[str, Any], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.step_loops import capture_step_loops

    tmp = one_worker[0]
    loops = capture_step_loops(monkeypatch)
    ref, ref_out = _run(tmp, "step-one", "--mode", "step")
    assert len(loops) == 1
    summary, out = _run(tmp, "step-two", "--mode", "step", "--devices", "cpu:1,cpu:1")
    assert len(loops) == 3 and all(loop.steps_run for loop in loops[1:])  # both loops ran
    assert summary["accepted"] == ref["accepted"] and summary["escalated"] == ref["escalated"]
    _same_images(_accepted(out), _accepted(ref_out))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--backend", "ray"], "--mode step runs a step loop per device in this process"),
        (["--devices", "cpu:1,cpu:2"], "give every cpu worker the same threads, not [1, 2]"),
    ],
)
def test_step_mode_refuses_what_its_loops_cannot_do(
    tmp_path: Path, extra: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from renderq.cli.main import app
    from renderq.jobs import workers

    # Ray's devices are read from a cluster: none is started for a refusal.
    monkeypatch.setattr(workers, "device_specs", lambda text, backend, address: parse_devices(text))
    prompts = tmp_path / "p.txt"
    prompts.write_text("a blue circle\n", encoding="utf-8")
    args = ["run", str(prompts), "--out", str(tmp_path / "out"), "--mode", "step",
            "--devices", "cpu:1,cpu:1", "--steps", "2", *extra]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and message in result.output, result.output
