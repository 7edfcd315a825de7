"""``--images``: render workers score their own renders and write them to a folder or URL.

The store is tested on a local folder and on fsspec's ``memory://`` filesystem; the
writing executor with the shared fakes; the whole job on the embedded models, in this
process and on two one-thread worker processes, against the reference run that writes
its images itself.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from renderq.backends.writing import WorkerScores, WritingExecutor
from renderq.core.errors import ConfigError
from renderq.core.settings import key_for
from renderq.core.types import Batch, BatchResult, ItemResult, Request, ScoreResult
from renderq.output.dataset import DatasetWriter
from renderq.output.images import ImageStore, StoredImage

from .test_pool import _accepted, _run, _same_images, embedded

RED = np.zeros((8, 8, 3), dtype=np.uint8)
RED[..., 0] = 255


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ImageStore:
    if request.param == "local":
        return ImageStore.at(tmp_path / "tree")
    return ImageStore.at(f"memory://renderq-test/{tmp_path.name}")


def test_a_store_puts_moves_lists_and_deletes_without_leftovers(store: ImageStore) -> None:
    assert store.listdir("review") == []
    store.put("review/p1-0.png", RED)
    store.put("review/p2-0.png", RED)
    assert store.listdir("review") == ["p1-0.png", "p2-0.png"]  # no temporary file left
    import io

    from PIL import Image

    assert np.array_equal(np.asarray(Image.open(io.BytesIO(store.read("review/p1-0.png")))), RED)
    store.move("review/p1-0.png", "images/p1.png")
    assert store.listdir("images") == ["p1.png"] and not store.exists("review/p1-0.png")
    store.delete("review/p2-0.png")
    store.delete("review/p2-0.png")  # a second delete of a missing file is no error
    assert store.listdir("review") == []


def test_a_store_travels_by_its_url_alone(store: ImageStore) -> None:
    store.put("review/a-0.png", RED)
    copy = pickle.loads(pickle.dumps(store))
    assert copy == store and copy.exists("review/a-0.png")


def test_an_unknown_filesystem_is_named() -> None:
    with pytest.raises(ConfigError, match="--images 'nosuchfs://bucket/x'"):
        ImageStore.at("nosuchfs://bucket/x")


def _batch(*attempts: tuple[str, int]) -> Batch:
    key = key_for("m", 64, 64, 4, 4.0, "ddim", "fp32", "cpu")
    reqs = tuple(Request(rid, f"prompt {rid}", key, attempt=k) for rid, k in attempts)
    return Batch(1, reqs[0].key, reqs, 0.0, 8)


class _Pixels:
    """Renders a red image per request, except ``fail``, which gets an item error."""

    device_class = "cpu"

    def __init__(self, fail: str = "") -> None:
        self.fail = fail

    def run(self, batch: Batch) -> BatchResult:
        items = tuple(
            ItemResult(r.id, error="boom") if r.id == self.fail else ItemResult(r.id, RED.copy())
            for r in batch.requests
        )
        return BatchResult(batch.id, items, 0.5, "cpu")


class _Scores:
    device_class = "cpu"

    def __init__(self, raises: bool = False) -> None:
        self.raises = raises
        self.seen: list[list[str]] = []

    def score(self, images: Any, prompts: Any) -> ScoreResult:
        if self.raises:
            raise RuntimeError("scorer fell over")
        self.seen.append(list(prompts))
        return ScoreResult(tuple(0.1 * (i + 1) for i in range(len(images))), 0.3, "cpu")


def test_a_writing_worker_returns_handles_with_its_scores_and_writes_each_attempt(
    store: ImageStore,
) -> None:
    scorer = _Scores()
    ex = WritingExecutor(_Pixels(fail="c"), scorer, store)
    result = ex.run(_batch(("a", 0), ("b", 2), ("c", 0)))
    a, b, c = result.items
    assert result.device_seconds == 0.5  # render time only: scoring is booked per image
    assert a.image == StoredImage("review/a-0.png", 0.1, pytest.approx(0.15))
    assert b.image == StoredImage("review/b-2.png", 0.2, pytest.approx(0.15))
    assert c.error == "boom" and c.image is None  # a failed item stays failed, unscored
    assert scorer.seen == [["prompt a", "prompt b"]]
    assert store.listdir("review") == ["a-0.png", "b-2.png"]
    scored = WorkerScores("cpu").score([a.image, b.image], ["prompt a", "prompt b"])
    assert scored.scores == (0.1, 0.2) and scored.device_seconds == pytest.approx(0.3)


def test_a_worker_whose_scorer_fails_still_writes_and_says_why(store: ImageStore) -> None:
    [item] = WritingExecutor(_Pixels(), _Scores(raises=True), store).run(_batch(("a", 0))).items
    assert isinstance(item.image, StoredImage) and item.image.score is None
    assert "scorer fell over" in str(item.image.score_error)
    scored = WorkerScores("cpu").score([item.image], ["prompt a"])
    assert scored.scores == (None,) and "scorer fell over" in str(scored.errors[0])


def test_a_failed_write_fails_that_attempt_not_the_worker(tmp_path: Path) -> None:
    blocked = tmp_path / "tree"
    blocked.write_text("a file where the folder should be")
    writing = WritingExecutor(_Pixels(), _Scores(), ImageStore.at(blocked))
    [item] = writing.run(_batch(("a", 0))).items
    assert not item.ok and str(blocked / "review" / "a-0.png") in str(item.error)


def test_the_driver_scorer_refuses_pixels() -> None:
    with pytest.raises(TypeError, match="must be StoredImage, not ndarray"):
        WorkerScores("cpu").score([RED], ["p"])


def test_the_writer_moves_a_stored_image_into_place(store: ImageStore, tmp_path: Path) -> None:
    writer = DatasetWriter(tmp_path / "out", store.root)
    store.put("review/p1-1.png", RED)
    assert writer.write_attempt_image("p1", 1, StoredImage("review/p1-1.png")) == "review/p1-1.png"
    assert writer.write_image("p1", StoredImage("review/p1-1.png")) == "images/p1.png"
    assert store.listdir("images") == ["p1.png"] and store.listdir("review") == []
    assert not (tmp_path / "out" / "images").exists()  # the tree lives at the store only
    writer.rewrite("metadata.jsonl", [{"file_name": "images/p1.png"}])
    assert json.loads(store.read("metadata.jsonl"))["file_name"] == "images/p1.png"


# -- the whole job on the embedded models ----------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Path]:
    tmp = tmp_path_factory.mktemp("writes")
    summary, out = _run(tmp, "ref")
    return tmp, summary, out


def _watch_images(monkeypatch: pytest.MonkeyPatch) -> list[type]:
    """The types of the images the driver's listener receives."""
    from renderq.jobs import runner

    seen: list[type] = []
    step = runner.JobListener.step

    def spy(self: Any, s: Any) -> None:
        seen.extend(type(v) for v in s.images.values())
        step(self, s)

    monkeypatch.setattr(runner.JobListener, "step", spy)
    return seen


@pytest.mark.slow
@embedded
@pytest.mark.parametrize("devices", [(), ("--devices", "cpu:1,cpu:1")], ids=["here", "pool"])
def test_workers_that_write_accept_what_the_reference_accepts_and_send_no_pixels(
    reference: tuple[Path, dict[str, Any], Path],
    monkeypatch: pytest.MonkeyPatch,
    devices: tuple[str, ...],
) -> None:
    tmp, ref, ref_out = reference
    tree = tmp / f"tree-{len(devices)}"
    seen = _watch_images(monkeypatch)
    summary, out = _run(tmp, f"out-{len(devices)}", "--images", tree.as_uri(), *devices)
    assert summary["accepted"] == ref["accepted"] and summary["escalated"] == ref["escalated"]
    assert seen and set(seen) == {StoredImage}  # handles only, never an array
    assert not (out / "images").exists()  # the folder holds the store, views and ledger
    _same_images(_accepted(tree), _accepted(ref_out))
    rows = [json.loads(x) for x in (out / "metadata.jsonl").read_text().splitlines()]
    assert (tree / "metadata.jsonl").read_text() == (out / "metadata.jsonl").read_text()
    assert all(r["clip_score"] > 0 and r["scorer"] == "embedded:clip" for r in rows)
    ledger = json.loads((out / "ledger.json").read_text())["device_seconds"]
    assert ledger["score"] > 0 and ledger["render"] > 0 and not ledger.get("lost")
    # Failed attempts stay in the tree for review, only those of prompts not accepted.
    accepted = {r["id"] for r in rows}
    assert all(f.split("-")[0] not in accepted for f in ImageStore.at(tree).listdir("review"))


@pytest.mark.slow
@embedded
def test_a_resume_with_another_images_location_is_refused(
    reference: tuple[Path, dict[str, Any], Path],
) -> None:
    from typer.testing import CliRunner

    from renderq.cli.main import app

    tmp, _, _ = reference
    _run(tmp, "moved", "--images", str(tmp / "tree-a"))
    result = CliRunner().invoke(
        app, ["run", str(tmp / "prompts.txt"), "--out", str(tmp / "moved"), "--steps", "4",
              "--threshold", "0.75", "--max-batch-size", "4", "--images", str(tmp / "tree-b")],
    )  # fmt: skip
    assert result.exit_code == 2 and "images:" in result.output and "tree-b" in result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mode", "step"], "--images .* is not supported with --mode step"),
        (["--scorer-devices", "cpu:1"], "drop --scorer-devices cpu"),
    ],
)
def test_images_with_what_it_cannot_join_is_refused(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    from typer.testing import CliRunner

    from renderq.cli.main import app

    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle\n")
    result = CliRunner().invoke(
        app, ["run", str(prompts), "--out", str(tmp_path / "o"), "--images", "memory://x", *extra]
    )
    assert result.exit_code == 2
    import re

    assert re.search(message, result.output), result.output
