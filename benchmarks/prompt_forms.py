"""Why the embedded mini-SD fails short prompts: the same scenes in each caption form.

Draws ``--scenes`` random world scenes (30% two-shape, as the card's prompts), captions each
in four forms (full; no size words; no background clause; neither), renders every caption
at the first seed the card uses (``1000 * i``), and reads each image with the pixel oracle.
Per form it prints the whole-prompt match, one- and two-shape apart, and the first cause
of each failure, in this order:

- ``no shape read``: the oracle finds no shape at all;
- ``wrong background``: the caption states a background and the image has another;
- ``shape colour = background``: a named shape is missing and its colour is the image's
  background (the shape's colour flooded the whole image);
- ``right colour, wrong kind``: a named shape's colour is there, as another kind;
- ``colour missing``: a named shape's colour is nowhere;
- ``wrong size``: every named shape is there, a stated size word is not.

Run: ``python benchmarks/prompt_forms.py --weights src/renderq/models/shapes/weights``
(about 2 min at one thread for 160 scenes).
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from renderq.models.shapes import oracle, world

FORMS = {
    "full": {"sizes": True, "background": True},
    "no size": {"sizes": False, "background": True},
    "no background": {"sizes": True, "background": False},
    "neither": {"sizes": False, "background": False},
}


def cause(scene: world.Scene, states_background: bool, verdict: oracle.Verdict) -> str:
    """The first cause (see the module docstring) of a failed whole-prompt check."""
    reading = verdict.reading
    found = reading.pairs()
    if not reading.shapes:
        return "no shape read"
    if states_background and reading.background != scene.background:
        return "wrong background"
    missing = [(s.colour, s.kind) for s in scene.shapes if (s.colour, s.kind) not in found]
    if not missing:
        return "wrong size"
    if any(colour == reading.background for colour, _ in missing):
        return "shape colour = background"
    if any(colour in {c for c, _ in found} for colour, _ in missing):
        return "right colour, wrong kind"
    return "colour missing"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=Path, required=True, help="folder with mini-sd/")
    parser.add_argument("--scenes", type=int, default=160)
    parser.add_argument("--seed", type=int, default=7, help="seed of the scenes")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    import torch
    from diffusers import StableDiffusionPipeline

    from renderq.models.shapes.build import DEFAULT_GUIDANCE, DEFAULT_STEPS
    from renderq.models.shapes.evaluate import generate

    torch.set_num_threads(args.threads)
    pipe = StableDiffusionPipeline.from_pretrained(args.weights / "mini-sd")
    pipe.set_progress_bar_config(disable=True)
    rng = random.Random(args.seed)
    scenes = [world.random_scene(rng, 0.3) for _ in range(args.scenes)]
    seeds = [1000 * i for i in range(len(scenes))]
    out: dict[str, Any] = {}
    for name, form in FORMS.items():
        prompts = [s.caption(**form) for s in scenes]
        images = generate(pipe, prompts, seeds, DEFAULT_STEPS, DEFAULT_GUIDANCE, 16)
        causes: Counter[str] = Counter()
        passed = {1: [0, 0], 2: [0, 0]}
        for scene, prompt, image in zip(scenes, prompts, images, strict=True):
            verdict = oracle.check(image, prompt)
            passed[len(scene.shapes)][1] += 1
            if verdict.whole_ok:
                passed[len(scene.shapes)][0] += 1
            else:
                causes[cause(scene, form["background"], verdict)] += 1
        ok = passed[1][0] + passed[2][0]
        out[name] = {
            "match": ok / len(scenes),
            "one_shape": passed[1][0] / max(1, passed[1][1]),
            "two_shape": passed[2][0] / max(1, passed[2][1]),
            "causes": dict(causes.most_common()),
        }
        print(
            f"{name:>13}: {ok / len(scenes):6.1%} (one shape {passed[1][0]}/{passed[1][1]}, "
            f"two {passed[2][0]}/{passed[2][1]}); failures: "
            + ", ".join(f"{k} {v}" for k, v in causes.most_common()),
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
