"""``renderq calibrate --from-reviews OUT``: the threshold fitted on reviewer decisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from renderq.backends import calibrate as cal
from renderq.cli.calibrate import calibrate
from renderq.jobs import review

pytestmark = pytest.mark.slow


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(calibrate)
    return app


def _scores(out: Path) -> dict[tuple[str, int], float]:
    with review.open_store(out) as store:
        return {(r, a.attempt): a.score for r, tries in store.attempts().items() for a in tries
                if a.score is not None}  # fmt: skip


def test_the_threshold_is_fitted_on_what_reviewers_decided(escalated: Path, tmp_path: Path) -> None:
    out = escalated / "out"
    scores = _scores(out)
    # Accept the best-scoring attempt of all; reject the prompt whose best score is lowest,
    # and edit another: at precision 1.0 the fitted threshold is the accepted score.
    (best_id, best_attempt), best = max(scores.items(), key=lambda kv: kv[1])
    others = sorted({r for r, _ in scores} - {best_id})
    worst = min(others, key=lambda r: max(s for (i, _), s in scores.items() if i == r))
    edited = next(r for r in others if r != worst)
    review.decide(out, best_id, "accept", "ana", attempt=best_attempt)
    review.decide(out, worst, "reject", "bo")
    review.decide(out, edited, "edit", "bo", prompt="a tiny red dot")
    negatives = [s for (r, _), s in scores.items() if r in (worst, edited)]

    store = tmp_path / "cal.json"
    args = ["--from-reviews", str(out), "--target-precision", "1.0", "--store", str(store),
            "--json"]  # fmt: skip
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["threshold"] == best and got["method"] == "review_precision"
    assert (got["achieved"], got["recall"], got["n"]) == (1.0, 1.0, 1 + len(negatives))
    assert max(negatives) < best
    with review.open_store(out) as job:
        scorer = str((job.job_config() or {})["scorer"])
    assert cal.lookup(store, scorer, "cosine") == best  # stored under the run's scorer

    # A lower target lets the threshold come down past negatives, never above the positive.
    half = CliRunner().invoke(_app(), [*args[:3], "0.5", "--store", str(store), "--json"])
    assert half.exit_code == 0, half.output
    assert json.loads(half.stdout)["threshold"] <= best


def test_from_reviews_refuses_what_it_cannot_fit(escalated: Path, tmp_path: Path) -> None:
    out = escalated / "out"
    store = ["--store", str(tmp_path / "cal.json")]
    none = CliRunner().invoke(_app(), ["--from-reviews", str(out), "--target-precision", "0.9",
                                       *store])  # fmt: skip
    assert none.exit_code == 2 and "holds no reviewer decisions" in none.stderr
    review.decide(out, "p000000", "reject", "ana")
    no_positive = CliRunner().invoke(_app(), ["--from-reviews", str(out),
                                              "--target-precision", "0.9", *store])  # fmt: skip
    assert no_positive.exit_code == 2 and "no positive" in no_positive.stderr
    rate = CliRunner().invoke(_app(), ["--from-reviews", str(out), "--target-pass-rate", "0.5",
                                       *store])  # fmt: skip
    assert rate.exit_code == 2 and "takes --target-precision only" in rate.stderr
    both = CliRunner().invoke(_app(), ["x.jsonl", "--from-reviews", str(out),
                                       "--target-precision", "0.9", *store])  # fmt: skip
    assert both.exit_code == 2 and "one of them" in both.stderr
    assert not (tmp_path / "cal.json").exists()
