"""Choosing thresholds: target precision on labels, target pass rate, the stored file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from renderq.backends import calibrate as cal
from renderq.cli.calibrate import calibrate
from renderq.core.errors import ConfigError


def test_precision_target_picks_lowest_threshold_reaching_it() -> None:
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    labels = [True, True, False, True, False, False]
    t, precision, recall = cal.for_precision(scores, labels, 0.75)
    # At 0.6 three of four accepted are good (0.75), and all three good ones are kept.
    assert (t, precision, recall) == (0.6, 0.75, 1.0)
    t, precision, _ = cal.for_precision(scores, labels, 1.0)
    assert (t, precision) == (0.8, 1.0)


def test_precision_target_out_of_reach() -> None:
    with pytest.raises(ConfigError, match="no threshold reaches precision"):
        cal.for_precision([0.9, 0.1], [False, True], 0.9)


def test_ties_are_accepted_together() -> None:
    t, precision, _ = cal.for_precision([0.5, 0.5, 0.4], [True, False, True], 0.6)
    assert t == 0.4 and precision == pytest.approx(2 / 3)


def test_pass_rate() -> None:
    scores = [0.1 * i for i in range(10)]
    t, rate = cal.for_pass_rate(scores, 0.3)
    assert t == pytest.approx(0.7) and rate == pytest.approx(0.3)
    with pytest.raises(ConfigError, match="pass rate"):
        cal.for_pass_rate(scores, 0.0)


def test_store_and_lookup(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    cal.save(path, cal.Calibration("clip-a", "cosine", 0.21, "pass_rate", 0.8, 0.8, 10))
    cal.save(path, cal.Calibration("clip-b", "cosine", 0.3, "pass_rate", 0.5, 0.5, 10))
    assert cal.lookup(path, "clip-a", "cosine") == 0.21
    assert cal.lookup(path, "clip-a", "clipscore") is None
    assert cal.lookup(tmp_path / "none.json", "clip-a", "cosine") is None


@pytest.mark.slow
def test_calibrate_command_on_images(tmp_path: Path, tiny_clip: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(1)
    lines = []
    for i in range(6):
        name = f"img{i}.png"
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(tmp_path / name)
        lines.append(json.dumps({"file_name": name, "prompt": f"a red circle {i}"}))
    data = tmp_path / "set.jsonl"
    data.write_text("\n".join(lines) + "\n")
    store = tmp_path / "cal.json"
    app = typer.Typer()
    app.command()(calibrate)
    args = [str(data), "--scorer", str(tiny_clip), "--target-pass-rate", "0.5",
            "--store", str(store), "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["method"] == "pass_rate" and out["n"] == 6 and out["achieved"] == 0.5
    assert cal.lookup(store, str(tiny_clip), "cosine") == out["threshold"]
    bad = CliRunner().invoke(app, [str(data), "--scorer", str(tiny_clip), "--target-precision",
                                   "0.9", "--store", str(store)])  # fmt: skip
    assert bad.exit_code == 2 and "needs a boolean 'label'" in bad.stderr


def test_run_threshold_precedence(tmp_path: Path) -> None:
    from renderq.backends.registry import scorer_default_threshold
    from renderq.cli.run import qa_settings
    from renderq.core.settings import FALLBACK_THRESHOLD, ModelSpec
    from renderq.jobs.runner import RunSettings

    path = tmp_path / "cal.json"

    def pick(
        scorer: str = "some/clip", scale100: bool = False, given: float | None = None
    ) -> float | None:
        qa = qa_settings(given, 3, path, scorer, scale100)
        s = RunSettings(path, tmp_path, ModelSpec(scorer=scorer), qa=qa, scale100=scale100)
        return s.resolved().qa.threshold

    assert pick() == FALLBACK_THRESHOLD
    shipped = scorer_default_threshold("embedded:clip")
    assert pick("embedded:clip") == (FALLBACK_THRESHOLD if shipped is None else shipped)
    cal.save(path, cal.Calibration("some/clip", "cosine", 0.31, "pass_rate", 0.9, 0.9, 50))
    assert pick() == 0.31
    assert pick(scale100=True) == FALLBACK_THRESHOLD  # other scale
    assert pick(given=-0.5) == -0.5


_scores = st.lists(st.integers(-100, 100).map(lambda v: v / 100), min_size=1, max_size=40)


@given(_scores, st.integers(1, 100).map(lambda v: v / 100))
def test_pass_rate_passes_at_least_the_target_share(scores: list[float], rate: float) -> None:
    t, achieved = cal.for_pass_rate(scores, rate)
    assert achieved == sum(s >= t for s in scores) / len(scores)
    assert achieved >= rate - 1e-12
    # Any higher threshold drawn from the scores passes less than the target.
    higher = [s for s in scores if s > t]
    if higher:
        assert sum(s >= min(higher) for s in scores) / len(scores) < rate


@given(st.data())
def test_precision_threshold_is_the_lowest_reaching_the_target(data: st.DataObject) -> None:
    scores = data.draw(_scores)
    labels = data.draw(st.lists(st.booleans(), min_size=len(scores), max_size=len(scores)))
    target = data.draw(st.integers(1, 100).map(lambda v: v / 100))
    if not any(labels):
        return

    def precision(t: float) -> float:
        kept = [lab for s, lab in zip(scores, labels, strict=True) if s >= t]
        return sum(kept) / len(kept)

    reaching = [t for t in set(scores) if precision(t) >= target]
    if not reaching:
        with pytest.raises(ConfigError):
            cal.for_precision(scores, labels, target)
        return
    t, p, _ = cal.for_precision(scores, labels, target)
    assert t == min(reaching) and p == pytest.approx(precision(t))


def test_shapes_oracle_labels_world_images(tmp_path: Path) -> None:
    import random

    from PIL import Image

    from renderq.cli.calibrate import oracle_labels

    world = pytest.importorskip("renderq.models.shapes.world")
    rng = random.Random(3)
    items = []
    for i in range(4):
        scene = world.random_scene(rng, two_shape_prob=0.0)
        path = tmp_path / f"s{i}.png"
        Image.fromarray(world.render(scene)).save(path)
        caption = scene.caption()
        if i % 2:  # a caption naming another shape does not match the picture
            kind = scene.shapes[0].kind
            other = next(k for k in world.SHAPES if k != kind)
            caption = caption.replace(f" {kind} on", f" {other} on")
        items.append(cal.LabelledImage(path, caption, None))
    labels = [i.label for i in oracle_labels(items, "shapes-oracle")]
    assert labels == [True, False, True, False]
    with pytest.raises(ConfigError, match="--label-with"):
        oracle_labels(items, "human")
