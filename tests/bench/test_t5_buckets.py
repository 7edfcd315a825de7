"""The T5 bucket measurement: full-size FLOP counts, tiny renders per bucket, CLIP-77."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("diffusers")
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "t5_buckets.py"


@pytest.fixture(scope="module")
def mod() -> Any:
    spec = importlib.util.spec_from_file_location("t5_buckets", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_full_size_models_have_their_published_sizes_and_cost_more_with_more_tokens(
    mod: Any,
) -> None:
    sd3, flux = mod.full_size_parts("sd3"), mod.full_size_parts("flux")
    size = {k: sum(p.numel() for p in m["transformer"].parameters()) for k, m in
            (("sd3", sd3), ("flux", flux))}  # fmt: skip
    assert size == {"sd3": 2_028_328_000, "flux": 11_901_408_320}
    assert sum(p.numel() for p in flux["t5"].parameters()) == 4_762_310_656
    flux_64, flux_512 = (
        mod.transformer_flops(flux["transformer"], "flux", 128, t) for t in (64, 512)
    )
    assert flux_512 > flux_64 * 1.1  # 4608 tokens against 4160, and attention grows faster
    t5 = [mod.encoder_flops(flux["t5"], t) for t in (64, 128, 256, 512)]
    assert t5 == sorted(t5) and t5[-1] > 7 * t5[0]  # about linear in the tokens


def test_the_counted_text_lengths_are_the_pipelines_own(mod: Any, tmp_path: Path) -> None:
    """SD3 feeds CLIP's 77 tokens and the T5 tokens to its transformer; Flux the T5 alone."""
    import torch

    for arch, clip in (("sd3", 77), ("flux", 0)):
        pipe = mod.tiny_executor(arch, tmp_path).pipeline
        # SD3 takes a third prompt and guidance on/off; Flux has neither.
        extra = {"prompt_3": None, "do_classifier_free_guidance": False} if arch == "sd3" else {}
        for bucket in (64, 128):
            with torch.inference_mode():
                embeds = pipe.encode_prompt(
                    prompt=mod.PROMPT, prompt_2=None, device="cpu", num_images_per_prompt=1,
                    max_sequence_length=bucket, **extra,
                )[0]  # fmt: skip
            assert embeds.shape[1] == clip + bucket


def test_the_tiny_count_includes_attention(mod: Any, tmp_path: Path) -> None:
    """Counted on meta copies: on the CPU, torch's counter sees no FLOPs in fused attention."""
    pipe = mod.tiny_executor("flux", tmp_path).pipeline
    c = pipe.transformer.config
    n = 64 * 64 + 512  # image tokens at 128x128 and T5 tokens at the default padding
    # QK^T and AV alone: 2 x 2 x n^2 x inner width, in each of the double and single blocks.
    attention = 4 * n**2 * c.num_attention_heads * c.attention_head_dim
    blocks = c.num_layers + c.num_single_layers
    meta = mod.pipeline_parts(pipe, "flux", meta=True)["transformer"]
    assert mod.transformer_flops(meta, "flux", 128, 512) > blocks * attention


def test_tiny_renders_come_back_at_every_bucket_and_the_script_prints_its_tables(
    tmp_path: Path,
) -> None:
    out = tmp_path / "t5.json"
    cmd = [sys.executable, str(SCRIPT), "--size", "32", "--steps", "1", "--repeats", "2",
           "--json", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "prompt_bucket 0 for 'a red fox in snow at dawn' and 0 for it" in done.stdout
    doc = json.loads(out.read_text())
    full = doc["full"]
    assert [r["bucket"] for r in full["sd3"]] == [64, 128, 256]
    assert [r["bucket"] for r in full["flux"]] == [64, 128, 256, 512]
    for rows in full.values():
        images = [r["image"] for r in rows]
        assert images == sorted(images) and rows[-1]["saved"] == 0.0 < rows[0]["saved"]
    # Flux pays for 512 padded tokens against SD3's 256: a short prompt saves more there.
    assert full["flux"][0]["saved"] > full["sd3"][0]["saved"]
    sd3, flux = doc["tiny"]
    assert (sd3["limit"], flux["limit"]) == (256, 512)
    for t in (sd3, flux):
        assert t["prompt_bucket"] == 64 and t["image_tokens"] == 16 * 16
        assert [r["bucket"] for r in t["rows"]][-1] == t["limit"]
        for r in t["rows"]:
            assert len(r["runs"]) == 2 and min(r["runs"]) > 0 and r["transformer_s"] > 0
            assert r["repeat_px_diff"] == 0  # the same seed renders the same image
        assert t["rows"][-1]["max_px_diff"] == 0
        # No attention mask over T5's padding: the padding length changes the image.
        assert t["rows"][0]["max_px_diff"] > 0
        flops = [r["pass"] for r in t["rows"]]
        assert flops == sorted(flops) and flops[0] < flops[-1]
    assert doc["clip77"]["short"] == doc["clip77"]["long"] == 0
    assert doc["clip77"]["truncated"]
