"""The CLIP scorer on a real tiny CLIP checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from renderq.backends.clip import ClipScorer
from renderq.core.errors import ConfigError

from .conftest import PROMPTS


def _images(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(n)]


def test_cosine_scores_batched_and_invariant(scorer: ClipScorer) -> None:
    images = _images(4)
    result = scorer.score(images, PROMPTS[:4])
    assert len(result.scores) == 4 and result.device_seconds > 0
    assert all(s is not None and -1.0 <= s <= 1.0 for s in result.scores)
    alone = scorer.score(images[2:3], PROMPTS[2:3]).scores[0]
    assert alone == pytest.approx(result.scores[2], abs=1e-5)
    # The score depends on the prompt: another prompt gives another score.
    other = scorer.score(images[2:3], ["a large black square on a white background"]).scores[0]
    assert other != pytest.approx(alone, abs=1e-6)


def test_clipscore_scale(tiny_clip: Path, scorer: ClipScorer) -> None:
    scaled = ClipScorer(scorer.model, scorer.processor, "tiny", scale100=True)
    images = _images(3)
    cos = scorer.score(images, PROMPTS[:3]).scores
    s100 = scaled.score(images, PROMPTS[:3]).scores
    for c, s in zip(cos, s100, strict=True):
        assert c is not None and s is not None
        assert s == pytest.approx(100 * max(c, 0.0), abs=1e-4)


def test_mismatched_lengths(scorer: ClipScorer) -> None:
    with pytest.raises(ConfigError, match="2 images but 1 prompts"):
        scorer.score(_images(2), PROMPTS[:1])


def test_unknown_scorer_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no config\.json"):
        ClipScorer.load(str(tmp_path))
