"""LoRA adapters in the service: configured in the TOML, named per request and per job.

A tiny SD pipeline with two seeded random adapters, served over a real socket: an
interactive request and a bulk job name an adapter, an unknown one is a 400 naming it,
and each image is the one the adapter gives alone (the adapter is part of the batch key).
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from renderq.core.settings import INTERACTIVE, ModelSpec, QASettings
from renderq.service.config import ServiceConfig, load_config
from renderq.testing import tiny
from tests.service.test_edges import Live

pytest.importorskip("peft")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lora_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Live, dict[str, str]]]:
    root = tmp_path_factory.mktemp("lora-serve")
    pipe = tiny.build_tiny_pipeline(root / "sd", sample_size=16)
    paths = {
        n: str(tiny.build_tiny_lora(root / n, pipe, seed=i)) for i, n in enumerate(["ink", "neon"])
    }
    # The adapters come from the config file's [lora] table, as a user writes it.
    toml = root / "renderq.toml"
    toml.write_text("[lora]\n" + "".join(f'{n} = "{p}"\n' for n, p in paths.items()))
    adapters = load_config(toml).spec.adapters
    assert dict(adapters) == paths
    spec = ModelSpec(
        str(pipe), str(tiny.build_tiny_clip(root / "clip")), steps=2, adapters=adapters
    )
    cfg = ServiceConfig(
        spec=spec, qa=QASettings(threshold=-1.0), data_dir=root / "data",
        batching=replace(INTERACTIVE, max_batch_size=4), max_steps=4,
    )  # fmt: skip
    live = Live(cfg, ready_s=180)
    yield live, paths
    live.stop()


def _image(data: dict[str, object]) -> np.ndarray:
    from PIL import Image

    raw = base64.b64decode(str(data["b64_json"]))
    return np.asarray(Image.open(io.BytesIO(raw))).astype(int)


def _one(c, **body: object) -> np.ndarray:  # type: ignore[no-untyped-def]
    r = c.post("/v1/images/generations", json={"prompt": "a red circle", "seed": 7, **body})
    assert r.status_code == 200, r.text
    return _image(r.json()["data"][0])


def test_a_request_names_an_adapter_and_gets_its_image(
    lora_live: tuple[Live, dict[str, str]],
) -> None:
    live, _ = lora_live
    with live.client() as c:
        plain, ink, neon = _one(c), _one(c, lora="ink"), _one(c, lora="neon@0.5")
        assert np.abs(ink - plain).mean() > 1 and np.abs(neon - ink).mean() > 1
        assert np.abs(_one(c, lora="ink") - ink).max() <= 1  # the same image again
        r = c.post("/v1/images/generations", json={"prompt": "a red circle", "lora": "sepia"})
        assert r.status_code == 400 and "'sepia'" in r.json()["detail"]
        assert "ink, neon" in r.json()["detail"]


def test_a_job_renders_with_its_adapter(lora_live: tuple[Live, dict[str, str]]) -> None:
    live, _ = lora_live
    with live.client() as c:
        r = c.post("/v1/jobs", json={"prompts": ["a red circle"], "seed": 7, "lora": "ink"})
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        deadline = time.monotonic() + 120
        while c.get(f"/v1/jobs/{job}").json()["state"] != "done":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        [img] = c.get(f"/v1/jobs/{job}/images").json()["data"]
        assert np.abs(_image(img) - _one(c, lora="ink")).max() <= 1
        r = c.post("/v1/jobs", json={"prompts": ["a red circle"], "lora": "sepia@2"})
        assert r.status_code == 400 and "'sepia'" in r.json()["detail"]


def test_a_model_without_adapters_refuses_a_lora(tmp_path: Path) -> None:
    cfg = ServiceConfig(spec=ModelSpec("null"), data_dir=tmp_path)
    live = Live(cfg)
    try:
        with live.client(None) as c:
            r = c.post("/v1/images/generations", json={"prompt": "a red circle", "lora": "ink"})
            assert r.status_code == 400 and "'ink'" in r.json()["detail"]
    finally:
        live.stop()
