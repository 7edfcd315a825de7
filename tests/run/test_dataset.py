"""The dataset writer: atomic images, rewritable views, pruning what the store never knew."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from renderq.output.dataset import METADATA, DatasetWriter


def test_image_written_atomically_as_png(tmp_path: Path) -> None:
    w = DatasetWriter(tmp_path)
    pixels = np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3)
    name = w.write_image("p000001", pixels)
    assert name == "images/p000001.png"
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == ["p000001.png"]
    with Image.open(tmp_path / name) as im:
        assert np.array_equal(np.asarray(im), pixels)
    # Writing again replaces the file; it never leaves a second one or a temporary.
    w.write_image("p000001", pixels[::-1])
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == ["p000001.png"]


def test_prune_keeps_only_known_images(tmp_path: Path) -> None:
    w = DatasetWriter(tmp_path)
    pixels = np.zeros((8, 8, 3), dtype=np.uint8)
    keep = w.write_image("a", pixels)
    w.write_image("b", pixels)
    (tmp_path / "images" / "c.png.part").write_bytes(b"half")
    assert w.prune({keep}) == ["images/b.png", "images/c.png.part"]
    assert [p.name for p in (tmp_path / "images").iterdir()] == ["a.png"]


def test_append_then_rewrite(tmp_path: Path) -> None:
    w = DatasetWriter(tmp_path)
    w.append(METADATA, [{"file_name": "images/a.png", "prompt": "x"}])
    w.append(METADATA, [{"file_name": "images/a.png", "prompt": "x"}])  # a doubled line...
    w.rewrite(METADATA, [{"file_name": "images/a.png", "prompt": "x"}])  # ...is healed
    lines = (tmp_path / METADATA).read_text().splitlines()
    assert [json.loads(x)["file_name"] for x in lines] == ["images/a.png"]
    assert not list(tmp_path.glob("*.part"))
