"""The dataset writer: ``OUT/images/*.png`` plus ``metadata.jsonl`` (Hugging Face ImageFolder).

Failed attempts' images are kept apart, under ``OUT/review/<id>-<attempt>.png``, for the
review page: they are not part of the dataset unless a reviewer accepts one.

Images are written atomically (a temporary file in the same folder, then ``os.replace``;
one object write on an object store), before the store marks them accepted. The images
tree (``images/`` and ``review/``) may live elsewhere than the folder (``--images URL``,
:mod:`renderq.output.images`); it then gets its own copy of ``metadata.jsonl`` at the end
of each run, so that it is a whole ImageFolder. ``metadata.jsonl``, ``review.jsonl`` and
``ledger.json`` are views of the store: lines are appended as prompts finish, and each
file is rewritten whole from the store at the start and end of a run, so a crash
between an image and its line never leaves a missing or doubled line behind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from renderq.output.images import TMP_SUFFIX, ImageStore, StoredImage

IMAGES = "images"
METADATA = "metadata.jsonl"
REVIEW = "review.jsonl"
LEDGER = "ledger.json"
REVIEW_IMAGES = "review"
_TMP_SUFFIX = TMP_SUFFIX


def attempt_file_name(request_id: str, attempt: int) -> str:
    """Where a failed attempt's image is kept, relative to the output folder."""
    return f"{REVIEW_IMAGES}/{request_id}-{attempt}.png"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(path.name + _TMP_SUFFIX)
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class DatasetWriter:
    """Writes one output folder: images, metadata, review list and ledger."""

    def __init__(self, out: Path, images: str | Path | None = None) -> None:
        """Create ``out`` (and its ``images`` folder when the images are kept there);
        ``images``: where the images tree goes instead (a folder or fsspec URL)."""
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.store = ImageStore.at(images if images is not None else out)
        if self.store.local:
            Path(self.store.path(IMAGES)).mkdir(parents=True, exist_ok=True)

    def file_name(self, request_id: str) -> str:
        """The image's path relative to the images tree (the ImageFolder ``file_name``)."""
        return f"{IMAGES}/{request_id}.png"

    def write_image(self, request_id: str, image: Any) -> str:
        """Write an image (uint8 HWC array or PIL image) atomically; returns its file name.

        A :class:`StoredImage` (written by the worker that rendered it) is moved into place:
        its pixels never pass through this process."""
        name = self.file_name(request_id)
        if isinstance(image, StoredImage):
            return self.store.move(image.name, name)
        return self.store.put(name, image)

    def write_attempt_image(self, request_id: str, attempt: int, image: Any) -> str:
        """Keep a failed attempt's image for review, atomically; returns its file name."""
        name = attempt_file_name(request_id, attempt)
        if isinstance(image, StoredImage) and image.name == name:
            return name  # the worker wrote it there
        if isinstance(image, StoredImage):
            return self.store.move(image.name, name)
        return self.store.put(name, image)

    def read_image(self, name: str) -> bytes:
        """The PNG bytes of an image of the tree (``images/...`` or ``review/...``)."""
        return self.store.read(name)

    def append(self, which: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append JSON lines to ``metadata.jsonl`` or ``review.jsonl``."""
        lines = "".join(json.dumps(dict(r), sort_keys=False) + "\n" for r in rows)
        if lines:
            with open(self.out / which, "a", encoding="utf-8") as fh:
                fh.write(lines)
                fh.flush()

    def rewrite(self, which: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Replace ``metadata.jsonl`` or ``review.jsonl`` whole, atomically (and the images
        tree's own ``metadata.jsonl`` when the tree lives elsewhere)."""
        text = "".join(json.dumps(dict(r)) + "\n" for r in rows)
        atomic_write_text(self.out / which, text)
        if which == METADATA and self.store.root != str(self.out):
            self.store.write_text(METADATA, text)

    def write_ledger(self, ledger: Mapping[str, Any]) -> None:
        """Write ``ledger.json`` atomically."""
        atomic_write_text(self.out / LEDGER, json.dumps(dict(ledger), indent=2) + "\n")

    def prune(self, keep: set[str]) -> list[str]:
        """Delete image files (and leftover temporaries) not in ``keep``; returns them.

        After a crash an image may be on disk whose acceptance never reached the store;
        it is removed so the folder holds exactly the accepted images.
        """
        removed: list[str] = []
        for file in self.store.listdir(IMAGES):
            name = f"{IMAGES}/{file}"
            if name not in keep:
                self.store.delete(name)
                removed.append(name)
        return removed

    def drop_attempt_images(self, request_id: str, attempts: range) -> None:
        """Delete the kept images of ``attempts`` of one prompt (those that exist)."""
        for k in attempts:
            self.store.delete(attempt_file_name(request_id, k))

    def prune_attempts(self, keep: set[str]) -> list[str]:
        """Delete kept attempt images (and temporaries) of prompts not in ``keep``.

        A prompt the gate accepted in the end needs no review, so its failed attempts'
        images go; those of prompts that may still reach review stay.
        """
        removed: list[str] = []
        for file in self.store.listdir(REVIEW_IMAGES):
            rid = file.removesuffix(_TMP_SUFFIX).removesuffix(".png").rpartition("-")[0]
            if rid not in keep or file.endswith(_TMP_SUFFIX):
                self.store.delete(f"{REVIEW_IMAGES}/{file}")
                removed.append(f"{REVIEW_IMAGES}/{file}")
        return removed
