"""``run``, ``bench`` and ``serve`` build their engine one way, from the same ``Batching``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from renderq.backends.clip import ClipScorer
from renderq.backends.diffusers import DiffusersExecutor
from renderq.bench.harness import Scenario
from renderq.bench.real import RealBench
from renderq.core.settings import Batching, ModelSpec, QASettings, make_policy
from renderq.jobs.runner import run_job
from renderq.runtime.realtime import RealtimeEngine
from renderq.service.config import ServiceConfig
from renderq.service.render import RenderService
from renderq.testing.fakes import FakeExecutor, ScriptedScorer

from .conftest import run_settings, write_prompts
from .test_realtime import KEY

pytestmark = pytest.mark.slow

#: Not the defaults of any shell: a shell that ignored it would show.
BATCHING = Batching("dynamic", max_batch_size=3, max_queue_delay_s=0.2, score_batch_size=2)


def test_run_bench_and_serve_build_the_same_engine_from_one_batching(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    built: list[RealtimeEngine] = []
    build = RealtimeEngine.build.__func__  # type: ignore[attr-defined]

    def recording(cls: type[RealtimeEngine], *args: Any, **kwargs: Any) -> RealtimeEngine:
        built.append(build(cls, *args, **kwargs))
        return built[-1]

    monkeypatch.setattr(RealtimeEngine, "build", classmethod(recording))

    flags = {"mode": "dynamic", "max_batch_size": 3, "max_queue_delay_s": 0.2}
    s = run_settings(
        write_prompts(tmp_path / "p.txt"), tmp_path / "out", tiny_model, tiny_clip,
        score_batch_size=2, threshold=-1.0, **flags,
    )  # fmt: skip
    assert s.batching == BATCHING
    run_job(s, executor=executor, scorer=scorer)

    # The bench's harness hands it the policy made from the command's batching.
    bench = RealBench(
        FakeExecutor(), ScriptedScorer(), KEY, ["p"], QASettings(0.5), 7.5,
        score_batch_size=BATCHING.score_batch_size,
    )  # fmt: skip
    bench.run(make_policy(BATCHING), Scenario("offline", 4))

    svc = RenderService(ServiceConfig(spec=ModelSpec("null"), data_dir=tmp_path, batching=BATCHING))
    svc.start()
    assert svc.ready.wait(timeout=60), svc.load_error
    svc.drain(timeout_s=30)

    assert len(built) == 3  # one engine per shell, each through the one constructor
    assert [e.scheduler.policy for e in built] == [make_policy(BATCHING)] * 3
    assert [e.score_batch_size for e in built] == [2, 2, 2]
