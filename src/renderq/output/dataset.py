"""The dataset writer: ``OUT/images/*.png`` plus ``metadata.jsonl`` (Hugging Face ImageFolder).

Failed attempts' images are kept apart, under ``OUT/review/<id>-<attempt>.png``, for the
review page: they are not part of the dataset unless a reviewer accepts one.

Images are written atomically (a temporary file in the same folder, then ``os.replace``),
before the store marks them accepted. ``metadata.jsonl``, ``review.jsonl`` and
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

from renderq.core.errors import ConfigError

IMAGES = "images"
METADATA = "metadata.jsonl"
REVIEW = "review.jsonl"
LEDGER = "ledger.json"
REVIEW_IMAGES = "review"
_TMP_SUFFIX = ".part"


def attempt_file_name(request_id: str, attempt: int) -> str:
    """Where a failed attempt's image is kept, relative to the output folder."""
    return f"{REVIEW_IMAGES}/{request_id}-{attempt}.png"


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError("writing images needs Pillow: pip install 'renderq[diffusers]'") from exc
    return Image


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

    def __init__(self, out: Path) -> None:
        """Create ``out`` and ``out/images`` if needed."""
        self.out = out
        self.images = out / IMAGES
        self.images.mkdir(parents=True, exist_ok=True)

    def file_name(self, request_id: str) -> str:
        """The image's path relative to the folder (the ImageFolder ``file_name``)."""
        return f"{IMAGES}/{request_id}.png"

    def write_image(self, request_id: str, image: Any) -> str:
        """Write an image (uint8 HWC array or PIL image) atomically; returns its file name."""
        return self._write_png(self.file_name(request_id), image)

    def write_attempt_image(self, request_id: str, attempt: int, image: Any) -> str:
        """Keep a failed attempt's image for review, atomically; returns its file name."""
        (self.out / REVIEW_IMAGES).mkdir(exist_ok=True)
        return self._write_png(attempt_file_name(request_id, attempt), image)

    def _write_png(self, name: str, image: Any) -> str:
        path = self.out / name
        tmp = path.with_name(path.name + _TMP_SUFFIX)
        pil = image if hasattr(image, "save") else _pil().fromarray(image)
        with open(tmp, "wb") as fh:
            pil.save(fh, format="PNG")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return name

    def append(self, which: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append JSON lines to ``metadata.jsonl`` or ``review.jsonl``."""
        lines = "".join(json.dumps(dict(r), sort_keys=False) + "\n" for r in rows)
        if lines:
            with open(self.out / which, "a", encoding="utf-8") as fh:
                fh.write(lines)
                fh.flush()

    def rewrite(self, which: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Replace ``metadata.jsonl`` or ``review.jsonl`` whole, atomically."""
        atomic_write_text(self.out / which, "".join(json.dumps(dict(r)) + "\n" for r in rows))

    def write_ledger(self, ledger: Mapping[str, Any]) -> None:
        """Write ``ledger.json`` atomically."""
        atomic_write_text(self.out / LEDGER, json.dumps(dict(ledger), indent=2) + "\n")

    def prune(self, keep: set[str]) -> list[str]:
        """Delete image files (and leftover temporaries) not in ``keep``; returns them.

        After a crash an image may be on disk whose acceptance never reached the store;
        it is removed so the folder holds exactly the accepted images.
        """
        removed: list[str] = []
        for path in sorted(self.images.iterdir()):
            name = f"{IMAGES}/{path.name}"
            if name not in keep:
                path.unlink()
                removed.append(name)
        return removed

    def drop_attempt_images(self, request_id: str, attempts: range) -> None:
        """Delete the kept images of ``attempts`` of one prompt (those that exist)."""
        for k in attempts:
            (self.out / attempt_file_name(request_id, k)).unlink(missing_ok=True)

    def prune_attempts(self, keep: set[str]) -> list[str]:
        """Delete kept attempt images (and temporaries) of prompts not in ``keep``.

        A prompt the gate accepted in the end needs no review, so its failed attempts'
        images go; those of prompts that may still reach review stay.
        """
        folder = self.out / REVIEW_IMAGES
        removed: list[str] = []
        if not folder.is_dir():
            return removed
        for path in sorted(folder.iterdir()):
            rid = path.name.removesuffix(_TMP_SUFFIX).removesuffix(".png").rpartition("-")[0]
            if rid not in keep or path.name.endswith(_TMP_SUFFIX):
                path.unlink()
                removed.append(f"{REVIEW_IMAGES}/{path.name}")
        return removed
