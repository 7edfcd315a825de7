"""Short prompts (no size word, no background clause), the whole-prompt QA check and the
vocabulary warning API (numpy only, fast)."""

from __future__ import annotations

import random

import pytest

from renderq.models import shapes
from renderq.models.shapes import common, oracle, world


def _image(caption: str, seed: int = 0) -> object:
    return world.render(world.scene_for_caption(caption, random.Random(seed)))


@pytest.mark.parametrize(
    ("caption", "sizes", "background"),
    [
        ("a red circle", (None,), None),
        ("a large red circle", ("large",), None),
        ("a red circle on a blue background", (None,), "blue"),
        ("a small red circle and a blue square", ("small", None), None),
        ("A Red Circle  ", (None,), None),
    ],
)
def test_short_forms_parse(
    caption: str, sizes: tuple[str | None, ...], background: str | None
) -> None:
    parsed = world.parse_caption(caption)
    assert tuple(s for _, _, s in parsed.shapes) == sizes
    assert parsed.background == background
    assert parsed.full is False


def test_training_captions_mix_full_and_short_forms_and_describe_their_scene() -> None:
    rng = random.Random(21)
    forms = {"full": 0, "no size": 0, "no background": 0}
    for _ in range(2000):
        scene = world.random_scene(rng)
        caption = world.training_caption(scene, rng)
        parsed = world.parse_caption(caption)
        assert oracle.check(world.render(scene), caption).whole_ok
        forms["full"] += parsed.full
        forms["no size"] += all(s is None for _, _, s in parsed.shapes)
        forms["no background"] += parsed.background is None
    assert 0.45 < forms["full"] / 2000 < 0.6
    assert abs(forms["no size"] / 2000 - world.SHORT_SIZE_PROB) < 0.04
    assert abs(forms["no background"] / 2000 - world.SHORT_BACKGROUND_PROB) < 0.04
    # The batches every training stage reads carry the same mix.
    _, captions = common.world_batch(random.Random(2), 200)
    assert 50 < sum(not world.parse_caption(c).full for c in captions) < 150


def test_a_short_prompt_is_checked_on_what_it_states_only() -> None:
    for size in world.SIZES:
        for background in ("blue", "white"):
            image = _image(f"a {size} red circle on a {background} background", seed=3)
            assert oracle.matches(image, "a red circle")
            assert oracle.matches(image, f"a {size} red circle")
            assert not oracle.matches(
                image, f"a {'large' if size == 'small' else 'small'} red circle"
            )
            assert oracle.matches(image, f"a red circle on a {background} background")
            assert not oracle.matches(image, "a red circle on a green background")
            assert not oracle.matches(image, "a red square")


def test_the_qa_check_asks_for_every_named_shape() -> None:
    caption = "a small white triangle and a large black square on a green background"
    image = _image(caption, seed=3)
    verdict = oracle.check(image, caption)
    assert verdict.whole_ok and verdict.subject_ok and verdict.all_ok
    lone = _image("a small white triangle on a green background", seed=3)
    missing = oracle.check(lone, caption)
    # The earlier first-shape check passes an image that lacks the second shape.
    assert missing.subject_ok and not missing.whole_ok and not oracle.matches(lone, caption)
    assert oracle.matches_subject(lone, caption)
    for wrong in (
        "a small white square and a large black triangle on a green background",  # kinds
        "a small black triangle and a large white square on a green background",  # colours
        "a large white triangle and a small black square on a green background",  # sizes
        "a small white triangle and a large black square on a red background",  # background
    ):
        assert not oracle.matches(image, wrong), wrong
    # The shape named alone is in the image: the caption states no more than that.
    assert oracle.matches(image, "a white triangle")
    assert not oracle.check(image, "a white triangle").all_ok  # strict: nothing extra


def test_scene_for_a_short_caption_fills_in_size_and_background() -> None:
    rng = random.Random(4)
    sizes, backgrounds = set(), set()
    for _ in range(60):
        scene = world.scene_for_caption("a red circle", rng)
        assert [(s.kind, s.colour) for s in scene.shapes] == [("circle", "red")]
        assert scene.background != "red"
        sizes.add(scene.shapes[0].size)
        backgrounds.add(scene.background)
    assert sizes == set(world.SIZES) and len(backgrounds) >= 5


def test_unknown_words_name_each_word_outside_the_vocabulary_once() -> None:
    assert shapes.unknown_words("a red circle") == []
    assert shapes.unknown_words("A large RED circle, on a blue background.") == []
    assert shapes.unknown_words("a cute red dragon and a red dragon in space") == [
        "cute",
        "dragon",
        "in",
        "space",
    ]
    assert shapes.unknown_words("") == []


def test_the_example_prompt_is_inside_the_world() -> None:
    example = shapes.example_prompt()
    assert shapes.unknown_words(example) == []
    world.parse_caption(example)


def test_example_prompt_files_mix_full_and_short_forms() -> None:
    import json
    from pathlib import Path

    folder = Path(world.__file__).resolve().parents[2] / "examples"
    lines = (folder / "shapes-200.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(set(lines)) == 200
    parsed = [world.parse_caption(line) for line in lines]
    full = sum(p.full for p in parsed)
    assert 80 <= full <= 120
    assert any(p.background is None for p in parsed)
    assert any(p.background is not None and not p.full for p in parsed)
    assert all(shapes.unknown_words(line) == [] for line in lines)
    overrides = (folder / "shapes-overrides.jsonl").read_text(encoding="utf-8").splitlines()
    forms = {world.parse_caption(json.loads(line)["prompt"]).full for line in overrides}
    assert forms == {True, False}
