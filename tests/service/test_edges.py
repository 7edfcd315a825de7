"""The service's HTTP edges on the null model, over a real socket (uvicorn in a thread)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")
import uvicorn

from renderq.core.errors import ConfigError
from renderq.core.settings import INTERACTIVE, ModelSpec, QASettings
from renderq.service.app import create_app
from renderq.service.config import ServiceConfig, load_config
from renderq.service.render import RenderService
from renderq.service.server import DrainingServer
from tests.service.test_service import wait_job

TOKENS = {"tok-a": "team-a", "tok-b": "team-b", "tok-ops": "ops"}


class Live:
    """A service on a loopback port, served by uvicorn on a thread of this process."""

    def __init__(self, cfg: ServiceConfig, ready_s: float = 60) -> None:
        self.service = RenderService(cfg)
        config = uvicorn.Config(create_app(self.service), host="127.0.0.1", port=0,
                                log_level="warning", lifespan="on")  # fmt: skip
        self.server = DrainingServer(config, self.service, drain_s=30)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + ready_s
        while not (self.server.started and self.service.ready.is_set()):
            assert time.monotonic() < deadline, f"not up: {self.service.load_error}"
            time.sleep(0.02)
        sock = self.server.servers[0].sockets[0]
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    def client(self, token: str | None = "tok-a") -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


@pytest.fixture()
def live(tmp_path: Path) -> Iterator[Live]:
    cfg = ServiceConfig(
        spec=ModelSpec("null"), data_dir=tmp_path, batching=replace(INTERACTIVE, max_batch_size=4),
        tokens=TOKENS, admin_tenants=("ops",), tenant_max_queued=4, max_body_bytes=4096,
    )  # fmt: skip
    srv = Live(cfg)
    yield srv
    srv.stop()


def gen(c: httpx.Client, **body: Any) -> httpx.Response:
    return c.post("/v1/images/generations", json={"prompt": "a red circle", "qa": False, **body})


def test_n_that_can_never_fit_the_tenant_limit_is_400_not_429(live: Live) -> None:
    with live.client() as c:
        r = gen(c, n=5)
        assert r.status_code == 400, r.text
        assert r.json()["error"] == "invalid_request" and "n=5" in r.json()["detail"]
        assert "retry-after" not in r.headers
        assert gen(c, n=4).status_code == 200


def test_seeds_counting_past_the_largest_are_a_400_naming_the_seed(live: Live) -> None:
    top = 2**63 - 1
    with live.client() as c:
        r = gen(c, n=2, seed=top)
        assert r.status_code == 400, r.text
        assert r.json()["error"] == "invalid_request"
        assert f"{top + 1} (seed {top} + index 1) is above the largest seed" in r.json()["detail"]
        ok = gen(c, n=2, seed=top - 1)
        assert ok.status_code == 200 and [d["seed"] for d in ok.json()["data"]] == [top - 1, top]
        # A bulk job's per-prompt seeds come from the same rule: base + index unless given.
        r = c.post("/v1/jobs", json={"prompts": ["a", {"prompt": "b", "seed": 5}, "c"], "seed": 9})
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        wait_job(c, job, {"done"}, timeout=60)
        images = c.get(f"/v1/jobs/{job}/images").json()["data"]
        assert sorted((i["prompt"], i["seed"]) for i in images) == [("a", 9), ("b", 5), ("c", 11)]


@pytest.mark.parametrize(
    ("content", "needle"),
    [(b'{"prompt": "a red \xff circle"}', "UTF-8"), (b'{"prompt": ', "JSON")],
)
def test_body_parse_errors_answer_in_renderqs_error_shape(
    live: Live, content: bytes, needle: str
) -> None:
    with live.client() as c:
        r = c.post("/v1/images/generations", content=content,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code in (400, 422), r.text
    body = r.json()
    assert body["error"] == "invalid_request" and needle in body["detail"] + str(body)
    assert isinstance(body["detail"], str)


def test_unknown_routes_and_methods_answer_in_renderqs_error_shape(live: Live) -> None:
    with live.client() as c:
        assert c.get("/v1/nope").json() == {"error": "not_found", "detail": "Not Found"}
        r = c.put("/v1/images/generations")
        assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"


def test_a_body_over_the_limit_is_413_too_large(live: Live) -> None:
    big = {"prompts": [f"a red circle number {i}" for i in range(400)]}
    with live.client() as c:
        r = c.post("/v1/jobs", json=big)
        assert r.status_code == 413, r.text
        assert r.json()["error"] == "too_large" and "4096 bytes" in r.json()["detail"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: read up to the limit only
            yield b'{"prompt": "'
            for _ in range(10):
                yield b"x" * 1000
            yield b'"}'

        r = c.post("/v1/images/generations", content=chunks(),
                   headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 413 and r.json()["error"] == "too_large"
        # A small chunked body still goes through.
        small = iter([b'{"prompt": "a red circle", ', b'"qa": false}'])
        r = c.post("/v1/images/generations", content=small,
                   headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 200, r.text


def test_stats_show_a_tenant_only_its_own_numbers_and_an_admin_all(live: Live) -> None:
    with live.client("tok-a") as a, live.client("tok-b") as b, live.client("tok-ops") as ops:
        for _ in range(3):
            assert gen(a).status_code == 200
        assert gen(b).status_code == 200
        sa, sb, so = (x.get("/v1/stats").json() for x in (a, b, ops))
    assert sa["scope"] == "team-a" and sa["served"] == 3 and "tenants" not in sa
    assert sb["scope"] == "team-b" and sb["served"] == 1
    assert sb["ledger"]["device_seconds"]["render"] < so["ledger"]["device_seconds"]["render"]
    assert so["scope"] == "all" and so["served"] == 4
    assert so["tenants"]["team-a"]["served"] == 3 and so["tenants"]["team-b"]["served"] == 1


def test_an_admin_tenant_without_a_token_is_refused() -> None:
    with pytest.raises(ConfigError, match="admin_tenants 'ops' have no token"):
        ServiceConfig(spec=ModelSpec("null"), tokens={"t": "team-a"}, admin_tenants=("ops",))


def test_a_profile_setting_is_refused_as_the_service_does_not_read_one(tmp_path: Path) -> None:
    cfg = tmp_path / "renderq.toml"
    cfg.write_text('model = "null"\nprofile = "profile.json"\n')
    with pytest.raises(ConfigError, match="does not read a profile"):
        load_config(cfg, env={})


def test_the_deadline_reserve_is_read_from_limits_and_a_bad_one_named(tmp_path: Path) -> None:
    cfg = tmp_path / "renderq.toml"
    assert ServiceConfig().deadline_reserve_s == 0.0
    cfg.write_text('model = "null"\n[limits]\ndeadline_reserve_s = 0.25\n')
    assert load_config(cfg, env={}).deadline_reserve_s == 0.25
    cfg.write_text('model = "null"\n[limits]\ndeadline_reserve_s = -1\n')
    with pytest.raises(ConfigError, match=r"deadline_reserve_s must be in \[0, 3600\) .*got -1"):
        load_config(cfg, env={})


def test_the_config_file_fills_the_shared_settings_and_names_a_bad_value(tmp_path: Path) -> None:
    cfg = tmp_path / "renderq.toml"
    cfg.write_text(
        'threshold = 0.3\n[model]\nmodel = "null"\nprecision = "bf16"\nguidance = 4.0\n'
        "[batching]\nmax_batch_size = 4\nscore_batch_size = 16\nmax_attempts = 2\n"
    )
    got = load_config(cfg, env={}, max_queue_delay_s=0.2)
    assert got.spec == ModelSpec("null", precision="bf16", guidance=4.0)
    assert got.batching == replace(INTERACTIVE, max_batch_size=4, score_batch_size=16,
                                   max_queue_delay_s=0.2)  # fmt: skip
    assert got.qa == QASettings(0.3, max_attempts=2)
    assert got.render_cap == 4
    cfg.write_text('model = "null"\nmode = "window"\n')  # dynamic or step: callers wait
    with pytest.raises(ConfigError, match=r"mode must be 'dynamic' or 'step'.*'window'"):
        load_config(cfg, env={})
    cfg.write_text('model = "null"\nmax_attempts = 0\n')
    with pytest.raises(ConfigError, match="max-attempts must be >= 1, got 0"):
        load_config(cfg, env={})
    with pytest.raises(ConfigError, match=r"mode must be 'dynamic' or 'step'"):
        ServiceConfig(batching=replace(INTERACTIVE, mode="window"))


def test_readyz_says_draining_once_a_drain_began(live: Live) -> None:
    live.service.begin_drain()
    with live.client() as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["error"] == "draining"
        r = gen(c)
        assert r.status_code == 503 and r.json()["error"] == "draining"


def test_port_0_prints_the_port_bound(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    srv = Live(ServiceConfig(spec=ModelSpec("null"), data_dir=tmp_path))
    try:
        port = int(srv.url.rsplit(":", 1)[1])
        assert port != 0
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        srv.stop()
    assert f"listening on http://127.0.0.1:{port}" in capfd.readouterr().err


def test_serve_help_names_the_token_variable_and_draining() -> None:
    from typer.testing import CliRunner

    from renderq.cli.main import app

    done = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert "RENDERQ_API_TOKENS" in text and "503 draining" in text and "--threads" in text
