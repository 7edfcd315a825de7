"""An exclusive lock on an output folder, so two processes never work on one job.

It is an ``fcntl.flock`` on ``OUT/.renderq.lock``: the kernel drops it when the process
dies, even by SIGKILL, so a crashed run never leaves a stale lock behind. The file holds
the owner's pid, for the error message only.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from renderq.core.errors import RenderqError

LOCK_NAME = ".renderq.lock"
"""Name of the lock file inside the output folder."""


class JobLocked(RenderqError):
    """Another live process holds the job's lock."""


class FolderLock:
    """``with FolderLock(out):`` holds the folder's lock, or raises :class:`JobLocked`."""

    def __init__(self, folder: Path) -> None:
        """Prepare the lock for ``folder`` (taken on ``acquire`` / ``__enter__``)."""
        self.path = folder / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock without waiting; raise :class:`JobLocked` if it is held."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise JobLocked(
                f"another renderq process (pid {owner}) is working on {self.path.parent}; "
                "wait for it to finish or stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Release the lock (the file stays; it is harmless)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
