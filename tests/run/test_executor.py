"""The diffusers executor on a real tiny pipeline: invariance, per-item faults, OOM splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from renderq.backends.diffusers import DiffusersExecutor, torch_dtype
from renderq.backends.faults import FaultyPipeline
from renderq.core.errors import ConfigError
from renderq.core.types import Batch, BatchKey, Request

from .conftest import PROMPTS


def _key(ex: DiffusersExecutor, steps: int = 3) -> BatchKey:
    w, h = ex.default_size()
    return BatchKey("tiny-sd", w, h, steps, True, ex.sampler, "fp32", ex.device_class)


def _batch(ex: DiffusersExecutor, n: int, *, first_seed: int = 100, bid: int = 1) -> Batch:
    key = _key(ex)
    reqs = tuple(
        Request(f"r{i}", PROMPTS[i % len(PROMPTS)], key, base_seed=first_seed + i) for i in range(n)
    )
    return Batch(bid, key, reqs, 0.0, n)


def test_image_depends_only_on_its_seed(executor: DiffusersExecutor) -> None:
    """The same request alone and inside a batch of 4 gives the same image."""
    batch = _batch(executor, 4)
    together = executor.run(batch)
    alone = executor.run(Batch(2, batch.key, (batch.requests[2],), 0.0, 1))
    a = together.items[2].image.astype(int)
    b = alone.items[0].image.astype(int)
    assert a.shape == (32, 32, 3) and a.dtype.kind == "i"
    assert np.abs(a - b).max() <= 1  # float rounding may move a pixel by one level at most
    # ...and a different seed really gives a different image.
    assert np.abs(together.items[1].image.astype(int) - a).mean() > 1


def test_one_result_per_request_and_time_measured(executor: DiffusersExecutor) -> None:
    result = executor.run(_batch(executor, 3))
    assert [it.request_id for it in result.items] == ["r0", "r1", "r2"]
    assert all(it.ok for it in result.items)
    assert result.device_seconds > 0 and result.fitted_cap is None


def test_nan_item_fails_alone(executor: DiffusersExecutor) -> None:
    batch = _batch(executor, 4)
    faulty = DiffusersExecutor(FaultyPipeline(executor.pipeline, nan_seeds=frozenset({102})), "t")
    result = faulty.run(batch)
    assert [it.ok for it in result.items] == [True, True, False, True]
    assert "NaN" in (result.items[2].error or "")


def test_exception_on_one_item_fails_only_that_item(executor: DiffusersExecutor) -> None:
    pipe = FaultyPipeline(executor.pipeline, raise_seeds=frozenset({101}))
    result = DiffusersExecutor(pipe, "t").run(_batch(executor, 4))
    assert [it.ok for it in result.items] == [True, False, True, True]
    assert "injected failure" in (result.items[1].error or "")


def test_oom_batch_is_split_and_cap_reported(executor: DiffusersExecutor) -> None:
    """OOM at 8: the batch is bisected to fours, every image delivered, cap 4 reported."""
    pipe = FaultyPipeline(executor.pipeline, oom_at=8)
    result = DiffusersExecutor(pipe, "t").run(_batch(executor, 8))
    errors = [it.error for it in result.items]
    assert errors == [None] * 8, errors
    assert (result.fitted_cap, pipe.calls, pipe.ooms) == (4, [8, 4, 4], 1)


def test_oom_down_to_one(executor: DiffusersExecutor) -> None:
    pipe = FaultyPipeline(executor.pipeline, oom_at=2)
    result = DiffusersExecutor(pipe, "t").run(_batch(executor, 4))
    assert all(it.ok for it in result.items)
    assert result.fitted_cap == 1


def test_size_checks(executor: DiffusersExecutor) -> None:
    executor.check_size(32, 48)
    with pytest.raises(ConfigError, match="33x32"):
        executor.check_size(33, 32)


def test_unknown_model_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a diffusers pipeline folder"):
        DiffusersExecutor.load(str(tmp_path / "missing"))


def test_bad_precision_and_device() -> None:
    with pytest.raises(ConfigError, match="precision"):
        DiffusersExecutor.load("/nowhere", precision="fp8")
    with pytest.raises(ConfigError, match="device"):
        DiffusersExecutor.load("/nowhere", device="tpu")


def test_bf16_renders(tiny_model: Path) -> None:
    ex = DiffusersExecutor.load(str(tiny_model), precision="bf16", name="tiny-sd")
    assert ex.pipeline.unet.dtype == torch_dtype("bf16")
    result = ex.run(_batch(ex, 2))
    assert all(it.ok for it in result.items)
    assert result.items[0].image.dtype == np.uint8


def test_device_timer_reads_the_clock_around_the_work() -> None:
    from renderq.backends.diffusers import DeviceTimer

    ticks = iter([10.0, 12.5])
    out, seconds = DeviceTimer("cpu", clock=lambda: next(ticks)).measure(lambda: "done")
    assert (out, seconds) == ("done", 2.5)


def test_compiled_denoiser_renders_the_same_images_and_warms_each_shape_once(
    tiny_model: Path, executor: DiffusersExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    # The eager backend traces and guards like inductor without a C++ build (minutes here).
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real_compile(m, backend="eager", **kw))
    compiled = DiffusersExecutor.load(str(tiny_model), name="tiny-sd", compile=True)
    assert type(compiled.pipeline.unet).__name__ == "OptimizedModule"
    batch = _batch(executor, 2)
    first = compiled.run(batch)
    warm = compiled.warmup_s
    assert warm > 0 and len(compiled.warmed) == 1
    again = compiled.run(_batch(executor, 2, first_seed=200, bid=2))
    assert compiled.warmup_s == warm and len(compiled.warmed) == 1  # same shape: no warm-up
    compiled.run(_batch(executor, 3, bid=3))
    assert len(compiled.warmed) == 2 and compiled.warmup_s > warm  # a new batch size
    plain = executor.run(batch)
    for a, b in zip(first.items, plain.items, strict=True):
        assert np.abs(a.image.astype(int) - b.image.astype(int)).max() <= 1
    assert all(it.ok for it in again.items)


def test_channels_last_changes_the_layout_not_the_image(
    tiny_model: Path, executor: DiffusersExecutor
) -> None:
    import torch

    ex = DiffusersExecutor.load(str(tiny_model), name="tiny-sd", channels_last=True)
    conv = ex.pipeline.unet.conv_in.weight
    assert conv.is_contiguous(memory_format=torch.channels_last)
    batch = _batch(executor, 2)
    for a, b in zip(ex.run(batch).items, executor.run(batch).items, strict=True):
        assert np.abs(a.image.astype(int) - b.image.astype(int)).max() <= 1
