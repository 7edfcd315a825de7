"""The shapes world, its caption grammar and the pixel oracle (numpy only, fast)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from renderq.models.shapes import oracle, world


def test_oracle_reads_generator_images() -> None:
    rng = random.Random(4242)
    scenes = [world.random_scene(rng) for _ in range(400)]
    right = sum(oracle.check(world.render(s), s.caption()).all_ok for s in scenes)
    assert right / len(scenes) >= 0.99


@pytest.mark.parametrize("kind", world.SHAPES)
@pytest.mark.parametrize("size", list(world.SIZES))
def test_oracle_classifies_each_kind_and_size(kind: str, size: str) -> None:
    rng = random.Random(7)
    caption = f"a {size} orange {kind} on a purple background"
    for _ in range(10):
        reading = oracle.read_image(world.render(world.scene_for_caption(caption, rng)))
        assert reading.background == "purple"
        assert reading.pairs() == [("orange", kind)]


def test_oracle_rejects_wrong_colour_and_shape() -> None:
    scene = world.scene_for_caption("a large red circle on a blue background", random.Random(1))
    image = world.render(scene)
    assert oracle.matches(image, "a large red circle on a blue background")
    assert not oracle.matches(image, "a large green circle on a blue background")
    assert not oracle.matches(image, "a large red square on a blue background")


def test_oracle_checks_first_shape_and_strict_match() -> None:
    caption = "a small white triangle and a large black square on a green background"
    image = world.render(world.scene_for_caption(caption, random.Random(3)))
    verdict = oracle.check(image, caption)
    assert verdict.subject_ok and verdict.all_ok
    swapped = "a small white square and a large black triangle on a green background"
    assert not oracle.check(image, swapped).subject_ok


def test_blank_image_has_no_shapes() -> None:
    image = np.zeros((64, 64, 3), dtype=np.uint8)
    image[:] = world.PALETTE["yellow"]
    reading = oracle.read_image(image)
    assert reading.background == "yellow"
    assert reading.shapes == ()


def test_noise_specks_are_not_shapes() -> None:
    rng = np.random.default_rng(0)
    image = np.full((64, 64, 3), world.PALETTE["blue"], dtype=np.uint8)
    ys, xs = rng.integers(0, 64, 40), rng.integers(0, 64, 40)
    image[ys, xs] = world.PALETTE["red"]
    assert oracle.read_image(image).shapes == ()


def test_oracle_rejects_bad_arrays() -> None:
    with pytest.raises(ValueError, match="RGB"):
        oracle.read_image(np.zeros((64, 64), dtype=np.uint8))


def test_world_is_seeded() -> None:
    first = [s.caption() for s in world.sample_batch(random.Random(9), 20)]
    again = [s.caption() for s in world.sample_batch(random.Random(9), 20)]
    assert first == again
    assert len(set(first)) > 10


def test_caption_grammar_round_trip() -> None:
    rng = random.Random(11)
    for _ in range(200):
        scene = world.random_scene(rng)
        parsed = world.parse_caption(scene.caption())
        assert parsed.background == scene.background
        assert parsed.shapes == tuple((s.kind, s.colour, s.size) for s in scene.shapes)
        assert scene.background not in {s.colour for s in scene.shapes}


@pytest.mark.parametrize(
    "bad",
    [
        "a red",
        "red circle",
        "a red circle background",
        "a red circle and a blue square and a green triangle",
        "a small red circle on a blue",
        "a huge red circle on a blue background",
        "a small red hexagon on a blue background",
    ],
)
def test_parse_caption_rejects_bad_text(bad: str) -> None:
    with pytest.raises(ValueError, match="caption"):
        world.parse_caption(bad)


def test_shapes_stay_apart_and_inside() -> None:
    rng = random.Random(5)
    for _ in range(300):
        scene = world.random_scene(rng, two_shape_prob=1.0)
        a, b = scene.shapes
        assert abs(a.cx - b.cx) > a.radius + b.radius or abs(a.cy - b.cy) > a.radius + b.radius
        for s in scene.shapes:
            assert s.radius <= s.cx < world.IMAGE_SIZE - s.radius
            assert s.radius <= s.cy < world.IMAGE_SIZE - s.radius
