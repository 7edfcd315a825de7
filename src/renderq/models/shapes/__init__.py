"""The embedded default models: a miniature Stable Diffusion and a tiny CLIP for a shapes world.

The shipped folders load with the same calls as hub checkpoints::

    from diffusers import StableDiffusionPipeline
    from transformers import CLIPModel, CLIPProcessor
    pipe = StableDiffusionPipeline.from_pretrained(default_pipeline_path())
    clip = CLIPModel.from_pretrained(default_clip_path())
    processor = CLIPProcessor.from_pretrained(default_clip_path())

Importing this package needs no heavy dependency; the loaders import lazily.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from renderq.models.shapes.build import DEFAULT_GUIDANCE, DEFAULT_STEPS
from renderq.models.shapes.common import WEIGHTS_DIR

DEFAULT_THRESHOLD = 0.7193
"""The shipped scorer's gate, a cosine: ``gate_threshold / 100`` of ``weights/figures.json``.

``python -m renderq.models.shapes evaluate`` calibrates it on mini-SD renders (of 500
prompts for the shipped value) as the highest threshold that keeps 96% of the images the
pixel oracle passes (whole-prompt check); renderq's commands use it as the embedded
scorer's default.
"""

__all__ = [
    "DEFAULT_GUIDANCE",
    "DEFAULT_STEPS",
    "DEFAULT_THRESHOLD",
    "default_clip_path",
    "default_pipeline_path",
    "example_prompt",
    "load_default_clip",
    "load_default_pipeline",
    "unknown_words",
]


def unknown_words(prompt: str) -> list[str]:
    """Words of ``prompt`` the shapes world does not know, once each, in prompt order.

    Case and punctuation are ignored (``"A red circle."`` has none); an empty list means
    every word is in the world's vocabulary. The embedded models never saw the others, so
    a prompt with any renders something unrelated to them.
    """
    from renderq.models.shapes.world import unknown_words as _unknown_words

    return _unknown_words(prompt)


def example_prompt() -> str:
    """A prompt inside the world's grammar, to quote beside a warning about unknown words."""
    from renderq.models.shapes.world import EXAMPLE_PROMPT

    return EXAMPLE_PROMPT


def default_pipeline_path() -> Path:
    """Folder of the shipped mini-SD ``StableDiffusionPipeline`` (``weights/mini-sd``)."""
    return WEIGHTS_DIR / "mini-sd"


def default_clip_path() -> Path:
    """Folder of the shipped tiny CLIP, model and processor (``weights/clip``)."""
    return WEIGHTS_DIR / "clip"


def _require_weights(path: Path) -> Path:
    if not path.is_dir():
        raise FileNotFoundError(
            f"embedded weights missing at {path}; rebuild them with "
            "'python -m renderq.models.shapes train --stage all' then 'build'"
        )
    return path


def load_default_pipeline() -> Any:
    """``StableDiffusionPipeline.from_pretrained`` on the shipped mini-SD (CPU, float32)."""
    try:
        from diffusers import StableDiffusionPipeline
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("mini-SD needs the extra: pip install 'renderq[diffusers]'") from exc
    return StableDiffusionPipeline.from_pretrained(_require_weights(default_pipeline_path()))


def load_default_clip() -> tuple[Any, Any]:
    """``(CLIPModel, CLIPProcessor)`` loaded from the shipped tiny CLIP folder."""
    try:
        from transformers import CLIPModel, CLIPProcessor
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the tiny CLIP needs the extra: pip install 'renderq[diffusers]'"
        ) from exc
    path = _require_weights(default_clip_path())
    return CLIPModel.from_pretrained(path).eval(), CLIPProcessor.from_pretrained(path)
