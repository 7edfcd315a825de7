"""The shipped tiny CLIP and mini-SD: loading, determinism, batch invariance, a smoke run."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from renderq.models import shapes
from renderq.models.shapes import oracle, world

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

pytestmark = [
    pytest.mark.skipif(
        not shapes.default_pipeline_path().is_dir(), reason="shipped weights not built"
    ),
    # Loading without the optional accelerate package only prints advice.
    pytest.mark.filterwarnings("ignore:.*accelerate.*"),
]

PROMPTS = [
    "a small red circle on a blue background",
    "a large green square on a white background",
    "a small yellow triangle and a large purple circle on a black background",
]


@pytest.fixture(scope="module")
def pipe() -> Any:
    torch.set_num_threads(2)
    pipeline = shapes.load_default_pipeline()
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _render(pipe: Any, prompts: list[str], seeds: list[int], steps: int = 4) -> np.ndarray:
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    out = pipe(
        prompts,
        generator=generators,
        num_inference_steps=steps,
        guidance_scale=shapes.DEFAULT_GUIDANCE,
        output_type="np",
    )
    return np.asarray(out.images)


def test_loads_through_from_pretrained(pipe: Any) -> None:
    from diffusers import AutoencoderKL, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    assert type(pipe) is StableDiffusionPipeline
    assert isinstance(pipe.unet, UNet2DConditionModel)
    assert isinstance(pipe.vae, AutoencoderKL)
    assert isinstance(pipe.text_encoder, CLIPTextModel)
    assert isinstance(pipe.tokenizer, CLIPTokenizer)
    assert pipe.safety_checker is None
    assert pipe.unet.config.cross_attention_dim == pipe.text_encoder.config.hidden_size


def test_weights_are_safetensors_and_small() -> None:
    root = shapes.default_pipeline_path().parent
    files = [p for p in root.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in {".bin", ".pt", ".ckpt", ".pth"}]
    assert sum(p.stat().st_size for p in files) <= 20 * 1024 * 1024


def test_clip_loads_and_prefers_true_captions() -> None:
    model, processor = shapes.load_default_clip()
    rng = random.Random(99)
    scenes = [world.random_scene(rng, two_shape_prob=0.0) for _ in range(16)]
    from PIL import Image

    pixels = processor(
        images=[Image.fromarray(world.render(s)) for s in scenes], return_tensors="pt"
    )["pixel_values"]
    wrong = []
    for s in scenes:
        other = next(c for c in world.COLOURS if c not in (s.background, s.shapes[0].colour))
        wrong.append(s.caption().replace(f" {s.shapes[0].colour} ", f" {other} ", 1))
    texts = processor(
        text=[s.caption() for s in scenes] + wrong, padding="max_length", return_tensors="pt"
    )
    with torch.no_grad():
        out = model(pixel_values=pixels, **texts)
    logits = out.logits_per_image
    true_scores = logits[range(16), range(16)]
    wrong_scores = logits[range(16), range(16, 32)]
    assert int((true_scores > wrong_scores).sum()) >= 15


def test_same_prompt_and_seed_give_same_image(pipe: Any) -> None:
    first = _render(pipe, PROMPTS[:1], [5])
    again = _render(pipe, PROMPTS[:1], [5])
    other = _render(pipe, PROMPTS[:1], [6])
    assert np.array_equal(first, again)
    assert np.abs(first - other).max() > 0.1


def test_batch_gives_each_prompt_its_own_image(pipe: Any) -> None:
    seeds = [11, 12, 13]
    batch = _render(pipe, PROMPTS, seeds)
    for i, (prompt, seed) in enumerate(zip(PROMPTS, seeds, strict=True)):
        alone = _render(pipe, [prompt], [seed])[0]
        # float32 sums run in another order in a batch; the bound is an eighth of one
        # uint8 level (1/255), so the saved images are the same.
        assert np.abs(batch[i] - alone).max() <= 5e-4


@pytest.mark.slow
def test_smoke_default_steps_render_readable_images(pipe: Any) -> None:
    prompts = [
        "a large red circle on a white background",
        "a large blue square on a yellow background",
        "a large white triangle on a green background",
        "a large orange square on a black background",
    ]
    images = _render(pipe, prompts, [0, 1, 2, 3], steps=shapes.DEFAULT_STEPS)
    assert images.shape == (4, 64, 64, 3)
    hits = sum(
        oracle.matches(np.asarray((im * 255).round(), dtype=np.uint8), p)
        for im, p in zip(images, prompts, strict=True)
    )
    assert hits >= 2


def test_unpack_restores_the_text_tower_mini_sd_was_trained_against(tmp_path: Any) -> None:
    import torch
    from transformers import CLIPModel, CLIPTextModel

    from renderq.models.shapes.build import unpack_shipped

    export = unpack_shipped(shapes.default_pipeline_path().parent, tmp_path)
    clip = CLIPModel.from_pretrained(export / "clip")
    text = CLIPTextModel.from_pretrained(shapes.default_pipeline_path() / "text_encoder")
    ours = clip.text_model.state_dict()
    theirs = getattr(text, "text_model", text).state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert (export / "vae" / "config.json").exists()


def test_training_renders_extend_their_cache_to_what_one_call_would_give(tmp_path: Any) -> None:
    from renderq.models.shapes.clip_gate import render_training_set

    path = shapes.default_pipeline_path()
    grown = tmp_path / "grown.pt"
    first = render_training_set(path, 2, grown, batch=2)
    assert first["rendered"] == 2
    extended = render_training_set(path, 3, grown, batch=2)
    at_once = render_training_set(path, 3, tmp_path / "once.pt", batch=3)
    assert extended["rendered"] == at_once["rendered"] == 3
    for key in ("prompts", "captions", "matched"):
        assert extended[key] == at_once[key]
        assert extended[key][: len(first[key])] == first[key]
    assert np.abs(extended["images"].astype(int) - at_once["images"].astype(int)).max() <= 1
    # A cache that already holds enough renders is returned as it is.
    assert render_training_set(path, 2, grown)["rendered"] == 3


def test_training_renders_are_labelled_by_the_current_oracle(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from renderq.models.shapes.clip_gate import render_training_set

    cache = tmp_path / "renders.pt"
    render_training_set(shapes.default_pipeline_path(), 2, cache, batch=2)
    # The cached images are read again: an oracle that sees only triangles now says so.
    monkeypatch.setattr(oracle, "classify_component", lambda _points: "triangle")
    again = render_training_set(shapes.default_pipeline_path(), 2, cache)
    assert all(
        "triangle" in c and "circle" not in c and "square" not in c for c in again["captions"]
    )
    wanted = []
    for image, prompt in zip(again["images"], again["prompts"], strict=True):
        # Matched means the whole prompt: a prompt naming a circle or a square fails now.
        named = world.parse_caption(prompt).shapes
        wanted.append(all(k == "triangle" for k, _, _ in named) and oracle.matches(image, prompt))
    assert again["matched"] == wanted


def test_oracle_reads_soft_vae_reconstructions_of_known_scenes() -> None:
    from diffusers import AutoencoderKL

    from renderq.models.shapes.vae_train import reconstruction_oracle_rate

    vae = AutoencoderKL.from_pretrained(shapes.default_pipeline_path() / "vae").eval()
    with torch.no_grad():
        read = reconstruction_oracle_rate(vae, n=200)
    # Thresholds set for soft images: the crisp-only rule read 94.5% / 91.0% of these.
    assert read["subject"] >= 0.97 and read["strict"] >= 0.95
