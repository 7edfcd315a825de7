"""The review page in headless Chromium, driven by Selenium over ``renderq review``.

The folder comes from ``renderq run`` on the embedded models with a threshold no image
reaches, so every prompt escalates with two attempts. Accept one attempt, edit and
resubmit another prompt, reject a third; then the store, ``metadata.jsonl`` and
``review.jsonl`` say so, and a restarted page shows the same. With
``RENDERQ_SCREENSHOTS=FOLDER`` set, the page is saved as ``FOLDER/review.png``
(docs/img/review.png is made that way).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from renderq.jobs import review

from .conftest import REVIEW_PROMPTS

pytestmark = pytest.mark.slow

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium under chromedriver (skips where either is not installed)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if exe is None or chromedriver is None:
        pytest.skip("chromium and chromium-driver are not installed (make browser installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = exe
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--window-size=1400,1400",
    ):
        opts.add_argument(flag)  # fmt: skip
    service = webdriver.ChromeService(executable_path=chromedriver)
    driver = webdriver.Chrome(options=opts, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def review_server(out: Path, log: Path) -> Iterator[str]:
    """``renderq review OUT`` in its own process, until the block ends."""
    import httpx

    port = _free_port()
    cmd = [sys.executable, "-m", "renderq", "review", str(out), "--port", str(port),
           "--reviewer", "ana"]  # fmt: skip
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "api", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "renderq review did not answer: " + log.read_text()
            time.sleep(0.1)  # polling a process's port: nothing to wait on but the socket
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _card(browser: Any, rid: str) -> Any:
    return browser.find_element(By.CSS_SELECTOR, f'.item[data-id="{rid}"]')


def _state(browser: Any, rid: str) -> str:
    return str(_card(browser, rid).get_attribute("data-state"))


def _open(browser: Any, url: str) -> WebDriverWait[Any]:
    browser.get(url)
    # The page redraws its list after each load: an element found before may be gone.
    wait = WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,))
    wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-loaded"))
    # every kept image has arrived and decoded
    wait.until(lambda b: all(i.get_attribute("naturalWidth") not in (None, "0")
                             for i in b.find_elements(By.CSS_SELECTOR, "figure img")))  # fmt: skip
    return wait


@pytest.fixture
def escalated_run(tmp_path: Path) -> Path:
    """``renderq run`` on the embedded models: four prompts, each escalated after 2 attempts."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(REVIEW_PROMPTS) + "\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "renderq", "run", str(prompts), "--out", str(out),
           "--threshold", "0.99", "--max-attempts", "2", "--threads", "1", "--json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["escalated"] == len(REVIEW_PROMPTS)
    return out


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_review_page_accept_edit_reject_and_a_restart_shows_the_same(
    browser: Any, escalated_run: Path, tmp_path: Path
) -> None:
    out = escalated_run
    with review_server(out, tmp_path / "review.log") as url:
        wait = _open(browser, url)
        cards = browser.find_elements(By.CSS_SELECTOR, ".item")
        assert [c.get_attribute("data-id") for c in cards] == [f"p{i:06d}" for i in range(4)]
        assert len(browser.find_elements(By.CSS_SELECTOR, "figure img")) == 8
        caption = _card(browser, "p000000").find_elements(By.TAG_NAME, "figcaption")[1].text
        with review.open_store(out) as store:
            second = store.attempts_of("p000000")[1]
        assert caption == f"attempt 1 · seed {second.seed} · score {second.score:.3f}"

        _card(browser, "p000000").find_element(
            By.CSS_SELECTOR, 'figure[data-attempt="1"] button.accept').click()  # fmt: skip
        wait.until(lambda b: _state(b, "p000000") == "accepted")
        edit = _card(browser, "p000002").find_element(By.CSS_SELECTOR, "textarea.edit")
        edit.clear()
        edit.send_keys("a big yellow triangle on a white background")
        _card(browser, "p000002").find_element(By.CSS_SELECTOR, "button.resubmit").click()
        wait.until(lambda b: _state(b, "p000002") == "edited")
        _card(browser, "p000001").find_element(By.CSS_SELECTOR, "button.reject").click()
        wait.until(lambda b: _state(b, "p000001") == "rejected")
        assert browser.find_element(By.ID, "status").text == "recorded: reject p000001"
        shown = {r: _card(browser, r).text for r in ("p000000", "p000001", "p000002")}
        if os.environ.get("RENDERQ_SCREENSHOTS"):
            folder = Path(os.environ["RENDERQ_SCREENSHOTS"])
            folder.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(folder / "review.png"))

    # What the page did is in the store and the views.
    with review.open_store(out) as store:
        states = {r.prompt.id: r.state for r in store.requests()}
        decisions = [(d.request_id, d.action, d.reviewer, d.attempt, d.new_request_id)
                     for d in store.decisions()]  # fmt: skip
    assert states == {"p000000": "accepted", "p000001": "rejected", "p000002": "edited",
                      "p000003": "escalated", "p000002-r1": "pending"}  # fmt: skip
    assert decisions == [("p000000", "accept", "ana", 1, None),
                         ("p000002", "edit", "ana", None, "p000002-r1"),
                         ("p000001", "reject", "ana", None, None)]  # fmt: skip
    [meta] = _lines(out / "metadata.jsonl")
    assert (meta["id"], meta["attempt"], meta["accepted_by"]) == ("p000000", 1, "review")
    rev = {r["id"]: r["review"] for r in _lines(out / "review.jsonl")}
    assert rev["p000001"]["decision"] == "rejected" and rev["p000003"] is None
    assert rev["p000002"]["resubmitted_as"] == "p000002-r1" and "p000000" not in rev

    # A restarted page shows the same decisions.
    with review_server(out, tmp_path / "review.log") as url:
        _open(browser, url)
        ids = ("p000000", "p000001", "p000002", "p000003")
        assert {r: _state(browser, r) for r in ids} == {
            "p000000": "accepted", "p000001": "rejected", "p000002": "edited",
            "p000003": "escalated",
        }  # fmt: skip
        assert {r: _card(browser, r).text for r in shown} == shown
        assert "accepted attempt 1 by ana" in shown["p000000"]
        assert "resubmitted as p000002-r1 (pending" in shown["p000002"]
        assert not _card(browser, "p000000").find_elements(By.CSS_SELECTOR, "button")
        assert _card(browser, "p000003").find_elements(By.CSS_SELECTOR, "button.reject")
