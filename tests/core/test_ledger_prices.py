"""Prices per device class: ``--price`` parsing and money per class in the ledger report."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from renderq.core.errors import ConfigError
from renderq.core.ledger import Ledger, parse_prices


def test_prices_parse_per_class() -> None:
    assert parse_prices("cpu=0.05, cuda-a100=1.9") == {"cpu": 0.05, "cuda-a100": 1.9}
    assert parse_prices("free=0") == {"free": 0.0}


@pytest.mark.parametrize(
    ("text", "bad"),
    [("cpu", "'cpu'"), ("=1", "'=1'"), ("cpu=x", "'cpu=x'"), ("cpu=-1", "'cpu=-1'"),
     ("cpu=nan", "'cpu=nan'"), ("a=1,", "''")],
)  # fmt: skip
def test_bad_prices_are_named(text: str, bad: str) -> None:
    with pytest.raises(ConfigError, match=f"entry {bad} is not CLASS=PRICE"):
        parse_prices(text)


def test_a_class_priced_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="'cpu' twice"):
        parse_prices("cpu=1,cpu=2")


def test_render_and_score_classes_are_booked_and_priced_apart() -> None:
    led = Ledger()
    led.book_batch("render", [0, 0, 0, 1], 7200.0, "cuda-a100")
    led.book_batch("score", [0, 0, 0, 1], 3600.0, "cuda-l4")
    led.count_accepted(4)
    rep = led.report(prices={"cuda-a100": 1.9, "cuda-l4": 0.7})
    by = rep.by_device_class()
    assert by["cuda-a100"]["device_seconds"] == {"render": 5400.0, "regen": 1800.0}
    assert by["cuda-l4"]["device_seconds"] == {"score": 2700.0, "rescore": 900.0}
    assert by["cuda-a100"]["gpu_hours"] == 2.0 and by["cuda-l4"]["gpu_hours"] == 1.0
    assert by["cuda-a100"]["gpu_hours_per_10k_accepted"] == pytest.approx(5000.0)
    assert by["cuda-a100"]["cost"] == pytest.approx(3.8)
    assert by["cuda-l4"]["cost_per_10k_accepted"] == pytest.approx(0.7 / 4 * 10_000)
    assert rep.cost() == pytest.approx(4.5)
    assert rep.cost_per_10k_accepted() == pytest.approx(4.5 / 4 * 10_000)
    assert rep.to_dict()["by_device_class"] == by


def test_an_unpriced_class_has_no_money_and_neither_has_the_total() -> None:
    led = Ledger()
    led.book_batch("render", [0], 10.0, "cuda")
    led.book_batch("score", [0], 1.0, "cpu")
    rep = led.report(prices={"cuda": 2.0})
    assert rep.by_device_class()["cpu"]["cost"] is None
    assert rep.by_device_class()["cuda"]["cost"] == pytest.approx(10 / 3600 * 2.0)
    assert rep.cost() is None and rep.cost_per_10k_accepted() is None


def test_a_negative_class_price_is_refused() -> None:
    with pytest.raises(ValueError, match="-2"):
        Ledger().report(prices={"cpu": -2.0})


classes = st.sampled_from(["cpu", "cuda-a100", "cuda-l4"])
bookings = st.lists(
    st.tuples(
        st.sampled_from(["render", "score"]),
        st.lists(st.integers(0, 3), min_size=1, max_size=5),
        st.floats(0, 1e4, allow_nan=False),
        classes,
    ),
    max_size=30,
)


@given(bookings, st.dictionaries(classes, st.floats(0, 10, allow_nan=False), min_size=3))
def test_class_figures_add_up_to_the_totals(
    batches: list[tuple[str, list[int], float, str]], prices: dict[str, float]
) -> None:
    led = Ledger()
    for kind, attempts, secs, dev in batches:
        led.book_batch(kind, attempts, secs, dev)
    led.count_accepted(3)
    rep = led.report(prices=prices)
    by = rep.by_device_class()
    hours = [float(v["gpu_hours"]) for v in by.values()]
    assert math.isclose(math.fsum(hours), rep.total_seconds / 3600, rel_tol=1e-9, abs_tol=1e-9)
    costs = [float(v["cost"]) for v in by.values()]
    assert math.isclose(math.fsum(costs), rep.cost() or 0.0, rel_tol=1e-9, abs_tol=1e-9)
    for v in by.values():
        stages = v["device_seconds"]
        assert isinstance(stages, dict)
        assert math.isclose(math.fsum(stages.values()), float(v["gpu_hours"]) * 3600,
                            rel_tol=1e-9, abs_tol=1e-6)  # fmt: skip
