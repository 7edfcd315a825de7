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


def _unet(seed: int, sample_size: int, **config: Any) -> Any:
    """diffusers' two-block test UNet (one cross-attention block), seeded."""
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(seed)
    return UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=sample_size,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
        **config,
    )


def _vae(seed: int, **config: Any) -> Any:
    """diffusers' two-block test VAE (4 latent channels, 2x down), seeded."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(
        block_out_channels=[8, 16],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
        latent_channels=4,
        norm_num_groups=4,
        **config,
    )


def build_tiny_pipeline(folder: Path, *, seed: int = 0, sample_size: int = 32) -> Path:
    """Save a tiny random ``StableDiffusionPipeline`` (64x64 images by default) to ``folder``."""
    import torch
    from diffusers import (
        DDIMScheduler,
        StableDiffusionPipeline,
    )
    from transformers import CLIPTextModel

    tokenizer = char_tokenizer()
    unet = _unet(seed, sample_size, cross_attention_dim=32)
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    vae = _vae(seed + 1)
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


def char_t5_tokenizer() -> Any:
    """A ``T5Tokenizer`` over single characters (a unigram vocabulary, no download)."""
    from transformers import T5Tokenizer

    chars = string.ascii_lowercase + string.digits + ".,-'!?"
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -1.0)]
    vocab += [(c, -2.0) for c in chars] + [("\u2581" + c, -1.5) for c in chars]
    return T5Tokenizer(vocab=vocab, extra_ids=0)


def _tiny_t5(vocab_size: int, seed: int) -> Any:
    import torch
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=vocab_size,
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return T5EncoderModel(config)


def _flow_vae(latent_channels: int, seed: int) -> Any:
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(4,),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )


def build_tiny_sdxl(folder: Path, *, seed: int = 0) -> Path:
    """Save a tiny random ``StableDiffusionXLPipeline`` (two CLIP towers, 64x64 by default)."""
    import torch
    from diffusers import (
        EulerDiscreteScheduler,
        StableDiffusionXLPipeline,
    )
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    tokenizer = char_tokenizer()
    unet = _unet(
        seed,
        32,
        cross_attention_dim=64,  # both CLIP towers' hidden states side by side
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 1),
        projection_class_embeddings_input_dim=6 * 8 + 16,  # six time ids + pooled text
    )
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        steps_offset=1,
        beta_schedule="scaled_linear",
        timestep_spacing="leading",
    )
    vae = _vae(seed + 1, sample_size=64)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(_text_config(len(tokenizer)))
    torch.manual_seed(seed + 3)
    text_encoder_2 = CLIPTextModelWithProjection(_text_config(len(tokenizer)))
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=char_tokenizer(),
        unet=unet,
        scheduler=scheduler,
        force_zeros_for_empty_prompt=True,
    )
    pipe.save_pretrained(str(folder))
    return folder


def build_tiny_sd3(folder: Path, *, seed: int = 0) -> Path:
    """Save a tiny random ``StableDiffusion3Pipeline`` (two CLIP towers and a T5, 32x32)."""
    import torch
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextModelWithProjection

    tokenizer = char_tokenizer()
    t5_tokenizer = char_t5_tokenizer()
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=32,
        patch_size=2,
        in_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        out_channels=4,
    )
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModelWithProjection(_text_config(len(tokenizer)))
    torch.manual_seed(seed + 3)
    text_encoder_2 = CLIPTextModelWithProjection(_text_config(len(tokenizer)))
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_flow_vae(4, seed + 1),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=char_tokenizer(),
        text_encoder_3=_tiny_t5(len(t5_tokenizer), seed + 4),
        tokenizer_3=t5_tokenizer,
    )
    pipe.save_pretrained(str(folder))
    return folder


def build_tiny_flux(folder: Path, *, seed: int = 0) -> Path:
    """Save a tiny random ``FluxPipeline`` (a CLIP tower and a T5, 32x32, guidance-distilled)."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    tokenizer = char_tokenizer()
    t5_tokenizer = char_t5_tokenizer()
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
        guidance_embeds=True,
    )
    torch.manual_seed(seed + 2)
    config = _text_config(len(tokenizer))
    config.projection_dim = 32
    text_encoder = CLIPTextModel(config)
    pipe = FluxPipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_flow_vae(1, seed + 1),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=_tiny_t5(len(t5_tokenizer), seed + 4),
        tokenizer_2=t5_tokenizer,
    )
    pipe.save_pretrained(str(folder))
    return folder


def build_tiny_lora(folder: Path, pipeline: Path, *, seed: int = 0, rank: int = 4) -> Path:
    """A seeded random LoRA adapter for the UNet of the tiny pipeline at ``pipeline``.

    Saved with ``save_lora_weights``, so it loads through ``load_lora_weights`` like any
    published adapter (peft must be installed).
    """
    import torch
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    unet = UNet2DConditionModel.from_pretrained(pipeline / "unet")
    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank,
        lora_alpha=rank,
        target_modules=["to_q", "to_k", "to_v", "to_out.0"],
        init_lora_weights=False,  # random, so the adapter changes the image
    )
    unet.add_adapter(config)
    StableDiffusionPipeline.save_lora_weights(
        folder, unet_lora_layers=get_peft_model_state_dict(unet)
    )
    return folder
