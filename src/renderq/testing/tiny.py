"""Tiny, seeded diffusers and CLIP checkpoints built from configs, for tests and benches.

They follow diffusers' own ``get_dummy_components``: a two-block UNet, a two-block VAE
and a three-layer CLIP text encoder, all a few hundred kilobytes, written with
``save_pretrained`` so that they load through the same ``from_pretrained`` path as any
real checkpoint. The tokenizer has a character-level vocabulary (no merges), so every
prompt tokenizes without a hub download. The weights are random but seeded: the same
call gives the same checkpoint bit for bit.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

_BOS = "<|startoftext|>"
_EOS = "<|endoftext|>"


def char_vocab() -> dict[str, int]:
    """A character-level CLIP vocabulary: letters, digits, punctuation and their word ends."""
    chars = string.ascii_lowercase + string.digits + ".,-'!?"
    tokens = [_BOS, _EOS, *chars, *(c + "</w>" for c in chars)]
    return {tok: i for i, tok in enumerate(tokens)}


def char_tokenizer() -> Any:
    """A ``CLIPTokenizer`` over :func:`char_vocab` with no merges (77 positions)."""
    from transformers import CLIPTokenizer

    return CLIPTokenizer(
        vocab=char_vocab(),
        merges=[],
        model_max_length=77,
        bos_token=_BOS,
        eos_token=_EOS,
        unk_token=_EOS,
        pad_token=_EOS,
    )


def _text_config(vocab_size: int) -> Any:
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        hidden_size=32,
        intermediate_size=64,
        layer_norm_eps=1e-05,
        num_attention_heads=4,
        num_hidden_layers=3,
        vocab_size=vocab_size,
        max_position_embeddings=77,
        projection_dim=16,
    )


def build_tiny_pipeline(folder: Path, *, seed: int = 0, sample_size: int = 32) -> Path:
    """Save a tiny random ``StableDiffusionPipeline`` (64x64 images by default) to ``folder``."""
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextModel

    tokenizer = char_tokenizer()
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=sample_size,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        norm_num_groups=4,
    )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKL(
        block_out_channels=[8, 16],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
        latent_channels=4,
        norm_num_groups=4,
    )
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(_text_config(len(tokenizer)))
    pipe = StableDiffusionPipeline(
        unet=unet,
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        safety_checker=None,
        feature_extractor=None,
        image_encoder=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(str(folder))
    return folder


def build_tiny_clip(folder: Path, *, seed: int = 0, image_size: int = 32) -> Path:
    """Save a tiny random ``CLIPModel`` with its ``CLIPProcessor`` to ``folder``."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    tokenizer = char_tokenizer()
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "image_size": image_size,
        "patch_size": 8,
        "projection_dim": 16,
    }
    config = CLIPConfig(
        text_config=_text_config(len(tokenizer)).to_dict(),
        vision_config=vision,
        projection_dim=16,
    )
    torch.manual_seed(seed)
    model = CLIPModel(config)
    processor = CLIPProcessor(
        image_processor=CLIPImageProcessor(
            size={"shortest_edge": image_size},
            crop_size={"height": image_size, "width": image_size},
        ),
        tokenizer=tokenizer,
    )
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    return folder
