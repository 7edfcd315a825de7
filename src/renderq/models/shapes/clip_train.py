"""Train the tiny CLIP contrastively on the shapes world and export it with ``save_pretrained``.

The exported folder loads with ``CLIPModel.from_pretrained`` and ``CLIPProcessor.from_pretrained``
exactly like a hub checkpoint. Its text tower doubles as the frozen text encoder of mini-SD.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from renderq.models.shapes import common, tokenizer, world

CLIP_SEED = 1
"""Seed of the CLIP data stream and initial weights."""

VISION_STEPS = 400
"""Steps of the vision-only phase that follows the UNet (text tower frozen)."""


def clip_config(vocab_size: int) -> Any:
    """The tiny ``CLIPConfig``: ViT with 8 px patches on 64 px images, a 16-token text tower.

    The tokenizer puts its start and end tokens last, hence the special-token ids.
    """
    from transformers import CLIPConfig

    text = {
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "max_position_embeddings": tokenizer.MAX_LENGTH,
        "projection_dim": 64,
        "bos_token_id": vocab_size - 2,
        "eos_token_id": vocab_size - 1,
        "pad_token_id": vocab_size - 1,
    }
    vision = {
        "image_size": world.IMAGE_SIZE,
        "patch_size": 8,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "projection_dim": 64,
    }
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=64)


def image_processor() -> Any:
    """A ``CLIPImageProcessor`` for 64 px world images, normalising to [-1, 1]."""
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(
        do_resize=True,
        size={"shortest_edge": world.IMAGE_SIZE},
        do_center_crop=True,
        crop_size={"height": world.IMAGE_SIZE, "width": world.IMAGE_SIZE},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_convert_rgb=True,
    )


def degrade(images: Any, generator: Any) -> Any:
    """Blur and noise half of a batch so the gate also reads soft, generated-looking images."""
    import torch
    import torch.nn.functional as F

    n = images.shape[0]
    blurred = F.avg_pool2d(images, 3, stride=1, padding=1, count_include_pad=False)
    pick = (torch.rand(n, 1, 1, 1, generator=generator) < 0.5).float()
    sigma = torch.rand(n, 1, 1, 1, generator=generator) * 0.1
    noise = torch.randn(images.shape, generator=generator) * sigma
    return (pick * blurred + (1 - pick) * images + noise).clamp(-1, 1)


def train_clip(
    checkpoints: Path,
    out_dir: Path,
    steps: int = 520,
    batch_size: int = 128,
    resume: bool = True,
    checkpoint_every: int = 250,
    vision_only: bool = False,
) -> Path:
    """Train (or resume) the tiny CLIP; export model, tokenizer and processor to ``out_dir``.

    ``vision_only`` continues from the finished joint run with the text tower frozen, so
    mini-SD's text encoder (that tower) stays exactly as its UNet was trained against.
    """
    import torch
    from transformers import CLIPModel

    seed = CLIP_SEED + (100 if vision_only else 0)
    name = "clip-vision" if vision_only else "clip"
    torch.manual_seed(seed)
    tok = tokenizer.build_tokenizer(checkpoints / "tokenizer")
    model = CLIPModel(clip_config(len(tok)))
    peak = 5e-4 if vision_only else 1e-3
    if vision_only:
        joint = common.load_checkpoint(checkpoints / "clip" / "ckpt.pt")
        if joint is None:
            raise FileNotFoundError("the vision-only phase needs the joint CLIP checkpoint")
        model.load_state_dict(joint["model"])
        model.text_model.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=peak, weight_decay=0.05)
    ckpt_path = checkpoints / name / "ckpt.pt"
    start = 0
    state = common.load_checkpoint(ckpt_path) if resume else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        print(f"[{name}] resumed at step {start}", flush=True)
    progress = common.Progress(name, steps)
    model.train()
    if vision_only:
        model.text_model.eval()
    for step in range(start, steps):
        rng = common.step_rng(seed, step)
        scenes = world.sample_batch(rng, batch_size)
        images = common.images_to_tensor([world.render(s) for s in scenes])
        captions = [s.caption() for s in scenes]
        negatives = [c for s in scenes for c in hard_negatives(s, rng)] if vision_only else []
        gen = torch.Generator().manual_seed(seed * 7919 + step)
        images = degrade(images, gen)
        text = tok(
            captions + negatives,
            padding="max_length",
            max_length=tokenizer.MAX_LENGTH,
            return_tensors="pt",
        )
        for group in optimizer.param_groups:
            group["lr"] = common.cosine_lr(step, steps, peak, 0 if vision_only else 100)
        out = model(
            input_ids=text["input_ids"],
            attention_mask=text["attention_mask"],
            pixel_values=images,
            return_loss=not vision_only,
        )
        loss = out.loss if not vision_only else _hard_negative_loss(out.logits_per_image)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        progress.update(step, float(loss.detach()))
        if (step + 1) % checkpoint_every == 0 or step + 1 == steps:
            common.save_checkpoint(
                ckpt_path,
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step + 1,
                },
            )
    return export_clip(model, tok, out_dir, checkpoints)


def hard_negatives(scene: world.Scene, rng: random.Random) -> list[str]:
    """Captions that differ from the scene's only in the first shape's kind or colour."""
    first, rest = scene.shapes[0], scene.shapes[1:]
    used = {scene.background, *(s.colour for s in scene.shapes)}
    out = []
    for kind in world.SHAPES:
        if kind != first.kind:
            out.append(world.caption_for(scene.background, [replace(first, kind=kind), *rest]))
    colour = rng.choice([c for c in world.COLOURS if c not in used])
    out.append(world.caption_for(scene.background, [replace(first, colour=colour), *rest]))
    return out


def _hard_negative_loss(logits: Any) -> Any:
    """Symmetric CLIP loss over the batch, where each image also faces its own hard negatives.

    ``logits`` is (B, B + B*K): the B true captions first, then K negatives per image.
    """
    import torch
    import torch.nn.functional as F

    b = logits.shape[0]
    k = (logits.shape[1] - b) // b
    own = logits[:, b:].reshape(b, b, k)[torch.arange(b), torch.arange(b)]
    image_to_text = F.cross_entropy(torch.cat([logits[:, :b], own], 1), torch.arange(b))
    text_to_image = F.cross_entropy(logits[:, :b].T, torch.arange(b))
    return (image_to_text + text_to_image) / 2


def export_clip(model: Any, tok: Any, out_dir: Path, checkpoints: Path) -> Path:
    """Save model, tokenizer (with its source vocab/merges files) and processor to ``out_dir``."""
    from transformers import CLIPProcessor

    if out_dir.exists():
        shutil.rmtree(out_dir)
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    processor = CLIPProcessor(image_processor=image_processor(), tokenizer=tok)
    processor.save_pretrained(out_dir)
    image_processor().save_pretrained(out_dir)
    # Older transformers releases read the slow-tokenizer files, so ship them too.
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(checkpoints / "tokenizer" / name, out_dir / name)
    return out_dir
