"""The service wired in-process on the null model: instant, so it tests the plumbing."""

from __future__ import annotations

import asyncio
from pathlib import Path

from renderq.api.config import ServiceConfig
from renderq.api.service import RenderService


def test_null_model_service_renders_batches_and_drains(tmp_path: Path) -> None:
    svc = RenderService(ServiceConfig(model="null", data_dir=tmp_path, max_batch_size=4))
    svc.start()
    assert svc.ready.wait(timeout=60), svc.load_error
    reqs = svc.build_requests("local", prompt="a red circle", n=3, seed=5, qa=False)
    assert {r.key.device_class for r in reqs} == {"null"}

    async def go() -> list[object]:
        return list(await svc.generate(reqs, None))

    results = asyncio.run(go())
    assert [r.state for r in results] == ["skipped"] * 3  # type: ignore[attr-defined]
    assert [r.seed for r in results] == [5, 6, 7]  # type: ignore[attr-defined]
    stats = svc.stats()
    assert stats["served"] == 3 and stats["capacity_images_per_s"] > 0
    svc.drain(timeout_s=30)
    assert svc.draining
