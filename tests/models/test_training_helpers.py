"""Small pure helpers of the training scripts (no training runs here)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from renderq.models.shapes import clip_gate, common, evaluate, oracle, world


def test_hard_negatives_swap_the_two_kinds_or_change_only_the_first_shape() -> None:
    rng = random.Random(8)
    for scene in world.sample_batch(rng, 50, two_shape_prob=0.5):
        truth = world.parse_caption(scene.caption())
        negatives = clip_gate.negatives_for(scene, rng, [])
        assert len(negatives) == clip_gate.NEGATIVES == len(set(negatives))
        first, rest = truth.shapes[0], truth.shapes[1:]
        swap = bool(rest) and rest[0][0] != first[0]
        if swap:
            # The two kinds exchanged: same colours and sizes, kinds bound the other way.
            parsed = world.parse_caption(negatives[0])
            assert parsed.background == truth.background
            assert [k for k, _, _ in parsed.shapes] == [rest[0][0], first[0]]
            assert [(c, z) for _, c, z in parsed.shapes] == [(c, z) for _, c, z in truth.shapes]
        for caption in negatives[int(swap) :]:
            parsed = world.parse_caption(caption)
            assert parsed.background == truth.background
            assert parsed.shapes[1:] == truth.shapes[1:]
            assert parsed.shapes[0] != truth.shapes[0]
        kinds = {world.parse_caption(c).shapes[0][0] for c in negatives[int(swap) : int(swap) + 2]}
        assert kinds == set(world.SHAPES) - {scene.shapes[0].kind}
        # A failed render's prompt comes first when given.
        assert clip_gate.negatives_for(scene, rng, ["x"])[0] == "x"


def test_scene_from_reading_puts_the_subject_first_and_sizes_by_extent() -> None:
    scene = world.Scene(
        "blue",
        (
            world.Shape("square", "red", "large", 20, 20, 14),
            world.Shape("circle", "white", "small", 48, 48, 8),
        ),
    )
    reading = oracle.read_image(world.render(scene))
    got = clip_gate.scene_from_reading(reading, ("white", "circle"))
    assert got.caption() == "a small white circle and a large red square on a blue background"
    assert clip_gate.scene_from_reading(reading, None).shapes[0].colour == "red"


def test_step_stream_is_reproducible() -> None:
    a = [s.caption() for s in world.sample_batch(common.step_rng(3, 17), 8)]
    b = [s.caption() for s in world.sample_batch(common.step_rng(3, 17), 8)]
    c = [s.caption() for s in world.sample_batch(common.step_rng(3, 18), 8)]
    assert a == b and a != c


def test_cosine_schedule_warms_up_and_decays() -> None:
    lrs = [common.cosine_lr(s, 1000, 1e-3, 100) for s in range(1000)]
    assert lrs[0] < lrs[50] < lrs[99] <= 1e-3
    assert lrs[999] < lrs[500] < lrs[100]
    assert min(lrs[100:]) >= 1e-4 - 1e-12


def test_zero_shot_label_set_covers_the_one_shape_grammar() -> None:
    labels = evaluate.single_shape_captions()
    assert len(labels) == len(set(labels)) == 2 * 8 * 3 * 7
    for label in labels:
        world.parse_caption(label)


def test_threshold_calibration_maximises_agreement() -> None:
    import numpy as np

    scores = np.array([10.0, 11.0, 12.0, 30.0, 31.0, 29.0])
    truth = np.array([False, False, False, True, True, True])
    threshold = evaluate.calibrate_threshold(scores, truth)
    assert 12.0 < threshold <= 29.0
    assert ((scores >= threshold) == truth).all()


def test_training_state_round_trips(tmp_path: Path) -> None:
    import torch

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    path = tmp_path / "ckpt.pt"
    assert common.resume_training(path, model, optimizer, "t") == 0  # nothing saved yet
    common.save_training(path, model, optimizer, 7)
    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    assert common.resume_training(path, fresh, fresh_opt, "t") == 7
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_opt.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()


def test_the_shipped_gate_threshold_is_the_calibrated_one() -> None:
    import json

    from renderq.engine.models import DEFAULT_SCORER, scorer_default_threshold
    from renderq.models import shapes

    figures = json.loads((common.WEIGHTS_DIR / "figures.json").read_text())
    assert round(figures["gate_threshold"] / 100, 4) == shapes.DEFAULT_THRESHOLD
    assert scorer_default_threshold(DEFAULT_SCORER) == shapes.DEFAULT_THRESHOLD
    assert scorer_default_threshold(DEFAULT_SCORER, scale100=True) == 100 * shapes.DEFAULT_THRESHOLD
    assert scorer_default_threshold("some/other-clip") is None


def test_rendered_batch_captions_matched_renders_by_reading_or_by_prompt() -> None:
    image = np.zeros((64, 64, 3), np.uint8)
    data = {
        "images": [image, image],
        "prompts": [
            "a small red square and a large blue circle on a white background",
            "a small green circle on a black background",
        ],
        "captions": [
            "a small red square on a white background",
            "a small green square on a black background",
        ],
        "matched": [True, False],
    }
    for mode in ("reading", "prompt"):
        rng = random.Random(3)
        _, captions, negatives = clip_gate._rendered_batch(data, rng, 40, mode)
        picked = [data["captions"].index(c) if c in data["captions"] else 0 for c in captions]
        for k, caption in enumerate(captions):
            own = negatives[k * clip_gate.NEGATIVES : (k + 1) * clip_gate.NEGATIVES]
            if picked[k] == 1:  # the failed render: its reading, its prompt a negative
                assert caption == data["captions"][1] and own[0] == data["prompts"][1]
            else:
                want = data["prompts"][0] if mode == "prompt" else data["captions"][0]
                assert caption == want and data["prompts"][1] not in own
        assert set(picked) == {0, 1}
    with pytest.raises(ValueError, match="'both'"):
        clip_gate._rendered_batch(data, random.Random(0), 1, "both")
