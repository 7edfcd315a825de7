"""The dashboard and the gallery of a running ``renderq serve`` in headless Chromium.

One tenant has a finished job (every prompt escalated, both attempts' images kept) and a
40-prompt job in progress: a window job whose window opens in an hour, so its prompts wait
in the queue and in the job's backlog. The dashboard shows the backlog in the queue count,
the jobs' progress bars, a throughput chart drawn by the vendored uPlot and the refusal;
the gallery shows the finished job's rows and applies its filters. With
``RENDERQ_SCREENSHOTS=FOLDER`` set, the pages are saved as ``FOLDER/dashboard.png`` and
``FOLDER/gallery.png`` (docs/img/ is made that way).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.review.test_review_browser import browser  # noqa: F401  (the Chromium fixture)
from tests.service.conftest import Server, start_server, write_config
from tests.service.test_service import wait_job

pytestmark = pytest.mark.slow

pytest.importorskip("selenium.webdriver", reason="selenium is not installed")

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


@pytest.fixture
def busy(tmp_path: Path, models: tuple[Path, Path]) -> Iterator[tuple[Server, str, str]]:
    """A service with a finished job and a 40-prompt job in progress; yields their ids."""
    cfg = write_config(tmp_path / "renderq.toml", tmp_path / "data", *models,
                       threshold=1.0, max_attempts=2, max_queue_per_key=8)  # fmt: skip
    srv = start_server(cfg, tmp_path / "data", tmp_path / "server.log")
    try:
        with srv.client("token-alpha") as c:
            done = c.post("/v1/jobs", json={"prompts": ["a red circle", "a blue square"]})
            wait_job(c, done.json()["id"], {"done"})
            opens = time.time() + 3600  # windows are in Unix time: this one opens in an hour
            prompts = [f"a green triangle number {i}" for i in range(40)]
            waiting = c.post(
                "/v1/jobs",
                json={
                    "prompts": prompts,
                    "mode": "window",
                    "windows": f"{opens:.3f}-{opens + 3600:.3f}",
                },
            )
            assert waiting.status_code == 202, waiting.text  # fmt: skip
            gen = c.post("/v1/images/generations", json={"prompt": "a red square", "seed": 1})
            assert gen.status_code == 200, gen.text
            late = c.post("/v1/images/generations", json={"prompt": "x", "deadline_s": 0.001})
            assert late.status_code == 429, late.text
        yield srv, done.json()["id"], waiting.json()["id"]
    finally:
        srv.stop()


def _wait(b: Any) -> WebDriverWait[Any]:
    # The pages redraw after each load: an element found before may be gone.
    return WebDriverWait(b, 30, ignored_exceptions=(StaleElementReferenceException,))


def _shot(b: Any, name: str) -> None:
    if os.environ.get("RENDERQ_SCREENSHOTS"):
        folder = Path(os.environ["RENDERQ_SCREENSHOTS"])
        folder.mkdir(parents=True, exist_ok=True)
        b.save_screenshot(str(folder / name))


def _bar(b: Any, job: str, part: str) -> tuple[int, str]:
    span = b.find_element(By.CSS_SELECTOR, f'tr.job[data-id="{job}"] .progress .{part}')
    return int(span.get_attribute("data-n")), str(span.get_attribute("style"))


def test_dashboard_shows_progress_the_bulk_queue_and_charts(
    busy: tuple[Server, str, str],
    browser: Any,  # noqa: F811
) -> None:
    srv, done, waiting = busy
    browser.get(srv.url + "/#token=token-alpha")
    wait = _wait(browser)
    wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-loaded"))
    # The 40 prompts are queued: 6 in the key's queue (its bulk room) and 34 in the backlog.
    assert browser.find_element(By.ID, "queued").text == "40"
    assert browser.find_element(By.ID, "waiting").text == "34"
    assert _bar(browser, waiting, "pending") == (40, "width: 100%;")
    assert _bar(browser, waiting, "accepted")[0] == 0
    assert _bar(browser, done, "escalated") == (2, "width: 100%;")
    # uPlot drew both charts, and the throughput one holds the finished images.
    for chart in ("chart-throughput", "chart-latency"):
        canvas = browser.find_element(By.CSS_SELECTOR, f"#{chart} canvas")
        assert int(canvas.get_attribute("width")) > 0
    drawn = browser.execute_script(
        'return charts["chart-throughput"].data[1].reduce((a, v) => a + v, 0)'
    )
    # Three final answers in the window (10 s buckets): the finished job's two prompts and
    # the interactive image; the refused request never ran.
    assert round(drawn * 10) == 3
    reasons = browser.find_element(By.ID, "refusals").text
    assert "deadline 1" in reasons
    _shot(browser, "dashboard.png")


def test_gallery_shows_attempts_and_applies_its_filters(
    busy: tuple[Server, str, str],
    browser: Any,  # noqa: F811
) -> None:
    srv, done, waiting = busy
    browser.get(srv.url + "/gallery/#token=token-alpha")
    wait = _wait(browser)
    loaded = lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-loaded")  # noqa: E731
    wait.until(loaded)
    rows = browser.find_elements(By.CSS_SELECTOR, "#rows .row")
    assert [r.get_attribute("data-id") for r in rows] == ["p000000", "p000001"]
    assert {r.get_attribute("data-outcome") for r in rows} == {"escalated"}

    # Every attempt's kept image arrived and decoded: two per row.
    def decoded(b: Any) -> int:
        imgs = b.find_elements(By.CSS_SELECTOR, "#rows figure img")
        return sum(i.get_attribute("naturalWidth") not in (None, "0") for i in imgs)

    wait.until(lambda b: decoded(b) == 4)
    assert "seed" in rows[0].find_element(By.TAG_NAME, "figcaption").text
    _shot(browser, "gallery.png")

    Select(browser.find_element(By.ID, "outcome")).select_by_value("accepted")
    wait.until(loaded)
    assert browser.find_elements(By.CSS_SELECTOR, "#rows .row") == []
    assert browser.find_element(By.ID, "count").text == "0 prompts"
    Select(browser.find_element(By.ID, "outcome")).select_by_value("escalated")
    wait.until(loaded)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#rows .row")) == 2
    jobs = Select(browser.find_element(By.ID, "job"))
    assert {o.get_attribute("value") for o in jobs.options} == {"", done, waiting}
    jobs.select_by_value(waiting)  # nothing of it rendered yet
    wait.until(loaded)
    assert browser.find_elements(By.CSS_SELECTOR, "#rows .row") == []
