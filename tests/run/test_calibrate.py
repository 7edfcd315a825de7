"""Choosing thresholds: target precision on labels, target pass rate, the stored file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from renderq.cli.calibrate import calibrate
from renderq.core.errors import ConfigError
from renderq.scoring import calibrate as cal


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
    from renderq.cli.run import DEFAULT_THRESHOLD, pick_threshold

    path = tmp_path / "cal.json"
    assert pick_threshold(path, "some/clip", False) == DEFAULT_THRESHOLD
    cal.save(path, cal.Calibration("some/clip", "cosine", 0.31, "pass_rate", 0.9, 0.9, 50))
    assert pick_threshold(path, "some/clip", False) == 0.31
    assert pick_threshold(path, "some/clip", True) == DEFAULT_THRESHOLD  # other scale
