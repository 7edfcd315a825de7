"""Assemble mini-SD from its trained parts and save the shipped folders.

``weights/clip`` is the tiny CLIP scorer (model, tokenizer, processor), from the gate phase.
``weights/mini-sd`` is a ``StableDiffusionPipeline`` folder (model_index.json, unet/, vae/,
text_encoder/, tokenizer/, scheduler/) whose text encoder is the joint phase's CLIP text
tower, frozen: the one its UNet was trained against.
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
    """Copy the gate-phase CLIP to ``out/clip``; save the pipeline to ``out/mini-sd``.

    The pipeline's text encoder comes from the joint-phase export (``export/clip``).
    """
    from diffusers import AutoencoderKL, UNet2DConditionModel

    export = checkpoints / "export"
    vae = AutoencoderKL.from_pretrained(export / "vae")
    unet = UNet2DConditionModel.from_pretrained(export / "unet")
    pipeline = assemble_pipeline(export / "clip", vae, unet)
    clip_dir = out / "clip"
    if clip_dir.exists():
        shutil.rmtree(clip_dir)
    shutil.copytree(export / "clip-gate", clip_dir)
    save_pipeline(pipeline, out / "mini-sd", clip_dir)
    return out


def weight_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every ``.safetensors`` file under ``folder``, keyed by its relative path."""
    import hashlib

    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*.safetensors"))
    }


def unpack_shipped(weights: Path, checkpoints: Path) -> Path:
    """Restore ``export/clip`` and ``export/vae`` from shipped weights, to continue training.

    Later stages read the joint CLIP's text tower and the VAE from ``checkpoints/export``;
    on a machine without the original checkpoints this rebuilds them from ``weights``:
    the VAE as shipped, and a CLIP folder whose text tower is mini-SD's text encoder (the
    tower its UNet was trained against, which the shipped scorer may have moved on from).
    """
    from diffusers import AutoencoderKL
    from transformers import CLIPModel, CLIPTextModel

    export = checkpoints / "export"
    export.mkdir(parents=True, exist_ok=True)
    AutoencoderKL.from_pretrained(weights / "mini-sd" / "vae").save_pretrained(
        export / "vae", safe_serialization=True
    )
    clip = CLIPModel.from_pretrained(weights / "clip")
    text = CLIPTextModel.from_pretrained(weights / "mini-sd" / "text_encoder")
    clip.text_model.load_state_dict(getattr(text, "text_model", text).state_dict())
    clip_dir = export / "clip"
    if clip_dir.exists():
        shutil.rmtree(clip_dir)
    shutil.copytree(weights / "clip", clip_dir)
    clip.save_pretrained(clip_dir, safe_serialization=True)
    return export
