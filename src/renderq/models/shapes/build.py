"""Assemble mini-SD from its trained parts and save the shipped folders.

``weights/clip`` is the tiny CLIP (model, tokenizer, processor). ``weights/mini-sd`` is a
``StableDiffusionPipeline`` folder (model_index.json, unet/, vae/, text_encoder/,
tokenizer/, scheduler/) whose text encoder is the CLIP text tower, frozen.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from renderq.models.shapes import unet_train

DEFAULT_STEPS = 20
"""Denoising steps of the ``mini-sd`` defaults (DPM-Solver++ multistep)."""

DEFAULT_GUIDANCE = 4.0
"""Classifier-free guidance scale of the ``mini-sd`` defaults."""


def inference_scheduler() -> Any:
    """The shipped scheduler: deterministic DDIM (eta 0) on the training noise schedule.

    Settings follow SD 1.x's DDIM config (no sample clipping, ``steps_offset=1``, which the
    pipeline otherwise warns about) except "trailing" spacing, so sampling starts from the
    fully noised step. DDIM rather than DPM-Solver: the latter's ``set_timesteps`` raises a
    numpy 2 deprecation warning on every call in the diffusers release this is built with.
    """
    from diffusers import DDIMScheduler

    return DDIMScheduler(
        **unet_train.noise_scheduler_config(),
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        timestep_spacing="trailing",
    )


def text_encoder_from_clip(clip_dir: Path) -> Any:
    """A ``CLIPTextModel`` holding the text tower of the CLIP saved in ``clip_dir``."""
    from transformers import CLIPModel, CLIPTextModel

    clip = CLIPModel.from_pretrained(clip_dir)
    text_encoder = CLIPTextModel(clip.config.text_config)
    # transformers 5 flattened CLIPTextModel; 4.x keeps the tower under ``text_model``.
    target = getattr(text_encoder, "text_model", text_encoder)
    target.load_state_dict(clip.text_model.state_dict())
    return text_encoder.eval()


def assemble_pipeline(clip_dir: Path, vae: Any, unet: Any) -> Any:
    """A ``StableDiffusionPipeline`` from a CLIP folder and VAE/UNet models (no safety checker)."""
    from diffusers import StableDiffusionPipeline
    from transformers import CLIPTokenizer

    return StableDiffusionPipeline(
        vae=vae.eval(),
        text_encoder=text_encoder_from_clip(clip_dir),
        tokenizer=CLIPTokenizer.from_pretrained(clip_dir),
        unet=unet.eval(),
        scheduler=inference_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def save_pipeline(pipeline: Any, out_dir: Path, clip_dir: Path) -> Path:
    """``save_pretrained`` the pipeline as safetensors, plus slow-tokenizer files."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    pipeline.save_pretrained(out_dir, safe_serialization=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(clip_dir / name, out_dir / "tokenizer" / name)
    return out_dir


def build_all(checkpoints: Path, out: Path) -> Path:
    """Copy the CLIP export to ``out/clip`` and save the assembled pipeline to ``out/mini-sd``."""
    from diffusers import AutoencoderKL, UNet2DConditionModel

    export = checkpoints / "export"
    clip_dir = out / "clip"
    if clip_dir.exists():
        shutil.rmtree(clip_dir)
    shutil.copytree(export / "clip", clip_dir)
    vae = AutoencoderKL.from_pretrained(export / "vae")
    unet = UNet2DConditionModel.from_pretrained(export / "unet")
    save_pipeline(assemble_pipeline(clip_dir, vae, unet), out / "mini-sd", clip_dir)
    return out
