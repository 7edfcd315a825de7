"""A real ``renderq serve`` process on a free loopback port, with tiny seeded models."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("diffusers")

from renderq.testing.tiny import build_tiny_clip, build_tiny_pipeline

TOKENS = {"token-alpha": "alpha", "token-beta": "beta"}


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running service: its URL, process and data folder."""

    url: str
    proc: subprocess.Popen[bytes]
    data: Path
    log: Path

    def client(self, token: str | None = "token-alpha", timeout: float = 120) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


def write_config(path: Path, data: Path, model: Path, clip: Path, **extra: object) -> Path:
    settings: dict[str, object] = {
        "data_dir": str(data), "model": str(model), "scorer": str(clip), "steps": 2,
        "threshold": -1.0, "max_batch_size": 4, "max_queue_delay_s": 0.05, **extra,
    }  # fmt: skip
    lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    lines += [
        "[auth]",
        "tokens = { " + ", ".join(f'"{t}" = "{n}"' for t, n in TOKENS.items()) + " }",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def start_server(config: Path, data: Path, log: Path, host: str = "127.0.0.1") -> Server:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RENDERQ_API_TOKENS": ""}
    exe = Path(sys.executable).with_name("renderq")
    with log.open("ab") as fh:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [str(exe), "serve", "--config", str(config), "--port", str(port), "--host", host],
            stdout=fh, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    server = Server(f"http://127.0.0.1:{port}", proc, data, log)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early:\n{log.read_text()}")
        try:
            if httpx.get(server.url + "/readyz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server never became ready:\n{log.read_text()}")


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("api-models")
    return build_tiny_pipeline(root / "sd", sample_size=16), build_tiny_clip(root / "clip")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, models: tuple[Path, Path]) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("api")
    cfg = write_config(root / "renderq.toml", root / "data", *models, max_n=4, max_steps=8,
                       tenant_max_queued=64)  # fmt: skip
    srv = start_server(cfg, root / "data", root / "server.log")
    yield srv
    srv.stop()
