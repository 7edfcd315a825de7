"""Capture the step loops a command starts (``backends.step_loop.step_workers``)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest


def capture_step_loops(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The list every step loop started from now on is appended to."""
    from renderq.backends import step_loop

    loops: list[Any] = []
    step_workers = step_loop.step_workers

    @contextlib.contextmanager
    def capture(*args: Any, **kwargs: Any) -> Any:
        with step_workers(*args, **kwargs) as (loop, slots):
            loops.append(loop)
            yield loop, slots

    monkeypatch.setattr(step_loop, "step_workers", capture)
    return loops
