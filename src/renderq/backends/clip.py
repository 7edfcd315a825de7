"""The CLIP scorer: cosine similarity between an image and its prompt, batched.

Any ``transformers`` CLIP checkpoint works (a folder or a hub id) as long as a
``CLIPProcessor`` (image processor + tokenizer) is saved beside the model. Scores are
cosine similarities in [-1, 1]; ``scale100=True`` gives the CLIPScore scale,
``100 * max(cos, 0)``. Prompts longer than the text tower are truncated, as CLIP does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from renderq.backends.device import on_device
from renderq.backends.diffusers import DeviceTimer, check_device, import_torch, looks_local
from renderq.core.errors import ConfigError
from renderq.core.types import ScoreResult

_INSTALL = "the CLIP scorer needs torch and transformers: pip install 'renderq[diffusers]'"


def load_clip(model: str, *, device: str = "cpu") -> tuple[Any, Any]:
    """Load a CLIP model and its processor from a folder or hub id."""
    check_device(device)
    if looks_local(model) and not (Path(model).expanduser() / "config.json").is_file():
        raise ConfigError(f"scorer {model!r} is not a transformers model folder (no config.json)")
    try:
        from transformers import CLIPModel, CLIPProcessor
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(_INSTALL) from exc
    path = str(Path(model).expanduser())
    try:
        clip = CLIPModel.from_pretrained(path)
        processor = CLIPProcessor.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load CLIP scorer {model!r}: {exc}") from exc
    clip.eval()
    return clip.to(device), processor


@dataclass(slots=True)
class ClipScorer:
    """Scores images (uint8 HWC arrays or PIL images) against prompts with a CLIP model."""

    model: Any
    processor: Any
    name: str
    device: str = "cpu"
    scale100: bool = False
    device_class: str = ""
    clock: Callable[[], float] = time.perf_counter
    timer: DeviceTimer = field(init=False)

    def __post_init__(self) -> None:
        if not self.device_class:
            self.device_class = self.device
        self.timer = DeviceTimer(self.device, self.clock)

    @classmethod
    def load(
        cls, model: str, *, device: str = "cpu", scale100: bool = False, name: str | None = None
    ) -> ClipScorer:
        """Load a CLIP checkpoint; ``name`` labels it in metadata and calibration files."""
        clip, processor = on_device(device, lambda: load_clip(model, device=device))
        return cls(clip, processor, name or model, device=device, scale100=scale100)

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        """One score per (image, prompt) pair, plus the device-seconds the batch took."""
        if len(images) != len(prompts):
            raise ConfigError(f"{len(images)} images but {len(prompts)} prompts to score")
        cos, seconds = self.timer.measure(lambda: self.cosine(images, prompts))
        scores = tuple(100.0 * max(c, 0.0) for c in cos) if self.scale100 else tuple(cos)
        return ScoreResult(scores, seconds, self.device_class)

    def cosine(self, images: Sequence[Any], prompts: Sequence[str]) -> list[float]:
        """Cosine similarity of each image's and prompt's CLIP embeddings."""
        torch = import_torch()
        max_len = getattr(self.processor.tokenizer, "model_max_length", 77)
        inputs = self.processor(
            text=list(prompts),
            images=list(images),
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=max_len,
        )
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        with torch.inference_mode():
            out = self.model(**inputs)
        img = torch.nn.functional.normalize(out.image_embeds.float(), dim=-1)
        txt = torch.nn.functional.normalize(out.text_embeds.float(), dim=-1)
        return [float(v) for v in (img * txt).sum(dim=-1).cpu()]
