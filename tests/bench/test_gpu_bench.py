"""The prepared SDXL GPU benchmark: its CPU run on a tiny SDXL, and its FLOP count."""

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

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "sdxl_bench.py"


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("sdxl_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_the_script_profiles_a_tiny_sdxl_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "sdxl.json"
    cmd = [sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--precision", "fp32",
           "--compile", "off", "--batches", "1,2", "--steps", "2", "--repeats", "1",
           "--json", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| batch | s/batch | s/image | images/s |" in done.stdout
    doc = json.loads(out.read_text())
    (run,) = doc["runs"]
    assert run["compile"] is False and run["warmup_s"] == 0.0
    assert [p["batch"] for p in run["points"]] == [1, 2]
    assert all(p["seconds"] > 0 for p in run["points"])
    assert doc["matmul_peak_flops"] > 0 and doc["size"] == 32


@pytest.mark.slow
def test_full_size_sdxl_costs_what_its_architecture_says() -> None:
    """Counted on meta tensors: 2.57 B UNet parameters, ~6.76 TFLOP a UNet step at 1024²."""
    mod = _module()
    unet, vae, te1, te2 = mod.build_sdxl("cpu", None, meta=True)
    assert sum(p.numel() for p in vae.parameters()) == 83_653_863
    assert sum(p.numel() for p in te1.parameters()) == 123_060_480
    assert sum(p.numel() for p in unet.parameters()) == 2_567_463_684
    assert sum(p.numel() for p in te2.parameters()) == 694_659_840
    per_step = (mod.flops_per_image(1024, 2, False) - mod.flops_per_image(1024, 1, False)) / 1e12
    assert per_step == pytest.approx(6.76, rel=0.01)
    # With guidance every step runs the UNet twice: 20 steps ~ 281 TFLOP an image.
    assert mod.flops_per_image(1024, 20, True) / 1e12 == pytest.approx(281, rel=0.01)
