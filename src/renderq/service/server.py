"""uvicorn, with renderq's shutdown order: drain first, close the socket last.

uvicorn's own graceful shutdown stops listening at once, so during the drain new callers
and ``/readyz`` would get "connection refused" instead of the documented ``503 draining``.
:class:`DrainingServer` takes the first SIGTERM (or SIGINT) as "drain": admission stops
(every new request answers ``503 draining``), queued bulk prompts go back to their job
stores, running batches and admitted interactive requests finish, and only then does
uvicorn's shutdown begin. A second signal skips the wait.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any

import uvicorn

from renderq.service.render import RenderService


class DrainingServer(uvicorn.Server):
    """A uvicorn server that drains the service before it stops listening."""

    def __init__(self, config: uvicorn.Config, service: RenderService, drain_s: float) -> None:
        super().__init__(config)
        self.service = service
        self.drain_s = drain_s
        self._draining: threading.Thread | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First signal: drain, then shut down; a second one shuts down at once."""
        if self._draining is not None or self.should_exit:
            super().handle_exit(sig, frame)
            return
        self._draining = threading.Thread(
            target=self._drain_then_exit, args=(sig,), daemon=True, name="renderq-drain"
        )
        self._draining.start()

    def _drain_then_exit(self, sig: int) -> None:
        try:
            self.service.begin_drain()
            self.service.wait_idle(self.drain_s)
        finally:
            # uvicorn's handler only sets flags (its main loop polls them), so calling it
            # from this thread is safe.
            super().handle_exit(sig, None)

    async def startup(self, sockets: Any = None) -> None:
        """Start, then say where it listens (the port actually bound, also for port 0)."""
        await super().startup(sockets=sockets)
        for server in getattr(self, "servers", []):
            for sock in server.sockets or ():
                host, port = sock.getsockname()[:2]
                print(f"renderq serve: listening on http://{host}:{port}", file=sys.stderr,
                      flush=True)  # fmt: skip
