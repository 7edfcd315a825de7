"""``benchmarks/prompt_forms.py`` names the first cause of a failed whole-prompt check."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from renderq.models.shapes import oracle, world

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "prompt_forms.py"


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("prompt_forms", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("asked", "drawn", "expected"),
    [
        ("a large red circle on a blue background", "a large red circle on a green background",
         "wrong background"),
        ("a large red circle on a blue background", "a large red square on a blue background",
         "right colour, wrong kind"),
        ("a large red circle on a blue background", "a large green circle on a blue background",
         "colour missing"),
        ("a large red circle on a blue background", "a small red circle on a blue background",
         "wrong size"),
        ("a red circle and a white square", "a large white square on a red background",
         "shape colour = background"),
    ],
)  # fmt: skip
def test_each_failure_gets_its_first_cause(asked: str, drawn: str, expected: str) -> None:
    rng = random.Random(3)
    image = world.render(world.scene_for_caption(drawn, rng))
    asked_scene = world.scene_for_caption(asked, rng)
    verdict = oracle.check(image, asked)
    assert not verdict.whole_ok
    states_background = world.parse_caption(asked).background is not None
    assert _bench().cause(asked_scene, states_background, verdict) == expected


def test_a_blank_image_reads_no_shape() -> None:
    image = world.render(world.Scene("blue", ()))
    asked = "a red circle"
    scene = world.scene_for_caption(asked, random.Random(0))
    verdict = oracle.check(image, asked)
    assert _bench().cause(scene, False, verdict) == "no shape read"
