"""Where image files go: a local folder or any fsspec URL (``s3://``, ``gs://``, ``file://``).

:class:`ImageStore` writes, moves, lists and deletes the PNG files of a job's images tree
(``images/`` and ``review/``). On a local folder a write goes to a temporary file and is
renamed into place; on any other filesystem it is one ``pipe_file`` call, a single object
write that object stores make visible whole or not at all. A store is a small picklable
value (its URL), so a render worker can hold one and write the images it renders itself.

:class:`StoredImage` is what such a worker returns in place of pixels: the file's name in
the store and, when the worker scored the image beside it, the score and that image's
share of the scoring device-seconds.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from renderq.core.errors import ConfigError

TMP_SUFFIX = ".part"


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError("writing images needs Pillow: pip install 'renderq[diffusers]'") from exc
    return Image


def png_bytes(image: Any) -> bytes:
    """An image (uint8 HWC array or PIL image) encoded as PNG."""
    pil = image if hasattr(image, "save") else _pil().fromarray(image)
    buf = io.BytesIO()
    pil.save(buf, format="PNG")
    return buf.getvalue()


def is_url(location: str | Path) -> bool:
    """True for ``scheme://...`` (any fsspec filesystem), False for a local path."""
    return "://" in str(location)


@dataclass(frozen=True, slots=True)
class StoredImage:
    """An image a worker has written to the job's :class:`ImageStore` (pixels stay there)."""

    #: The file's name relative to the store's root (``review/<id>-<attempt>.png``).
    name: str
    #: The score the worker gave it (None: not scored there, or scoring failed).
    score: float | None = None
    #: This image's share of the worker's scoring device-seconds.
    score_seconds: float = 0.0
    #: Why scoring this image failed, when it did.
    score_error: str | None = None


@dataclass(frozen=True)
class ImageStore:
    """The root of a job's images: a local folder or an fsspec URL."""

    root: str
    _fs: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def at(cls, location: str | Path) -> ImageStore:
        """A store rooted at ``location``; ConfigError when its filesystem is unknown."""
        text = str(location)
        if not is_url(text):
            return cls(str(Path(text).expanduser()))
        store = cls(text.rstrip("/"))
        store.fs  # noqa: B018 - fail now, with the URL in the message, not at the first write
        return store

    @property
    def local(self) -> bool:
        """True when the root is a folder of this machine's filesystem, written directly."""
        return not is_url(self.root)

    @property
    def fs(self) -> Any:
        """The fsspec filesystem of a URL root (created once per process)."""
        if self._fs is None:
            try:
                import fsspec
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise ConfigError(f"--images {self.root!r} needs: pip install fsspec") from exc
            try:
                fs, _ = fsspec.core.url_to_fs(self.root)
            except (ImportError, ValueError) as exc:
                raise ConfigError(f"--images {self.root!r}: {exc}") from exc
            object.__setattr__(self, "_fs", fs)
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root}  # the filesystem is made again where the store travels

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "root", state["root"])
        object.__setattr__(self, "_fs", None)

    def path(self, name: str) -> str:
        """The full path (local) or URL path of ``name``."""
        return os.path.join(self.root, name) if self.local else f"{self.root}/{name}"

    def _fs_path(self, name: str) -> str:
        return str(self.fs._strip_protocol(self.path(name)))

    def put(self, name: str, image: Any) -> str:
        """Write ``image`` as PNG to ``name`` atomically; returns ``name``."""
        data = png_bytes(image)
        if self.local:
            path = Path(self.path(name))
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + TMP_SUFFIX)
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        else:
            target = self._fs_path(name)
            self.fs.makedirs(target.rpartition("/")[0], exist_ok=True)
            self.fs.pipe_file(target, data)
        return name

    def move(self, src: str, dst: str) -> str:
        """Rename ``src`` to ``dst`` (on object stores a server-side copy); returns ``dst``."""
        if self.local:
            Path(self.path(dst)).parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.path(src), self.path(dst))
        else:
            self.fs.makedirs(self._fs_path(dst).rpartition("/")[0], exist_ok=True)
            self.fs.mv(self._fs_path(src), self._fs_path(dst))
        return dst

    def delete(self, name: str) -> None:
        """Delete ``name`` if it exists."""
        if self.local:
            Path(self.path(name)).unlink(missing_ok=True)
        elif self.fs.exists(self._fs_path(name)):
            self.fs.rm(self._fs_path(name))

    def exists(self, name: str) -> bool:
        """True when ``name`` exists."""
        return Path(self.path(name)).exists() if self.local else self.fs.exists(self._fs_path(name))

    def read(self, name: str) -> bytes:
        """The bytes of ``name``."""
        if self.local:
            return Path(self.path(name)).read_bytes()
        return bytes(self.fs.cat_file(self._fs_path(name)))

    def listdir(self, folder: str) -> list[str]:
        """The file names (no folder part) in ``folder``, sorted; [] when it does not exist."""
        if self.local:
            path = Path(self.path(folder))
            return sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        target = self._fs_path(folder)
        if not self.fs.exists(target):
            return []
        return sorted(p.rstrip("/").rpartition("/")[2] for p in self.fs.ls(target, detail=False))

    def write_text(self, name: str, text: str) -> None:
        """Write a text file (the images tree's own ``metadata.jsonl``) in one write."""
        if self.local:
            path = Path(self.path(name))
            tmp = path.with_name(path.name + TMP_SUFFIX)
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        else:
            target = self._fs_path(name)
            self.fs.makedirs(target.rpartition("/")[0], exist_ok=True)
            self.fs.pipe_file(target, text.encode("utf-8"))
