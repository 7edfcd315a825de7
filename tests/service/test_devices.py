"""``renderq serve`` with a device pool (``devices``) or a step loop (``mode = "step"``), over
the socket: each renders what the service's own executor renders, and ends with the service."""

from __future__ import annotations

import base64
import io
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.service.conftest import Server, start_server, write_config
from tests.service.test_service import wait_job

pytestmark = pytest.mark.slow

BODY = {"prompt": "a small red circle on a blue background", "n": 2, "seed": 11}


def _pool_workers(pid: int) -> set[int]:
    """The server's child processes started by the pool (``spawn`` workers)."""
    children: set[int] = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        text = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        children.update(int(c) for c in text)
    return {c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()}


def _image(item: dict[str, object]) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(str(item["b64_json"]))))


def _pixels(item: dict[str, object]) -> bytes:
    return _image(item).tobytes()


def _job_and_three_calls(c: httpx.Client, prompt: str, n: int) -> list[httpx.Response]:
    """A bulk job of ``n`` prompts and three interactive calls beside it; waits for both
    and checks that every prompt was accepted and every call answered."""
    job = c.post("/v1/jobs", json={"prompts": [f"{prompt} {i}" for i in range(n)]})
    assert job.status_code == 202, job.text
    with ThreadPoolExecutor(3) as ex:
        answers = list(ex.map(lambda _: c.post("/v1/images/generations", json=BODY), range(3)))
    status = wait_job(c, job.json()["id"], {"done"})
    assert (status["accepted"], status["pending"]) == (n, 0), status
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    return answers


def test_a_pool_of_two_cpu_workers_serves_what_one_executor_serves(
    tmp_path: Path, models: tuple[Path, Path], server: Server
) -> None:
    cfg = write_config(tmp_path / "renderq.toml", tmp_path / "data", *models,
                       devices="cpu:1,cpu:1")  # fmt: skip
    pool = start_server(cfg, tmp_path / "data", tmp_path / "server.log")
    try:
        workers = _pool_workers(pool.proc.pid)
        assert len(workers) == 2, workers
        with pool.client() as c, server.client() as alone:
            stats = c.get("/v1/stats").json()
            assert stats["render_workers"] == {"cpu": 2}
            assert stats["capacity_images_per_s"] > 0
            answers = _job_and_three_calls(c, "a red circle", 12)
            # Same seed, same image as the service without a pool renders in its own process.
            reference = alone.post("/v1/images/generations", json=BODY).json()["data"]
            for a in answers:
                got = a.json()["data"]
                assert [d["seed"] for d in got] == [11, 12]
                assert [_pixels(d) for d in got] == [_pixels(d) for d in reference]
    finally:
        assert pool.stop() in (0, -15)  # drained, then ended by the signal
    assert "devices cpu:1,cpu:1 (local)" in pool.log.read_text()
    # A drained service ends its workers.
    assert not any(Path(f"/proc/{w}").exists() for w in workers)


def test_bad_devices_are_refused_by_name(tmp_path: Path, models: tuple[Path, Path]) -> None:
    from typer.testing import CliRunner

    from renderq.cli.main import app

    cfg = write_config(tmp_path / "renderq.toml", tmp_path / "data", *models, devices="gpu:0")
    result = CliRunner().invoke(app, ["serve", "--config", str(cfg), "--port", "0"])
    assert result.exit_code != 0
    assert "gpu:0" in result.output
    ray = CliRunner().invoke(app, ["serve", "--config", str(cfg), "--backend", "ray",
                                   "--devices", ""])  # fmt: skip
    assert ray.exit_code != 0 and "backend 'ray' needs devices" in ray.output


@pytest.mark.parametrize("devices", ["", "cpu:1,cpu:1"], ids=["one-loop", "loop-per-device"])
def test_step_mode_serves_the_images_whole_batches_give(
    tmp_path: Path, models: tuple[Path, Path], server: Server, devices: str
) -> None:
    cfg = write_config(tmp_path / "renderq.toml", tmp_path / "data", *models, mode="step",
                       devices=devices)  # fmt: skip
    step = start_server(cfg, tmp_path / "data", tmp_path / "server.log")
    try:
        with step.client() as c, server.client() as whole:
            stats = c.get("/v1/stats").json()
            # Each loop's slots: its running batch (max_batch_size 4) and as many again
            # kept for interactive work.
            loops = 2 if devices else 1
            assert stats["render_workers"] == {"cpu": 2 * 4 * loops}, stats
            answers = _job_and_three_calls(c, "a blue square", 10)
            reference = whole.post("/v1/images/generations", json=BODY).json()["data"]
            want = [np.asarray(_image(d), dtype=int) for d in reference]
            for a in answers:
                got = a.json()["data"]
                assert [(d["seed"], d["batch_size"]) for d in got] == [(11, 1), (12, 1)]
                # The step loop's running batch changes the float32 summation order, not
                # the image: at most one uint8 level apart from the whole-batch render.
                for d, w in zip(got, want, strict=True):
                    assert np.abs(np.asarray(_image(d), dtype=int) - w).max() <= 1
            stats = c.get("/v1/stats").json()
            assert stats["ledger"]["total_device_seconds"] > 0
    finally:
        assert step.stop() in (0, -15)
    log = step.log.read_text()
    assert "drained" in log and "Traceback" not in log


def test_step_mode_is_refused_where_it_cannot_run(tmp_path: Path) -> None:
    from renderq.core.errors import ConfigError
    from renderq.service.config import load_config

    with pytest.raises(ConfigError, match="backend 'ray' is not supported"):
        load_config(None, mode="step", devices="cpu:1,cpu:1", backend="ray")
    with pytest.raises(ConfigError, match=r"mode must be 'dynamic' or 'step'.*'window'"):
        load_config(None, mode="window")
    from renderq.backends.null import NullExecutor
    from renderq.service.loading import Workers

    with pytest.raises(ConfigError, match=r"mode 'step' drives a diffusers pipeline.*'null'"):
        Workers.start(load_config(None, mode="step", model="null"), NullExecutor())


def test_the_services_step_loops_count_their_steps_but_keep_no_trace(
    models: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A service's loops live as long as it does: a trace of every step would grow for ever.
    from renderq.backends.diffusers import DiffusersExecutor
    from renderq.service.config import load_config
    from renderq.service.loading import Workers
    from tests.step_loops import capture_step_loops

    loops = capture_step_loops(monkeypatch)
    executor = DiffusersExecutor.load(str(models[0]), name=str(models[0]))
    workers = Workers.start(load_config(None, mode="step", model=str(models[0])), executor)
    try:
        assert len(loops) == 1 and not loops[0].record
    finally:
        workers.close()
