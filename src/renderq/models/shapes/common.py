"""Helpers shared by the training scripts: paths, checkpoints, batches of world images."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from renderq.models.shapes import world

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
"""Folder of the shipped weights inside the installed package."""

DEFAULT_CHECKPOINTS = Path("checkpoints") / "shapes"
"""Default folder (relative to the working directory) for resumable training state."""


def step_rng(seed: int, step: int) -> random.Random:
    """A generator for one training step, so a resumed run sees the same data stream."""
    return random.Random(seed * 1_000_003 + step)


def images_to_tensor(images: list[np.ndarray]) -> Any:
    """Stack ``uint8`` HWC images into a float tensor in [-1, 1], shape (N, 3, H, W)."""
    import torch

    array = np.stack(images).astype(np.float32) / 127.5 - 1.0
    return torch.from_numpy(array).permute(0, 3, 1, 2).contiguous()


def tensor_to_images(batch: Any) -> list[np.ndarray]:
    """Inverse of :func:`images_to_tensor`: (N, 3, H, W) in [-1, 1] to ``uint8`` HWC arrays."""
    array = ((batch.detach().clamp(-1, 1) + 1.0) * 127.5).round().byte()
    return list(array.permute(0, 2, 3, 1).cpu().numpy())


def world_batch(
    rng: random.Random, n: int, two_shape_prob: float = 0.3, short_forms: bool = True
) -> tuple[Any, list[str]]:
    """``n`` random scenes as an image tensor in [-1, 1] and their captions.

    With ``short_forms`` (the default) each caption takes the random form of
    :func:`world.training_caption` (size words or background clause sometimes left out).
    """
    scenes = world.sample_batch(rng, n, two_shape_prob)
    captions = [world.training_caption(s, rng) if short_forms else s.caption() for s in scenes]
    return images_to_tensor([world.render(s) for s in scenes]), captions


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write a training checkpoint atomically (a crash never leaves a half-written file)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """Load a checkpoint written by :func:`save_checkpoint`, or ``None`` if there is none."""
    import torch

    if not path.exists():
        return None
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    return state


def resume_training(path: Path, model: Any, optimizer: Any, name: str) -> int:
    """Load model and optimizer state from ``path`` if it exists; the step to continue at."""
    state = load_checkpoint(path)
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    print(f"[{name}] resumed at step {state['step']}", flush=True)
    return int(state["step"])


def save_training(path: Path, model: Any, optimizer: Any, step: int) -> None:
    """Checkpoint model and optimizer after ``step`` steps (read by :func:`resume_training`)."""
    save_checkpoint(
        path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    )


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up then cosine decay to a tenth of ``peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + float(np.cos(np.pi * progress))))


class Progress:
    """Prints a line every ``every`` seconds with the step, loss and speed."""

    def __init__(self, name: str, total: int, every: float = 30.0) -> None:
        """Start timing a run of ``total`` steps."""
        self.name = name
        self.total = total
        self.every = every
        self.start = time.monotonic()
        self.last = self.start
        self.losses: list[float] = []

    def update(self, step: int, loss: float) -> None:
        """Record a loss; print a summary line if ``every`` seconds have passed."""
        self.losses.append(loss)
        now = time.monotonic()
        if now - self.last >= self.every or step + 1 == self.total:
            mean = sum(self.losses) / len(self.losses)
            rate = (now - self.last) / max(1, len(self.losses))
            print(
                f"[{self.name}] step {step + 1}/{self.total} loss {mean:.4f} {rate:.2f}s/step",
                flush=True,
            )
            self.losses.clear()
            self.last = now
