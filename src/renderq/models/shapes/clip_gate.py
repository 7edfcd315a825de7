"""The gate phase of the tiny CLIP: both towers trained with hard negatives, then on renders.

The joint phase (``clip_train``) gives mini-SD its text encoder and stays frozen for it. The
scorer that gates mini-SD's images needs more than that phase teaches: it must tell
"circle" from "square" (a contrastive batch rarely holds two captions that differ only
there), and it must judge *generated* images, which are softer than the world's and fail in
their own ways (a small square drawn as a blob). So this phase continues from the joint CLIP
with both towers trainable, in two parts:

1. world images only, every one facing hard negatives: its caption with the first shape's
   kind swapped (twice) and its colour swapped (twice), the parts the QA check
   (``oracle.matches``) looks at;
2. then half of each batch is images rendered by mini-SD from random grammar prompts
   (rendered once and cached), each captioned with what the pixel oracle reads in it. When
   the oracle says a render does not show its prompt's subject, that prompt is one of its
   negatives, so the scorer learns what a failed render looks like. Prompts and image
   seeds are drawn apart from ``evaluate``'s (texts recur in so small a grammar; the
   images do not). (Mixing renders in from the
   start taught shape more slowly than world images alone.)

The result is exported as the shipped scorer (``weights/clip``); mini-SD keeps the joint
phase's text tower, so its UNet still sees the encoder it was trained against.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from renderq.models.shapes import common, oracle, tokenizer, world
from renderq.models.shapes.clip_train import (
    CLIP_SEED,
    clip_config,
    export_clip,
    hard_negative_loss,
)

GATE_SEED = CLIP_SEED + 200
"""Seed of this phase's data stream."""

GATE_STEPS = 1500
"""Steps of the gate phase's first part: world images only, every one with hard negatives."""

RENDER_STEPS = 1200
"""Steps of its second part, where part of each batch is cached mini-SD renders."""

RENDER_PROMPT_SEED = 80_000
"""Seed of the prompts rendered for training (the evaluation uses 50,000-70,000)."""

RENDER_SEED_BASE = 10_000_000
"""Generator seeds of the training renders: far from the evaluation's ``1000 * i + k``."""

NEGATIVES = 6
"""Hard negatives per image."""

GATE_SCALE = 50.0
"""Sharpness of :func:`gate_loss`: a bad pair scoring 0.02 above a good one costs softplus(1)."""

SMALL_MAX_HALF_EXTENT = oracle.SMALL_MAX_HALF_EXTENT
"""Half-extents above this read as "large" (the world draws small 7-9, large 13-16)."""

CaptionForm = tuple[tuple[bool, ...], bool]
"""Which optional parts a caption states: a size flag per shape, and the background clause."""


def form_of(caption: str) -> CaptionForm:
    """The :data:`CaptionForm` of a grammar caption."""
    parsed = world.parse_caption(caption)
    return tuple(s is not None for _, _, s in parsed.shapes), parsed.background is not None


def full_form(scene: world.Scene) -> CaptionForm:
    """The full form for ``scene``: every size word and the background clause."""
    return (True,) * len(scene.shapes), True


def random_form(scene: world.Scene, rng: random.Random) -> CaptionForm:
    """A random form, drawn as :func:`world.training_caption` draws it."""
    return form_of(world.training_caption(scene, rng))


def scene_from_reading(reading: oracle.Reading, subject: tuple[str, str] | None) -> world.Scene:
    """A scene describing what the oracle read: up to two shapes, ``subject`` first if seen.

    Positions are the detections' box centres; the size word comes from the box extent.
    """
    detections = list(reading.shapes)
    if subject is not None:
        detections.sort(key=lambda d: (d.colour, d.kind) != subject)
    shapes = []
    for d in detections[:2]:
        x0, y0, x1, y1 = d.bbox
        size = oracle.size_word(d)
        shapes.append(world.Shape(d.kind, d.colour, size, (x0 + x1) // 2, (y0 + y1) // 2, 0))
    return world.Scene(reading.background, tuple(shapes))


def _stated(caption: str) -> tuple[tuple[tuple[str, str, str], ...], str]:
    """What a caption asks for, in an order-free form (two captions alike here are alike)."""
    parsed = world.parse_caption(caption)
    named = tuple(sorted((k, c, s or "") for k, c, s in parsed.shapes))
    return named, parsed.background or ""


def _other_size(size: str) -> str:
    return "large" if size == "small" else "small"


def negatives_for(
    scene: world.Scene,
    rng: random.Random,
    extra: list[str],
    form: CaptionForm | None = None,
) -> list[str]:
    """``NEGATIVES`` captions the image of ``scene`` does *not* match, in caption form ``form``.

    ``extra`` comes first. Then, for two shapes, the swaps *between* them that keep every
    word of the caption but bind it to the wrong shape: their kinds exchanged (if they
    differ), their colours exchanged, their stated sizes exchanged (if they differ). The
    rest are drawn at random from single changes: a shape's kind, a shape's colour (to one
    the scene does not use), a stated size flipped, the stated background changed, and a
    shape the image lacks (for one shape: a second one named beside it; for two: one of
    them named twice in a second colour, so the caption asks for a shape that is absent).
    The form (default: full) says which sizes and whether the background are stated; a
    negative never changes a part the form leaves out, since that change would be no
    mismatch.
    """
    sizes, with_bg = form if form is not None else full_form(scene)
    shapes = list(scene.shapes)

    def caption(new: list[world.Shape], background: str = scene.background) -> str:
        flags = sizes if len(new) == len(sizes) else (*sizes, sizes[0])[: len(new)]
        return world.caption_for(background, new, sizes=tuple(flags), with_background=with_bg)

    used = {scene.background, *(s.colour for s in shapes)}
    free = [c for c in world.COLOURS if c not in used]
    binding: list[str] = []
    if len(shapes) == 2:
        a, b = shapes
        if a.kind != b.kind:
            binding.append(caption([replace(a, kind=b.kind), replace(b, kind=a.kind)]))
        binding.append(caption([replace(a, colour=b.colour), replace(b, colour=a.colour)]))
        if a.size != b.size and sizes[0] and sizes[1]:
            binding.append(caption([replace(a, size=b.size), replace(b, size=a.size)]))
    single: list[str] = []
    for i, shape in enumerate(shapes):
        for k in world.SHAPES:
            if k != shape.kind:
                single.append(caption([*shapes[:i], replace(shape, kind=k), *shapes[i + 1 :]]))
        for c in rng.sample(free, min(len(free), 3 - len(shapes) // 2)):
            single.append(caption([*shapes[:i], replace(shape, colour=c), *shapes[i + 1 :]]))
        if sizes[i]:
            flipped = replace(shape, size=_other_size(shape.size))
            single.append(caption([*shapes[:i], flipped, *shapes[i + 1 :]]))
    if with_bg:
        for c in rng.sample(free, min(len(free), 2)):
            single.append(caption(shapes, background=c))
    if free:
        phantom = replace(shapes[-1], colour=rng.choice(free), kind=rng.choice(world.SHAPES))
        if len(shapes) == 1:
            pair = [shapes[0], phantom] if rng.random() < 0.5 else [phantom, shapes[0]]
            single.append(caption(pair))
        else:
            keep = rng.randrange(2)
            twice = replace(shapes[keep], colour=rng.choice(free))
            single.append(caption([shapes[keep], twice]))
    rng.shuffle(single)
    truth = _stated(caption(shapes))
    out = list(extra)
    for negative in [*binding, *single]:
        if len(out) == NEGATIVES:
            break
        # A swap between two shapes alike in what the form states changes nothing.
        if negative not in out and _stated(negative) != truth:
            out.append(negative)
    while len(out) < NEGATIVES:  # a scene with too few free colours; repeat the last
        out.append(out[-1])
    return out


def label_renders(images: Any, prompts: list[str]) -> dict[str, Any]:
    """Caption each render with what the oracle reads in it; say whether it shows its prompt.

    ``matched`` is the QA check (:func:`oracle.matches`: the whole prompt is shown).
    """
    captions, matched = [], []
    for image, prompt in zip(images, prompts, strict=True):
        verdict = oracle.check(image, prompt)
        kind, colour, _ = world.parse_caption(prompt).shapes[0]
        captions.append(scene_from_reading(verdict.reading, (colour, kind)).caption())
        matched.append(verdict.whole_ok)
    return {"images": images, "prompts": prompts, "captions": captions, "matched": matched}


def render_cache(checkpoints: Path, index: int, share: float) -> Path:
    """Where the gate stage caches its ``index``-th set of renders (of two-shape ``share``).

    The first set keeps the one name a single set has always had (``renders.pt``).
    """
    name = "renders.pt" if index == 0 else f"renders-{share:g}.pt"
    return checkpoints / "clip-gate" / name


def merge_renders(sets: list[dict[str, Any]]) -> dict[str, Any]:
    """Several labelled render sets as one, in the order given (their images stacked)."""
    if len(sets) == 1:
        return sets[0]
    merged: dict[str, Any] = {"images": np.concatenate([np.asarray(s["images"]) for s in sets])}
    for key in ("prompts", "captions", "matched"):
        merged[key] = [v for s in sets for v in s[key]]
    merged["rendered"] = sum(int(s["rendered"]) for s in sets)
    return merged


def render_training_set(
    pipeline_dir: Path, n: int, cache: Path, batch: int = 16, two_shape_share: float = 0.3
) -> dict[str, Any]:
    """Render the first ``n`` training prompts with mini-SD; images, prompts, oracle captions.

    ``two_shape_share`` of the prompts name two shapes; a cache drawn with another share
    is refused rather than extended.

    Renders whose reading holds no shape are dropped (they have no caption to be positive
    for). The images are cached at ``cache``: a later call with the same ``n`` renders
    nothing, one with a larger ``n`` renders only the prompts the cache lacks (the prompt
    list and the seeds are fixed, so the result is the same as rendering all ``n`` at
    once). Captions and verdicts are read again on every call, so they always come from
    the current oracle.
    """
    import torch
    from diffusers import StableDiffusionPipeline

    from renderq.models.shapes.build import DEFAULT_GUIDANCE, DEFAULT_STEPS

    data = common.load_checkpoint(cache) or {"images": [], "prompts": [], "rendered": 0}
    cached_share = float(data.get("two_shape_share", 0.3))
    if data["prompts"] and cached_share != two_shape_share:
        raise ValueError(
            f"{cache} holds renders of prompts with two-shape share {cached_share}, not "
            f"{two_shape_share}: use another --checkpoints folder"
        )
    done = int(data.get("rendered", len(data["prompts"])))
    images, kept = list(data["images"]), list(data["prompts"])
    if done < n:
        pipe = StableDiffusionPipeline.from_pretrained(pipeline_dir)
        pipe.set_progress_bar_config(disable=True)
        rng = random.Random(RENDER_PROMPT_SEED)
        prompts = [world.random_caption(rng, two_shape_share, short_forms=True) for _ in range(n)]
        for i in range(done, n, batch):
            chunk = prompts[i : i + batch]
            seeds = range(RENDER_SEED_BASE + i, RENDER_SEED_BASE + i + len(chunk))
            gens = [torch.Generator().manual_seed(s) for s in seeds]
            out = pipe(
                chunk,
                generator=gens,
                num_inference_steps=DEFAULT_STEPS,
                guidance_scale=DEFAULT_GUIDANCE,
                output_type="np",
            ).images
            for prompt, array in zip(chunk, out, strict=True):
                image = np.asarray((array * 255).round().clip(0, 255), dtype=np.uint8)
                if oracle.read_image(image).shapes:
                    images.append(image)
                    kept.append(prompt)
            print(f"[clip-gate] rendered {min(n, i + batch)}/{n}", flush=True)
            if (i // batch) % 16 == 15:  # a partial cache: an interrupted run resumes here
                partial = {"images": list(images), "prompts": list(kept), "rendered": i + batch,
                           "two_shape_share": two_shape_share}  # fmt: skip
                common.save_checkpoint(cache, partial)
        data = {"images": np.stack(images), "prompts": kept, "rendered": n,
                "two_shape_share": two_shape_share}  # fmt: skip
        common.save_checkpoint(cache, data)
    labelled = label_renders(np.asarray(data["images"]), list(data["prompts"]))
    share = float(np.mean(labelled["matched"]))
    print(f"[clip-gate] {len(kept)} renders, oracle match {share:.1%}", flush=True)
    return {**labelled, "rendered": max(done, n)}


def _rendered_batch(
    data: dict[str, Any], rng: random.Random, n: int, matched_caption: str = "reading"
) -> tuple[list[np.ndarray], list[str], list[str], list[int]]:
    """``n`` cached renders with their captions, hard negatives and indices in ``data``.

    A render's caption is what the oracle reads in it; with ``matched_caption="prompt"``, a
    render that shows its prompt's subject is captioned by its prompt instead (the gate's
    own question: does this image pass for this prompt).
    """
    if matched_caption not in ("reading", "prompt"):
        raise ValueError(f"matched_caption must be reading or prompt, got {matched_caption!r}")
    images, captions, negatives = [], [], []
    picked = [rng.randrange(len(data["prompts"])) for _ in range(n)]
    for i in picked:
        caption = data["captions"][i]
        if matched_caption == "prompt" and data["matched"][i]:
            caption = data["prompts"][i]
        scene = world.scene_for_caption(caption, rng)
        extra = [] if data["matched"][i] else [data["prompts"][i]]
        images.append(data["images"][i])
        captions.append(caption)
        negatives += negatives_for(scene, rng, extra, form_of(caption))
    return images, captions, negatives, picked


def gate_loss(scores: Any, good: Any, groups: Any, strata: Any | None = None) -> Any:
    """A smooth count of bad (image, prompt) pairs scoring above good ones: 1 - AUC, softened.

    The contrastive loss ranks captions *for one image*; the gate compares one threshold
    with the scores of *every* image against its own prompt, so a bad render must score
    below a good render of another prompt too. ``scores`` are cosines, ``good`` says which
    pairs pass the oracle, and pairs are compared only within their ``groups`` value
    (renders with renders, world images with world images).

    With ``strata`` (each pair's prompt's shape count, say), every pairing of a stratum's
    good pairs with a stratum's bad ones weighs the same. Unweighted, a stratum whose
    images are mostly bad (two-shape renders) is cheapest ranked by lowering it whole, its
    good images below the other strata's threshold too; balanced, one threshold has to
    serve every stratum.
    """
    import torch.nn.functional as F

    strata = groups * 0 if strata is None else strata
    losses = []
    for group in groups.unique():
        here = groups == group
        kinds = strata[here].unique()
        for a in kinds:
            pos = scores[here & good & (strata == a)]
            for b in kinds:
                neg = scores[here & ~good & (strata == b)]
                if len(pos) and len(neg):
                    losses.append(F.softplus(GATE_SCALE * (neg[None, :] - pos[:, None])).mean())
    return sum(losses) / len(losses) if losses else scores.sum() * 0


def gate_pairs(
    data: dict[str, Any], picked: list[int], captions: list[str], n_world: int
) -> tuple[list[tuple[int, int, bool, int, int]], list[str]]:
    """The batch's (image, text column, good, group, shapes) pairs for :func:`gate_loss`.

    The batch holds ``n_world`` world images, then the renders ``picked`` from ``data``,
    captioned by ``captions`` (all of the batch's); its text is the captions, then
    ``NEGATIVES`` per image. A world image pairs with its caption (good) and its first
    negative (bad; for two shapes a swap between them); a render with its prompt, good
    when the oracle passed it. A prompt the batch's text lacks (a passed render captioned
    by its reading) is returned to be appended to the text.
    """
    size = len(captions)
    shapes = [len(world.parse_caption(c).shapes) for c in captions[:n_world]]
    pairs = [(w, w, True, 0, shapes[w]) for w in range(n_world)]
    pairs += [(w, size + w * NEGATIVES, False, 0, shapes[w]) for w in range(n_world)]
    extra: list[str] = []
    for r, i in enumerate(picked):
        row, prompt, good = n_world + r, data["prompts"][i], bool(data["matched"][i])
        if not good:  # its prompt is its first negative
            column = size + row * NEGATIVES
        elif captions[row] == prompt:
            column = row
        else:
            column = size * (1 + NEGATIVES) + len(extra)
            extra.append(prompt)
        pairs.append((row, column, good, 1, len(world.parse_caption(prompt).shapes)))
    return pairs, extra


def train_clip_gate(
    checkpoints: Path,
    out_dir: Path,
    renders: dict[str, Any],
    init_from: Path | None = None,
    steps: int = GATE_STEPS,
    render_steps: int = RENDER_STEPS,
    batch_size: int = 64,
    rendered_share: float = 0.6,
    lr: float = 5e-4,
    render_lr: float = 2e-4,
    two_shape_share: float = 0.4,
    matched_caption: str = "prompt",
    gate_weight: float = 0.0,
    gate_balance: bool = False,
    resume: bool = True,
    checkpoint_every: int = 50,
) -> Path:
    """Train (or resume) the gate phase; export the scorer CLIP to ``out_dir``.

    Starts from the joint checkpoint, or from ``init_from`` (a CLIP folder) when given.
    ``steps`` on world images teach shapes (a cosine schedule from ``lr``); then
    ``render_steps`` with ``rendered_share`` of each batch rendered teach the generated look
    and its failures (a second, lower schedule from ``render_lr``). ``two_shape_share`` of
    the world images hold two shapes; ``matched_caption`` as in :func:`_rendered_batch`.
    ``gate_weight`` adds :func:`gate_loss` on the batch's :func:`gate_pairs`, that much of it;
    ``gate_balance`` balances it over the prompts' shape counts.
    """
    import torch
    from transformers import CLIPModel

    torch.manual_seed(GATE_SEED)
    tok = tokenizer.build_tokenizer(checkpoints / "tokenizer")
    if init_from is not None:
        model = CLIPModel.from_pretrained(init_from)
    else:
        joint = common.load_checkpoint(checkpoints / "clip" / "ckpt.pt")
        if joint is None:
            raise FileNotFoundError("the gate phase needs the joint CLIP checkpoint or --init-from")
        model = CLIPModel(clip_config(len(tok)))
        model.load_state_dict(joint["model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    ckpt_path = checkpoints / "clip-gate" / "ckpt.pt"
    start = common.resume_training(ckpt_path, model, optimizer, "clip-gate") if resume else 0
    total = steps + render_steps
    progress = common.Progress("clip-gate", total)
    model.train()
    for step in range(start, total):
        rng = common.step_rng(GATE_SEED, step)
        n_rendered = 0 if step < steps else int(batch_size * rendered_share)
        scenes = world.sample_batch(rng, batch_size - n_rendered, two_shape_share)
        # World images stay sharp here: the renders bring the soft, generated look.
        world_images = common.images_to_tensor([world.render(s) for s in scenes])
        r_images, r_captions, r_negatives, picked = _rendered_batch(
            renders, rng, n_rendered, matched_caption
        )
        images = torch.cat(
            [world_images, *([common.images_to_tensor(r_images)] if r_images else [])]
        )
        forms = [random_form(s, rng) for s in scenes]
        captions = [
            s.caption(sizes=f[0], background=f[1]) for s, f in zip(scenes, forms, strict=True)
        ] + r_captions
        negatives = [
            c for s, f in zip(scenes, forms, strict=True) for c in negatives_for(s, rng, [], f)
        ] + r_negatives
        pairs, extra = (
            gate_pairs(renders, picked, captions, len(scenes)) if gate_weight else ([], [])
        )
        text = tok(
            captions + negatives + extra,
            padding="max_length",
            max_length=tokenizer.MAX_LENGTH,
            return_tensors="pt",
        )
        for group in optimizer.param_groups:
            group["lr"] = (
                common.cosine_lr(step, steps, lr, 30)
                if step < steps
                else common.cosine_lr(step - steps, render_steps, render_lr, 20)
            )
        out = model(
            input_ids=text["input_ids"], attention_mask=text["attention_mask"], pixel_values=images
        )
        loss = hard_negative_loss(out.logits_per_image[:, : len(captions) + len(negatives)])
        if gate_weight:
            rows, columns, good, groups, shapes = (
                torch.tensor(v) for v in zip(*pairs, strict=True)
            )
            scores = (out.image_embeds[rows] * out.text_embeds[columns]).sum(-1)
            strata = shapes if gate_balance else None
            loss = loss + gate_weight * gate_loss(scores, good, groups, strata)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        progress.update(step, float(loss.detach()))
        if (step + 1) % checkpoint_every == 0 or step + 1 in (steps, total):
            common.save_training(ckpt_path, model, optimizer, step + 1)
    return export_clip(model, tok, out_dir, checkpoints)
