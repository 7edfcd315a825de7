"""LoRA adapters as batch keys: a configured set, one active per batch, images as if alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from renderq.backends.adapters import adapter_label, parse_adapter_paths, parse_label
from renderq.backends.diffusers import DiffusersExecutor
from renderq.core.errors import ConfigError
from renderq.core.types import Batch, BatchKey, Request
from renderq.testing.tiny import build_tiny_lora

pytest.importorskip("peft")


def test_labels_round_trip_and_bad_ones_are_named() -> None:
    assert adapter_label("ink") == "ink" and adapter_label("ink", 0.8) == "ink@0.8"
    assert parse_label("ink@0.8") == ("ink", 0.8) and parse_label("ink") == ("ink", 1.0)
    with pytest.raises(ConfigError, match="'x'"):
        parse_label("ink@x")
    with pytest.raises(ConfigError, match="nan"):
        adapter_label("ink", float("nan"))
    assert parse_adapter_paths(["ink=/a", "neon=org/neon"]) == {"ink": "/a", "neon": "org/neon"}
    for bad in (["ink"], ["ink=/a", "ink=/b"], ["a@b=/c"]):
        with pytest.raises(ConfigError, match="--lora"):
            parse_adapter_paths(bad)


def test_the_adapter_is_part_of_the_key() -> None:
    base = BatchKey("m", 64, 64, 20, True, "DDIM", "fp32", "cpu")
    ink = BatchKey("m", 64, 64, 20, True, "DDIM", "fp32", "cpu", adapter="ink")
    assert base != ink and hash(base) != hash(ink) and ink.label().endswith("|lora:ink")


@pytest.fixture(scope="module")
def with_adapters(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> DiffusersExecutor:
    root = tmp_path_factory.mktemp("loras")
    paths = {
        name: str(build_tiny_lora(root / name, tiny_model, seed=seed))
        for name, seed in (("ink", 1), ("neon", 2))
    }
    return DiffusersExecutor.load(str(tiny_model), name="tiny-sd", adapters=paths)


def _batch(ex: DiffusersExecutor, adapter: str, seeds: list[int], bid: int) -> Batch:
    w, h = ex.default_size()
    key = BatchKey("tiny-sd", w, h, 3, True, ex.sampler, "fp32", ex.device_class, adapter=adapter)
    reqs = tuple(Request(f"{adapter}-{s}", "a red circle", key, base_seed=s) for s in seeds)
    return Batch(bid, key, reqs, 0.0, len(reqs))


@pytest.mark.slow
def test_each_image_is_its_adapters_image_alone(with_adapters: DiffusersExecutor) -> None:
    ex = with_adapters
    # One job's worth of keys in the order a scheduler might cut them.
    ink2 = ex.run(_batch(ex, "ink", [1, 2], 1))
    neon = ex.run(_batch(ex, "neon@0.5", [1], 2))
    plain = ex.run(_batch(ex, "", [1], 3))
    ink_alone = ex.run(_batch(ex, "ink", [1], 4))
    img = {name: r.items[0].image.astype(int) for name, r in
           (("ink", ink2), ("neon", neon), ("plain", plain), ("ink_alone", ink_alone))}  # fmt: skip
    assert np.abs(img["ink"] - img["ink_alone"]).max() <= 1  # batch-mates change nothing
    assert np.abs(img["ink"] - img["neon"]).mean() > 1  # the adapters really differ
    assert np.abs(img["ink"] - img["plain"]).mean() > 1
    assert np.abs(img["neon"] - img["plain"]).mean() > 1
    assert ex.lora.switches == 4 and ex.lora.switch_s > 0  # ink, neon, none, ink


@pytest.mark.slow
def test_an_unknown_adapter_is_refused_with_its_name(with_adapters: DiffusersExecutor) -> None:
    with pytest.raises(ConfigError, match=r"'sepia'.*ink, neon"):
        with_adapters.check_adapter("sepia@0.5")
    with_adapters.check_adapter("neon@0.5")
    with_adapters.check_adapter("")


@pytest.mark.slow
def test_a_job_with_two_adapters_renders_each_image_as_alone_with_its_own(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, with_adapters: DiffusersExecutor
) -> None:
    import json

    from PIL import Image

    from renderq.jobs.runner import run_job

    from .conftest import run_settings

    lines = [
        {"id": "a", "prompt": "a red circle", "seed": 1, "lora": "ink"},
        {"id": "b", "prompt": "a red circle", "seed": 2, "lora": "neon@0.5"},
        {"id": "c", "prompt": "a red circle", "seed": 3},
        {"id": "d", "prompt": "a blue square", "seed": 4, "lora": "ink"},
    ]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    paths = tuple(with_adapters.lora.paths.items())
    s = run_settings(prompts, tmp_path / "out", tiny_model, tiny_clip, threshold=-1.0,
                     steps=3, adapters=paths, mode="window")  # fmt: skip
    summary = run_job(s, executor=with_adapters)
    assert summary.accepted == 4
    meta = {
        r["id"]: r for r in map(json.loads, (s.out / "metadata.jsonl").read_text().splitlines())
    }
    assert {k: meta[k]["lora"] for k in "abcd"} == {
        "a": "ink",
        "b": "neon@0.5",
        "c": "",
        "d": "ink",
    }
    for x in lines:
        alone = with_adapters.run(_batch_of(with_adapters, x))
        want = alone.items[0].image.astype(int)
        got = np.asarray(Image.open(s.out / meta[x["id"]]["file_name"])).astype(int)
        assert np.abs(got - want).max() <= 1, x["id"]


def _batch_of(ex: DiffusersExecutor, line: dict[str, object]) -> Batch:
    w, h = ex.default_size()
    adapter = str(line.get("lora", ""))
    key = BatchKey("tiny-sd", w, h, 3, True, ex.sampler, "fp32", ex.device_class, adapter=adapter)
    req = Request("x", str(line["prompt"]), key, base_seed=int(str(line["seed"])))
    return Batch(9, key, (req,), 0.0, 1)


@pytest.mark.slow
def test_a_prompt_naming_an_unknown_adapter_is_refused_with_its_line(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, with_adapters: DiffusersExecutor
) -> None:
    from renderq.jobs.runner import run_job

    from .conftest import run_settings

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a red circle"}\n{"prompt": "a red circle", "lora": "sepia"}\n')
    s = run_settings(prompts, tmp_path / "out", tiny_model, tiny_clip,
                     adapters=tuple(with_adapters.lora.paths.items()))  # fmt: skip
    with pytest.raises(ConfigError, match=r"p\.jsonl:2: unknown LoRA adapter 'sepia'"):
        run_job(s, executor=with_adapters)
