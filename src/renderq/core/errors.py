"""The renderq exception tree, in one place.

::

    RenderqError                  base of everything renderq raises on purpose
    ├── ConfigError (ValueError)  a bad setting or input; the message quotes the bad value
    │   └── ProfileError          a cost/memory profile that cannot be used
    ├── StorageError              the output folder or job store cannot be written
    ├── WorkerLost                a worker (thread, process, actor) died holding a batch
    ├── Stalled                   a simulation that can make no progress (a policy or core bug)
    ├── InvalidTransition         a request state change the transition table forbids
    └── UnknownRequest (KeyError) an id the scheduler has never seen
"""

from __future__ import annotations


class RenderqError(Exception):
    """Base class of every error renderq raises on purpose."""


class ConfigError(RenderqError, ValueError):
    """A bad setting or input value. The message names the value."""


class ProfileError(ConfigError):
    """A cost or memory profile that is malformed or cannot serve a request."""


class StorageError(RenderqError):
    """The output folder or its job store cannot be written (not a folder, read-only, full)."""


class WorkerLost(RenderqError):
    """A worker died holding a batch: raised by an executor whose backend is gone (a
    process that exited, an actor that died), or by the engine when a device class has
    lost its workers too many times in a row. The batch goes back to the queue."""


class Stalled(RenderqError):
    """A simulation whose events go on without any request moving forward, or whose renders
    exceed what the retry budget allows: a bug in a policy or the scheduler, not an input."""


class InvalidTransition(RenderqError):
    """A request state change that the transition table does not allow."""


class UnknownRequest(RenderqError, KeyError):
    """A request id the scheduler has never seen."""


def not_a_file(what: str, path: object, is_folder: bool) -> str:
    """The message for a ``what`` (``"prompts file"``) at ``path`` that is no file to read."""
    return f"{what} {str(path)!r} {'is a folder, not a file' if is_folder else 'does not exist'}"
