"""Train the tiny ``AutoencoderKL``: 64x64x3 world images to 16x16x4 latents and back.

Loss is reconstruction MSE plus a very small KL term, so latents stay close to a fixed
code but smooth enough for diffusion. After training, the latent scaling factor is
measured (one over the standard deviation of the latent means) and stored in the config,
as for Stable Diffusion's VAE.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from renderq.models.shapes import common, oracle, world

VAE_SEED = 2
"""Seed of the VAE data stream and initial weights."""

KL_WEIGHT = 1e-6
"""Weight of the summed KL term against the per-pixel reconstruction MSE."""


def vae_model() -> Any:
    """A fresh tiny ``AutoencoderKL`` (three encoder/decoder blocks, 4 latent channels)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 64),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=world.IMAGE_SIZE,
        mid_block_add_attention=False,
    )


def train_vae(
    checkpoints: Path,
    steps: int = 1000,
    batch_size: int = 16,
    resume: bool = True,
    checkpoint_every: int = 100,
) -> Path:
    """Train (or resume) the VAE; save it with ``save_pretrained`` under ``checkpoints/vae``."""
    import torch

    torch.manual_seed(VAE_SEED)
    vae = vae_model()
    optimizer = torch.optim.AdamW(vae.parameters(), lr=1e-3, weight_decay=0.0)
    ckpt_path = checkpoints / "vae" / "ckpt.pt"
    start = 0
    state = common.load_checkpoint(ckpt_path) if resume else None
    if state is not None:
        vae.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        print(f"[vae] resumed at step {start}", flush=True)
    progress = common.Progress("vae", steps)
    vae.train()
    for step in range(start, steps):
        images, _ = common.world_batch(common.step_rng(VAE_SEED, step), batch_size)
        for group in optimizer.param_groups:
            group["lr"] = common.cosine_lr(step, steps, 1e-3, 50)
        posterior = vae.encode(images).latent_dist
        recon = vae.decode(posterior.sample(generator=None)).sample
        rec_loss = torch.nn.functional.mse_loss(recon, images)
        loss = rec_loss + KL_WEIGHT * posterior.kl().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        optimizer.step()
        progress.update(step, float(rec_loss.detach()))
        if (step + 1) % checkpoint_every == 0 or step + 1 == steps:
            common.save_checkpoint(
                ckpt_path,
                {"model": vae.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1},
            )
    vae.eval()
    scale = measure_scaling_factor(vae)
    vae.register_to_config(scaling_factor=scale)
    out = checkpoints / "export" / "vae"
    vae.save_pretrained(out, safe_serialization=True)
    rate = reconstruction_oracle_rate(vae)
    print(
        f"[vae] scaling_factor {scale:.4f}; oracle on 500 reconstructions: subject "
        f"{rate['subject']:.1%}, strict {rate['strict']:.1%}",
        flush=True,
    )
    return out


def measure_scaling_factor(vae: Any, n: int = 1024, seed: int = 20_000) -> float:
    """One over the standard deviation of latent means of ``n`` fresh world images."""
    import torch

    images, _ = common.world_batch(random.Random(seed), n)
    with torch.no_grad():
        means = torch.cat([vae.encode(chunk).latent_dist.mean for chunk in images.split(128)])
    return float(1.0 / means.std())


def reconstruction_oracle_rate(vae: Any, n: int = 500, seed: int = 30_000) -> dict[str, float]:
    """How well the oracle reads ``n`` fresh world images after a VAE round trip.

    The scenes are known, so this measures the oracle on soft images with a ground truth:
    ``subject`` (the first shape's colour and kind found) and ``strict`` (exactly right).
    """
    import torch

    rng = random.Random(seed)
    scenes = world.sample_batch(rng, n)
    images = common.images_to_tensor([world.render(s) for s in scenes])
    with torch.no_grad():
        recon = torch.cat(
            [vae.decode(vae.encode(c).latent_dist.mean).sample for c in images.split(100)]
        )
    decoded = common.tensor_to_images(recon)
    verdicts = [oracle.check(img, s.caption()) for img, s in zip(decoded, scenes, strict=True)]
    return {
        "subject": sum(v.subject_ok for v in verdicts) / n,
        "strict": sum(v.all_ok for v in verdicts) / n,
    }
