"""Train the tiny CLIP contrastively on the shapes world and export it with ``save_pretrained``.

The exported folder loads with ``CLIPModel.from_pretrained`` and ``CLIPProcessor.from_pretrained``
exactly like a hub checkpoint. Its text tower is mini-SD's frozen text encoder; the scorer
continues from it in the gate phase (``clip_gate``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from renderq.models.shapes import common, tokenizer, world

CLIP_SEED = 1
"""Seed of the CLIP data stream and initial weights."""


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
) -> Path:
    """Train (or resume) the tiny CLIP; export model, tokenizer and processor to ``out_dir``."""
    import torch
    from transformers import CLIPModel

    seed, name, peak = CLIP_SEED, "clip", 1e-3
    torch.manual_seed(seed)
    tok = tokenizer.build_tokenizer(checkpoints / "tokenizer")
    model = CLIPModel(clip_config(len(tok)))
    trainable = list(model.parameters())
    optimizer = torch.optim.AdamW(trainable, lr=peak, weight_decay=0.05)
    ckpt_path = checkpoints / name / "ckpt.pt"
    start = common.resume_training(ckpt_path, model, optimizer, name) if resume else 0
    progress = common.Progress(name, steps)
    model.train()
    for step in range(start, steps):
        rng = common.step_rng(seed, step)
        scenes = world.sample_batch(rng, batch_size)
        images = common.images_to_tensor([world.render(s) for s in scenes])
        captions = [world.training_caption(s, rng) for s in scenes]
        gen = torch.Generator().manual_seed(seed * 7919 + step)
        images = degrade(images, gen)
        text = tok(
            captions,
            padding="max_length",
            max_length=tokenizer.MAX_LENGTH,
            return_tensors="pt",
        )
        for group in optimizer.param_groups:
            group["lr"] = common.cosine_lr(step, steps, peak, 100)
        out = model(
            input_ids=text["input_ids"],
            attention_mask=text["attention_mask"],
            pixel_values=images,
            return_loss=True,
        )
        loss = out.loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        progress.update(step, float(loss.detach()))
        if (step + 1) % checkpoint_every == 0 or step + 1 == steps:
            common.save_training(ckpt_path, model, optimizer, step + 1)
    return export_clip(model, tok, out_dir, checkpoints)


def hard_negative_loss(logits: Any) -> Any:
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
