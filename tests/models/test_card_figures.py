"""The model card's figures against ``weights/figures.json`` and a reduced re-measurement."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from renderq.models import shapes
from renderq.models.shapes import common, evaluate, oracle, world

README = common.WEIGHTS_DIR.parent / "README.md"


def _figures() -> dict[str, Any]:
    figures: dict[str, Any] = json.loads((common.WEIGHTS_DIR / "figures.json").read_text())
    return figures


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


CARD_PERCENTAGES = [
    "clip_colour_top1",
    "clip_shape_top1",
    "sd_first_attempt",
    "sd_within_4_seeds",
    "sd_first_attempt_full",
    "sd_first_attempt_short",
    "sd_first_attempt_one_shape",
    "sd_first_attempt_two_shape",
    "sd_first_attempt_subject",
    "sd_first_attempt_strict",
    "never_pass",
    "gate_oracle_pass_rate",
    "gate_recall",
    "gate_specificity",
    "gate_balanced_accuracy",
    "gate_one_shape_recall",
    "gate_one_shape_specificity",
    "gate_one_shape_balanced_accuracy",
    "gate_two_shape_recall",
    "gate_two_shape_specificity",
    "gate_two_shape_balanced_accuracy",
    "gate_agreement",
]


def test_the_card_quotes_figures_json() -> None:
    figures, card = _figures(), README.read_text(encoding="utf-8")
    missing = [k for k in CARD_PERCENTAGES if _pct(figures[k]) not in card]
    assert not missing, {k: _pct(figures[k]) for k in missing}
    for key in ("gate_auc", "gate_one_shape_auc", "gate_two_shape_auc"):
        assert f"{figures[key]:.3f}" in card, key
    for value in figures["fix_curve"]:
        assert _pct(value) in card
    assert f"{figures['gate_threshold']:.2f}" in card
    # Every interval the card's detector table quotes is the one figures.json holds.
    for prefix in ("gate_", "gate_one_shape_", "gate_two_shape_"):
        for name in ("recall", "specificity", "balanced_accuracy"):
            lo, hi = figures[f"{prefix}{name}_ci"]
            assert f"{_pct(lo)}-{_pct(hi)}" in card, (prefix, name)


def test_the_shipped_weights_hashes_are_the_cards() -> None:
    import hashlib

    card = README.read_text(encoding="utf-8")
    for path in sorted(common.WEIGHTS_DIR.rglob("*.safetensors")):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert digest in card, path.relative_to(common.WEIGHTS_DIR)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*accelerate.*")
@pytest.mark.skipif(not shapes.default_pipeline_path().is_dir(), reason="weights not built")
def test_a_reduced_evaluation_reproduces_the_cards_first_attempt_rate() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    torch.set_num_threads(2)
    pipe = shapes.load_default_pipeline()
    pipe.set_progress_bar_config(disable=True)
    rng = random.Random(evaluate.PROMPT_SEED)
    prompts = [world.random_caption(rng, short_forms=True) for _ in range(48)]
    # The evaluation's first 48 prompts at their first seeds: the same images it counted.
    images = evaluate.generate(
        pipe,
        prompts,
        [1000 * i for i in range(len(prompts))],
        shapes.DEFAULT_STEPS,
        shapes.DEFAULT_GUIDANCE,
        16,
    )
    rate = float(np.mean([oracle.matches(im, p) for im, p in zip(images, prompts, strict=True)]))
    figures = _figures()
    # 48 of 500 prompts: a binomial spread of about 6 points around the card's rate.
    assert abs(rate - figures["sd_first_attempt"]) <= 0.12, (rate, figures["sd_first_attempt"])
    # The gate at the shipped threshold keeps most of the images the oracle passes.
    judge = evaluate.ClipJudge(shapes.default_clip_path())
    scores = judge.scores(images, prompts)
    ok = np.array([oracle.matches(im, p) for im, p in zip(images, prompts, strict=True)])
    kept = float((scores[ok] >= 100 * shapes.DEFAULT_THRESHOLD).mean())
    assert kept >= figures["gate_recall_ci"][0] - 0.1, kept
