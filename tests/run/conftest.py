"""Shared fixtures: tiny seeded diffusers and CLIP checkpoints, built once per session."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from renderq.backends.clip import ClipScorer  # noqa: E402
from renderq.backends.diffusers import DiffusersExecutor  # noqa: E402
from renderq.core.settings import Batching, ModelSpec, QASettings  # noqa: E402
from renderq.jobs.runner import RunSettings  # noqa: E402
from renderq.testing.tiny import build_tiny_clip, build_tiny_pipeline  # noqa: E402

# Two cores are shared with other work; one thread per process keeps runs predictable.
torch.set_num_threads(1)

PROMPTS = [
    "a small red circle on a blue background",
    "a large green square on a black background",
    "a small yellow triangle on a white background",
    "a large purple circle on a green background",
    "a small orange square on a red background",
    "a large blue triangle on a yellow background",
    "a small white circle on a purple background",
    "a large black square on an orange background",
]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny StableDiffusionPipeline folder (32x32 images)."""
    return build_tiny_pipeline(tmp_path_factory.mktemp("tiny-sd"), sample_size=16)


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny CLIPModel + CLIPProcessor folder."""
    return build_tiny_clip(tmp_path_factory.mktemp("tiny-clip"))


@pytest.fixture(scope="session")
def executor(tiny_model: Path) -> DiffusersExecutor:
    """The tiny pipeline loaded once for the session."""
    return DiffusersExecutor.load(str(tiny_model), name="tiny-sd")


@pytest.fixture(scope="session")
def scorer(tiny_clip: Path) -> ClipScorer:
    """The tiny CLIP scorer loaded once for the session."""
    return ClipScorer.load(str(tiny_clip), name="tiny-clip")


def write_prompts(path: Path, prompts: list[str] | None = None) -> Path:
    """Write a text prompts file."""
    path.write_text("\n".join(prompts or PROMPTS) + "\n", encoding="utf-8")
    return path


def settings_kwargs(model: Path, clip: Path, **over: Any) -> dict[str, Any]:
    """The tiny models' settings by flag name: 3 steps, a threshold some images miss."""
    kw: dict[str, Any] = {
        "model": str(model),
        "scorer": str(clip),
        "steps": 3,
        "threshold": -0.2,
        "max_attempts": 3,
        "max_batch_size": 4,
    }
    kw.update(over)
    return kw


def run_settings(prompts: Path, out: Path, model: Path, clip: Path, **over: Any) -> RunSettings:
    """The RunSettings of :func:`settings_kwargs`, each setting in its part of the family."""
    kw = settings_kwargs(model, clip, **over)
    parts = [
        {k: kw.pop(k) for k in [f.name for f in fields(cls)] if k in kw}
        for cls in (ModelSpec, Batching, QASettings)
    ]
    spec, batching, qa = ModelSpec(**parts[0]), Batching(**parts[1]), QASettings(**parts[2])
    return RunSettings(prompts, out, spec, batching, qa, **kw)
