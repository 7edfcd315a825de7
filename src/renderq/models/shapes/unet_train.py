"""Train mini-SD's ``UNet2DConditionModel`` by DDPM noise prediction in the VAE's latent space.

A fixed dataset of world images is encoded once (latent means, scaled like Stable
Diffusion's) together with the frozen text tower's hidden states for each distinct caption.
Training draws batches from it with a seeded per-step generator, drops 10% of captions to
the empty prompt so classifier-free guidance works, weights the loss with min-SNR (gamma 5)
for faster convergence, and keeps an exponential moving average of the weights for export.
"""

from __future__ import annotations

import copy
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from renderq.models.shapes import common, world

UNET_SEED = 3
"""Seed of the latent dataset, the batch stream and initial weights."""

DATASET_SIZE = 20_000
"""World images encoded once into the latent training set."""

TWO_SHAPE_SHARE = 0.3
"""Default share of two-shape scenes in the latent training set (the world's own share)."""

CAPTION_DROPOUT = 0.1
"""Share of training captions replaced by the empty prompt."""


@dataclass(frozen=True)
class UnetPhase:
    """One phase of the UNet recipe: a cosine schedule of its own, warm-started from the
    phase before (the first starts from fresh weights). ``short_share`` as in
    :func:`train_unet` (0: every caption in its full form, bar a two-shape caption's mixed
    sizes)."""

    steps: int
    lr: float
    warmup: int
    short_share: float | None
    two_shape_share: float = TWO_SHAPE_SHARE
    dataset_size: int = DATASET_SIZE


UNET_RECIPE = (
    UnetPhase(9000, 1e-3, 200, short_share=0.3, two_shape_share=0.5, dataset_size=40_000),
    UnetPhase(2000, 4e-4, 100, short_share=0.3, two_shape_share=0.5, dataset_size=40_000),
)
"""What ``train --stage unet`` (and ``--stage all``) runs without options: half two-shape
scenes captioned in the mix of forms the prompts come in, from the first step, then a
second phase at a lower rate on the same mix."""

TRAIN_TIMESTEPS = 1000
BETA_START = 0.00085
BETA_END = 0.012


def noise_scheduler_config() -> dict[str, Any]:
    """The noise schedule shared by training and the shipped inference scheduler."""
    return {
        "num_train_timesteps": TRAIN_TIMESTEPS,
        "beta_start": BETA_START,
        "beta_end": BETA_END,
        "beta_schedule": "scaled_linear",
        "prediction_type": "epsilon",
    }


def unet_model(cross_attention_dim: int = 128) -> Any:
    """A fresh tiny ``UNet2DConditionModel`` over 16x16x4 latents with cross-attention."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(32, 64, 64),
        layers_per_block=1,
        cross_attention_dim=cross_attention_dim,
        attention_head_dim=4,
        norm_num_groups=16,
    )


def encode_prompts(text_encoder: Any, tok: Any, prompts: list[str]) -> Any:
    """Hidden states of ``prompts`` exactly as ``StableDiffusionPipeline`` computes them."""
    import torch

    ids = tok(
        prompts,
        padding="max_length",
        max_length=tok.model_max_length,
        truncation=True,
        return_tensors="pt",
    ).input_ids
    with torch.no_grad():
        return torch.cat([text_encoder(chunk)[0] for chunk in ids.split(512)])


def latent_cache(
    checkpoints: Path,
    two_shape_share: float = TWO_SHAPE_SHARE,
    size: int = DATASET_SIZE,
    all_forms: bool = False,
) -> Path:
    """Where the latent set of ``size`` images, ``two_shape_share`` of two shapes, is cached."""
    if abs(two_shape_share - TWO_SHAPE_SHARE) < 1e-9 and size == DATASET_SIZE and not all_forms:
        return checkpoints / "unet" / "latents.pt"
    forms = "-forms" if all_forms else ""
    return checkpoints / "unet" / f"latents-{size}-two{round(100 * two_shape_share):02d}{forms}.pt"


def form_chances(short_share: float) -> dict[int, Any]:
    """Per shape count, the chance of each caption form in :func:`world.caption_forms`'
    order: the weights a set built with ``all_forms`` draws its captions by."""
    import torch

    one = world.Shape("circle", "red", "small", 20, 20, 0)
    two = world.Shape("square", "blue", "large", 44, 44, 0)
    scenes = {1: world.Scene("white", (one,)), 2: world.Scene("white", (one, two))}
    return {
        n: torch.tensor([p for _, p in world.caption_forms(scene, short_share)])
        for n, scene in scenes.items()
    }


def build_latent_dataset(
    checkpoints: Path,
    two_shape_share: float = TWO_SHAPE_SHARE,
    size: int = DATASET_SIZE,
    all_forms: bool = False,
) -> dict[str, Any]:
    """Encode ``size`` world images and their captions; cached under ``checkpoints``.

    ``two_shape_share`` of the scenes hold two shapes; each caption is in a random form.
    The stream is seeded, so the defaults give the same set as before these options
    existed, and a larger ``size`` starts with the smaller set's images. With
    ``all_forms`` each image keeps every form of its caption (:func:`world.caption_forms`;
    ``caption_ids`` is then one row of eight per image, ``shapes`` its shape count), so
    training draws a form per step by the chances it is given.
    """
    import torch
    from diffusers import AutoencoderKL
    from transformers import CLIPTextModel, CLIPTokenizer

    if size % 500:
        raise ValueError(f"the latent set is encoded in chunks of 500; got {size}")
    path = latent_cache(checkpoints, two_shape_share, size, all_forms)
    cached = common.load_checkpoint(path)
    if cached is not None:
        return cached
    clip_dir = checkpoints / "export" / "clip"
    vae = AutoencoderKL.from_pretrained(checkpoints / "export" / "vae").eval()
    text_encoder = CLIPTextModel.from_pretrained(clip_dir).eval()
    tok = CLIPTokenizer.from_pretrained(clip_dir)
    rng = random.Random(UNET_SEED)
    latents = []
    captions: list[list[str]] = []
    shapes: list[int] = []
    for _ in range(size // 500):
        if all_forms:
            scenes = world.sample_batch(rng, 500, two_shape_share)
            images = common.images_to_tensor([world.render(s) for s in scenes])
            forms = [[c for c, _ in world.caption_forms(s)] for s in scenes]
            captions += [f + [f[0]] * (8 - len(f)) for f in forms]  # padded; never drawn
            shapes += [len(s.shapes) for s in scenes]
        else:
            images, caps = common.world_batch(rng, 500, two_shape_share)
            captions += [[c] for c in caps]
        with torch.no_grad():
            latents.append(vae.encode(images).latent_dist.mean * vae.config.scaling_factor)
    unique = sorted({c for row in captions for c in row})
    index = {c: i for i, c in enumerate(unique)}
    ids = torch.tensor([[index[c] for c in row] for row in captions])
    data = {
        "latents": torch.cat(latents),
        "caption_ids": ids if all_forms else ids[:, 0],
        "embeddings": encode_prompts(text_encoder, tok, unique),
        "empty": encode_prompts(text_encoder, tok, [""]),
    }
    if all_forms:
        data["shapes"] = torch.tensor(shapes)
    common.save_checkpoint(path, data)
    print(f"[unet] encoded {len(captions)} images, {len(unique)} distinct captions", flush=True)
    return data


def _ema_update(ema: Any, model: Any, decay: float) -> None:
    import torch

    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters(), strict=True):
            e.mul_(decay).add_(p.detach(), alpha=1 - decay)


def train_unet(
    checkpoints: Path,
    steps: int = 4000,
    batch_size: int = 32,
    resume: bool = True,
    checkpoint_every: int = 100,
    lr: float = 1e-3,
    init_from: Path | None = None,
    warmup: int = 200,
    two_shape_share: float = TWO_SHAPE_SHARE,
    dataset_size: int = DATASET_SIZE,
    short_share: float | None = None,
    folder: str = "unet",
) -> Path:
    """Train (or resume) the UNet; the EMA weights go to ``checkpoints/export/unet``.

    ``init_from`` (a ``UNet2DConditionModel`` folder, for example the shipped
    ``weights/mini-sd/unet``) warm-starts a run that has no checkpoint yet: model and
    average start from those weights, the optimizer and schedule from step 0.
    ``two_shape_share`` and ``dataset_size`` shape the latent set (see
    :func:`build_latent_dataset`). With ``short_share`` each image keeps every form of its
    caption and a step draws one per image, the size words and the background clause
    each left out with that chance (:func:`world.caption_forms`). ``folder``: where under
    ``checkpoints`` this run keeps its checkpoint (a recipe's phases keep one each; the
    latent sets stay under ``unet/``).
    """
    import torch
    from diffusers import DDPMScheduler

    all_forms = short_share is not None
    data = build_latent_dataset(checkpoints, two_shape_share, dataset_size, all_forms)
    chances = form_chances(short_share) if short_share is not None else {}
    if all_forms:  # one row of chances per image, by its shape count
        rows = torch.zeros(data["caption_ids"].shape)
        for count, p in chances.items():
            rows[data["shapes"] == count, : len(p)] = p
    torch.manual_seed(UNET_SEED)
    unet = unet_model(int(data["embeddings"].shape[-1]))
    ema = copy.deepcopy(unet).requires_grad_(False)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=lr, weight_decay=0.01)
    ckpt_path = checkpoints / folder / "ckpt.pt"
    start = 0
    state = common.load_checkpoint(ckpt_path) if resume else None
    if state is not None:
        unet.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        print(f"[unet] resumed at step {start}", flush=True)
    elif init_from is not None:
        from diffusers import UNet2DConditionModel

        unet.load_state_dict(UNet2DConditionModel.from_pretrained(init_from).state_dict())
        ema.load_state_dict(unet.state_dict())
        print(f"[unet] warm start from {init_from}", flush=True)
    scheduler = DDPMScheduler(**noise_scheduler_config())
    alphas = scheduler.alphas_cumprod
    snr = alphas / (1 - alphas)
    n = data["latents"].shape[0]
    progress = common.Progress("unet", steps)
    unet.train()
    for step in range(start, steps):
        gen = torch.Generator().manual_seed(UNET_SEED * 1_000_003 + step)
        idx = torch.randint(0, n, (batch_size,), generator=gen)
        latents = data["latents"][idx]
        if all_forms:
            form = torch.multinomial(rows[idx], 1, generator=gen)[:, 0]
            cond = data["embeddings"][data["caption_ids"][idx, form]]
        else:
            cond = data["embeddings"][data["caption_ids"][idx]]
        drop = torch.rand(batch_size, generator=gen) < CAPTION_DROPOUT
        cond = torch.where(drop[:, None, None], data["empty"].expand_as(cond), cond)
        noise = torch.randn(latents.shape, generator=gen)
        t = torch.randint(0, TRAIN_TIMESTEPS, (batch_size,), generator=gen)
        noisy = scheduler.add_noise(latents, noise, t)
        for group in optimizer.param_groups:
            group["lr"] = common.cosine_lr(step, steps, lr, warmup)
        pred = unet(noisy, t, encoder_hidden_states=cond).sample
        weight = torch.clamp(snr[t], max=5.0) / snr[t]
        loss = (weight * ((pred - noise) ** 2).mean(dim=(1, 2, 3))).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        optimizer.step()
        # Short warm-up of the average: early weights are noise and should not linger.
        _ema_update(ema, unet, 0.998 if init_from else min(0.998, (1 + step) / (10 + step)))
        progress.update(step, float(loss.detach()))
        if (step + 1) % checkpoint_every == 0 or step + 1 == steps:
            common.save_checkpoint(
                ckpt_path,
                {
                    "model": unet.state_dict(),
                    "ema": ema.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step + 1,
                },
            )
    return export_unet(checkpoints, folder)


def train_unet_recipe(
    checkpoints: Path, resume: bool = True, recipe: tuple[UnetPhase, ...] = UNET_RECIPE
) -> Path:
    """Run ``recipe``'s phases in order (phase ``i`` keeps its checkpoint in ``unet`` for
    the first, ``unet-<i+1>`` after), each warm-started from the one before; resumable at
    any step of any phase. The last phase's EMA weights end in ``checkpoints/export/unet``.
    """
    out, init = checkpoints / "export" / "unet", None
    for i, phase in enumerate(recipe):
        folder = "unet" if i == 0 else f"unet-{i + 1}"
        print(f"[unet] phase {i + 1} of {len(recipe)}: {phase}", flush=True)
        out = train_unet(
            checkpoints, steps=phase.steps, resume=resume, lr=phase.lr, init_from=init,
            warmup=phase.warmup, two_shape_share=phase.two_shape_share,
            dataset_size=phase.dataset_size, short_share=phase.short_share, folder=folder,
        )  # fmt: skip
        # The next phase starts from this one's average, kept apart from ``export/unet``
        # (which the next phase overwrites).
        init = checkpoints / folder / "export"
        shutil.copytree(out, init, dirs_exist_ok=True)
    return out


def export_unet(checkpoints: Path, folder: str = "unet") -> Path:
    """Write the EMA weights of ``folder``'s latest checkpoint to ``checkpoints/export/unet``."""
    import json

    state = common.load_checkpoint(checkpoints / folder / "ckpt.pt")
    if state is None:
        raise FileNotFoundError(f"no UNet checkpoint under {checkpoints / folder}")
    clip_config = json.loads((checkpoints / "export" / "clip" / "config.json").read_text())
    unet = unet_model(int(clip_config["text_config"]["hidden_size"]))
    unet.load_state_dict(state["ema"])
    out = checkpoints / "export" / "unet"
    unet.save_pretrained(out, safe_serialization=True)
    (out / "train_step.txt").write_text(f"{state['step']}\n", encoding="utf-8")
    print(f"[unet] exported EMA weights of step {state['step']}", flush=True)
    return out
