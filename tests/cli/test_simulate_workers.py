"""``renderq simulate --workers``: a count, or CLASS=N for the profile's device class."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from renderq.cli.main import app
from renderq.cli.simulate import parse_workers
from renderq.core.errors import ConfigError


def test_workers_are_a_count_or_the_profiles_class() -> None:
    assert parse_workers("8", "a100-80gb") == 8
    assert parse_workers("a100-80gb=1000", "a100-80gb") == 1000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cuda-h100=10", "the profile's workers are 'a100-80gb', not 'cuda-h100'"),
        ("0", "N >= 1, got '0'"),
        ("a100-80gb=x", "N >= 1, got 'a100-80gb=x'"),
    ],
)
def test_bad_workers_are_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_workers(text, "a100-80gb")


def test_a_thousand_workers_finish_sooner_than_ten() -> None:
    def makespan(workers: str) -> float:
        res = CliRunner().invoke(app, [
            "simulate", "--profile", "article-sdxl-a100", "--renders", "2000",
            "--modes", "window", "--workers", workers, "--json",
        ])  # fmt: skip
        assert res.exit_code == 0, res.output
        return float(json.loads(res.stdout)["modes"]["window"]["makespan_s"])

    assert makespan("a100-80gb=1000") < makespan("10")
