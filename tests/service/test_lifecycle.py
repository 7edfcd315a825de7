"""Graceful shutdown and restart, the dashboard in a real browser, and schemathesis."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.service.conftest import Server, start_server, write_config
from tests.service.test_service import wait_job

pytestmark = pytest.mark.slow


def test_sigterm_keeps_queued_bulk_work_and_a_restart_finishes_it(
    tmp_path: Path, models: tuple[Path, Path]
) -> None:
    cfg = write_config(tmp_path / "renderq.toml", tmp_path / "data", *models, max_batch_size=2)
    srv = start_server(cfg, tmp_path / "data", tmp_path / "server.log")
    prompts = [f"a large green square number {i}" for i in range(24)]
    with srv.client() as c:
        job_id = c.post("/v1/jobs", json={"prompts": prompts}).json()["id"]
        deadline = time.monotonic() + 120
        while c.get(f"/v1/jobs/{job_id}").json()["accepted"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    # SIGTERM: uvicorn shuts down gracefully, then re-raises the signal (exit -15).
    assert srv.stop() in (0, -15)
    assert "drained;" in (tmp_path / "server.log").read_text()
    job_dir = tmp_path / "data" / "jobs" / job_id
    meta_lines = (job_dir / "metadata.jsonl").read_text().splitlines()
    assert 2 <= len(meta_lines) < 24, "the drain should leave queued work for the restart"

    again = start_server(cfg, tmp_path / "data", tmp_path / "server.log")
    try:
        with again.client() as c:
            done = wait_job(c, job_id, {"done"})
            assert done["accepted"] == 24 and done["pending"] == 0
    finally:
        again.stop()
    rows = [json.loads(line) for line in (job_dir / "metadata.jsonl").read_text().splitlines()]
    ids = [r["id"] for r in rows]
    assert sorted(ids) == [f"p{i:06d}" for i in range(24)]  # none missing, none twice
    assert len(set(r["file_name"] for r in rows)) == 24
    assert len(list((job_dir / "images").glob("*.png"))) == 24


def test_no_tokens_means_loopback_only(tmp_path: Path, models: tuple[Path, Path]) -> None:
    cfg = tmp_path / "open.toml"
    text = write_config(cfg, tmp_path / "data", *models).read_text()
    cfg.write_text(text.split("[auth]")[0])
    srv = start_server(cfg, tmp_path / "data", tmp_path / "server.log", host="0.0.0.0")
    try:
        with srv.client(token=None) as c:
            r = c.post("/v1/images/generations", json={"prompt": "a red circle"})
            assert r.status_code == 200
    finally:
        srv.stop()
    log = (tmp_path / "server.log").read_text()
    assert "binding 127.0.0.1 instead of '0.0.0.0'" in log and "no auth (loopback only)" in log


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (make test installs Debian's chromium)")
    return exe


def test_dashboard_shows_live_numbers_in_headless_chromium(server: Server, tmp_path: Path) -> None:
    exe = chromium()
    with server.client() as c:
        for _ in range(2):
            assert (
                c.post("/v1/images/generations", json={"prompt": "a red circle"}).status_code == 200
            )
        served = c.get("/v1/stats").json()["served"]
    url = f"{server.url}/#token=token-alpha"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=4000"]  # fmt: skip
    dom = subprocess.run([exe, *flags, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120).stdout  # fmt: skip
    assert '<span id="status" class="">ready</span>' in dom, dom[:2000]
    served_shown = int(dom.split('id="served">')[1].split("<")[0])
    assert served_shown >= served >= 2
    assert "last: " in dom and 'id="l-render">0.000' not in dom
    shot = tmp_path / "dashboard.png"
    subprocess.run([exe, *flags, f"--screenshot={shot}", "--window-size=1200,900", url],
                   capture_output=True, timeout=120, check=True)  # fmt: skip
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_schemathesis_finds_no_server_errors(server: Server) -> None:
    exe = str(Path(sys.executable).with_name("schemathesis"))
    proc = subprocess.run(
        [exe, "run", f"{server.url}/openapi.json", "--checks", "not_a_server_error",
         "--max-examples", "15", "--header", "Authorization: Bearer token-alpha",
         "--request-timeout", "60", "--seed", "1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    found = re.search(r"(\d+) generated, (\d+) passed", proc.stdout)
    assert found and int(found[1]) >= 50 and found[1] == found[2], proc.stdout[-2000:]


def test_sigterm_keeps_the_socket_open_answering_503_draining_while_batches_finish(
    tmp_path: Path, models: tuple[Path, Path]
) -> None:
    import threading

    import httpx

    cfg = write_config(tmp_path / "renderq.toml", tmp_path / "data", *models,
                       max_batch_size=2, max_steps=200)  # fmt: skip
    srv = start_server(cfg, tmp_path / "data", tmp_path / "server.log")
    answers: list[int] = []
    body = {"prompt": "a red circle", "n": 2, "steps": 200, "qa": False}

    def call() -> None:
        with srv.client() as c:
            answers.append(c.post("/v1/images/generations", json=body).status_code)

    callers = [threading.Thread(target=call) for _ in range(4)]
    try:
        for t in callers:
            t.start()
        with srv.client() as c:  # wait until all 8 images are admitted and a batch runs
            deadline = time.monotonic() + 60
            while True:
                st = c.get("/v1/stats").json()
                if st["running_batches"] and st["queued"] + 2 * st["running_batches"] >= 8:
                    break
                assert time.monotonic() < deadline, f"the calls were never all admitted: {st}"
                time.sleep(0.02)
            srv.proc.send_signal(signal.SIGTERM)
            ready = c.get("/readyz")
            assert ready.status_code == 503 and ready.json()["error"] == "draining", ready.text
            late = c.post("/v1/images/generations", json={"prompt": "a blue square"})
            assert late.status_code == 503 and late.json()["error"] == "draining", late.text
            assert srv.proc.poll() is None, "the server stopped before its batches finished"
        for t in callers:
            t.join(timeout=120)
        assert answers == [200] * 4, answers  # admitted before the signal: all answered
        assert srv.proc.wait(timeout=60) in (0, -15)
        with pytest.raises(httpx.ConnectError):
            httpx.get(srv.url + "/readyz", timeout=2)
    finally:
        srv.stop(signal.SIGKILL)


def test_serve_runs_torch_on_the_configured_threads_and_prints_the_port_bound(
    tmp_path: Path, models: tuple[Path, Path]
) -> None:
    # torch's default (a thread per core) made the render's thread team wait on the event
    # loop's and other work's time slices: overload cost a third of the device.
    cfg = write_config(tmp_path / "renderq.toml", tmp_path / "data", *models, threads=1)
    srv = start_server(cfg, tmp_path / "data", tmp_path / "server.log")
    srv.stop()
    log = (tmp_path / "server.log").read_text()
    port = srv.url.rsplit(":", 1)[1]
    assert "on cpu (1 torch thread)" in log and f"listening on http://127.0.0.1:{port}" in log
    # Library start-up noise is silenced, as in ``renderq run``.
    assert "Loading pipeline components" not in log and "Loading weights" not in log
