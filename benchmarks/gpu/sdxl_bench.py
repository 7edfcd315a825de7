"""SDXL at full size on one GPU, with random weights: images/s, s/image, share of the peak.

Builds SDXL base 1.0's UNet, VAE and both text encoders from the configs beside this file
(``sdxl/*.json``: the published architecture, 2.57 B UNet parameters) with random
weights, directly on the device, so nothing is downloaded: the arithmetic of random
weights is the arithmetic of the real model. Then it profiles the pipeline through the
executor ``renderq run`` uses and the measurement ``renderq profile`` uses
(``renderq.bench.profiling.measure``: rounds over the batch sizes, median of repeats) at each
batch size, with and without ``torch.compile``, and
prints per batch size: seconds per batch, seconds per image, images per second, peak
memory, and the achieved share of the device's bf16 matmul rate measured in the same run.

    python benchmarks/gpu/sdxl_bench.py                     # H100/H200: 1024², 20 steps, CFG
    python benchmarks/gpu/sdxl_bench.py --compile off --batches 1,8
    python benchmarks/gpu/sdxl_bench.py --tiny              # a tiny SDXL on the CPU (the test)

The FLOPs per image are counted, not assumed: ``torch.utils.flop_counter`` over one UNet
forward, one VAE decode and both text encoders on meta tensors (no memory, no compute);
one image costs (2 with CFG, else 1) x steps x UNet + VAE + encoders. Compile warm-up is
excluded from every timing and reported apart.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).resolve().parent / "sdxl"
MODEL = "sdxl-base-1.0-random-weights"
PROMPTS = (
    "a photograph of an astronaut riding a horse on the moon, highly detailed",
    "a watercolor painting of a lighthouse at dawn, soft light",
    "a red vintage car parked in front of a bakery, street photography",
)


def build_sdxl(device: str, dtype: Any, meta: bool = False) -> Any:
    """The full-size SDXL pipeline from the configs, random weights, on ``device``."""
    import torch
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    from renderq.testing.tiny import char_tokenizer

    def cfg(name: str) -> dict[str, Any]:
        return dict(json.loads((CONFIGS / f"{name}.json").read_text()))

    torch.manual_seed(0)
    with torch.device("meta" if meta else device):
        unet = UNet2DConditionModel.from_config(cfg("unet"))
        vae = AutoencoderKL.from_config(cfg("vae"))
        te1 = CLIPTextModel(CLIPTextConfig(**cfg("text_encoder")))
        te2 = CLIPTextModelWithProjection(CLIPTextConfig(**cfg("text_encoder_2")))
    if meta:
        return unet, vae, te1, te2
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=te1,
        text_encoder_2=te2,
        # A character-level tokenizer: ids are valid for the 49,408-row embeddings, and
        # every prompt is padded to 77 tokens, as with the real tokenizers.
        tokenizer=char_tokenizer(),
        tokenizer_2=char_tokenizer(),
        unet=unet,
        scheduler=EulerDiscreteScheduler.from_config(cfg("scheduler")),
    )
    # Random weights overflow fp16/bf16 in the VAE's upcast path no more than real ones.
    return pipe.to(device=device, dtype=dtype)


def flops_per_image(size: int, steps: int, cfg: bool) -> float:
    """FLOPs of one image, counted over meta tensors (full-size SDXL)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    unet, vae, te1, te2 = build_sdxl("cpu", torch.float32, meta=True)
    latent = size // 8
    with torch.device("meta"):
        ids = torch.zeros(1, 77, dtype=torch.long)
        sample = torch.zeros(1, 4, latent, latent)
        text = torch.zeros(1, 77, 2048)
        added = {"text_embeds": torch.zeros(1, 1280), "time_ids": torch.zeros(1, 6)}
        counts = []
        for fn in (
            lambda: unet(sample, torch.tensor([500.0]), text, added_cond_kwargs=added),
            lambda: vae.decode(sample),
            lambda: te1(ids),
            lambda: te2(ids),
        ):
            counter = FlopCounterMode(display=False)
            with counter:
                fn()
            counts.append(float(counter.get_total_flops()))
    unet_f, vae_f, te1_f, te2_f = counts
    return (2 if cfg else 1) * steps * unet_f + vae_f + te1_f + te2_f


def matmul_peak(device: str, dtype: Any, n: int = 8192, reps: int = 50) -> float:
    """FLOP/s of a large square matmul in ``dtype``: the device's practical peak."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return 2 * n**3 * reps / (time.perf_counter() - start)


def batch_timer(executor: Any, size: int, steps: int, guidance: float) -> Any:
    """Device-seconds of one batch of ``n`` through the executor ``renderq run`` uses."""
    from renderq.core.settings import key_for
    from renderq.core.types import Batch, Request

    key = key_for(MODEL, size, size, steps, guidance, executor.sampler, executor.precision,
                  executor.device_class)  # fmt: skip
    seeds = iter(range(1 << 62))

    def render(n: int) -> float:
        reqs = tuple(
            Request(
                f"p{i}",
                PROMPTS[i % len(PROMPTS)],
                key,
                base_seed=next(seeds),
                guidance_scale=guidance,
            )
            for i in range(n)
        )
        result = executor.run(Batch(0, key, reqs, 0.0, n))
        if result.fitted_cap is not None:
            raise MemoryError(f"a batch of {n} ran out of memory (fitted {result.fitted_cap})")
        return float(result.device_seconds)

    return render


def peak_probe(device: str) -> Any:
    """Peak device memory since the last reading (CUDA), or None (CPU)."""
    import torch

    if not device.startswith("cuda"):
        return lambda: None

    def read() -> float:
        peak = float(torch.cuda.max_memory_allocated(device))
        torch.cuda.reset_peak_memory_stats(device)
        return peak

    return read


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Profile every asked-for setting; returns the figures it printed."""
    import torch

    from renderq.backends.diffusers import DiffusersExecutor, is_oom, quiet_libraries, torch_dtype
    from renderq.bench.profiling import measure

    quiet_libraries()
    dtype = torch_dtype(args.precision)
    batches = [int(b) for b in args.batches.split(",")]
    modes = {"both": [False, True], "on": [True], "off": [False]}[args.compile]
    if args.tiny:
        from diffusers import DiffusionPipeline

        from renderq.testing.tiny import build_tiny_sdxl

        folder = build_tiny_sdxl(Path(tempfile.mkdtemp(prefix="renderq-sdxl-")))
        pipe = DiffusionPipeline.from_pretrained(str(folder), torch_dtype=dtype).to(args.device)
        size = args.size or 32
        flops = None
        peak = matmul_peak(args.device, dtype, n=256, reps=5)
    else:
        size = args.size or 1024
        flops = flops_per_image(size, args.steps, args.guidance > 1.0)
        peak = matmul_peak(args.device, dtype)
        pipe = build_sdxl(args.device, dtype)
    pipe.set_progress_bar_config(disable=True)
    results: dict[str, Any] = {
        "device": args.device,
        "device_name": torch.cuda.get_device_name(args.device)
        if args.device.startswith("cuda")
        else "cpu",
        "precision": args.precision,
        "size": size,
        "steps": args.steps,
        "guidance": args.guidance,
        "flops_per_image": flops,
        "matmul_peak_flops": peak,
        "runs": [],
    }
    print(
        f"# {MODEL if not args.tiny else 'tiny SDXL'} on {results['device_name']}, "
        f"{args.precision}, {size}x{size}, {args.steps} steps, guidance {args.guidance}; "
        f"measured {args.precision} matmul peak {peak / 1e12:.3g} TFLOP/s"
        + (f"; {flops / 1e12:.1f} TFLOP per image" if flops else ""),
        flush=True,
    )
    for compiled in modes:
        executor = DiffusersExecutor(
            pipe, MODEL, device=args.device, precision=args.precision, compile=compiled,
            channels_last=args.channels_last,
        )  # fmt: skip
        points = measure(
            batch_timer(executor, size, args.steps, args.guidance),
            batches,
            repeats=args.repeats,
            warmup=1,
            peak_memory=peak_probe(args.device),
            is_oom=lambda exc: isinstance(exc, MemoryError) or is_oom(exc),
        )
        label = "compiled" if compiled else "eager"
        print(f"\n## {label} (compile warm-up {executor.warmup_s:.1f} s, excluded)")
        print("| batch | s/batch | s/image | images/s | peak GiB | share of matmul peak |")
        print("|---|---|---|---|---|---|")
        rows = []
        for pt in points:
            n, secs = pt.batch_size, pt.seconds
            share = flops * n / secs / peak if flops else None
            mem = "-" if pt.peak_bytes is None else f"{pt.peak_bytes / 2**30:.1f}"
            print(
                f"| {n} | {secs:.3f} | {secs / n:.3f} | {n / secs:.2f} | {mem} | "
                f"{'-' if share is None else f'{share:.1%}'} |",
                flush=True,
            )
            rows.append({"batch": n, "seconds": secs, "repeats": list(pt.repeats),
                         "peak_bytes": pt.peak_bytes, "share_of_peak": share})  # fmt: skip
        results["runs"].append({"compile": compiled, "warmup_s": executor.warmup_s, "points": rows})
        if compiled:
            torch._dynamo.reset()
    return results


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run, and write the JSON when asked."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--size", type=int, default=None, help="pixels a side (default 1024)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--guidance", type=float, default=5.0, help="> 1 turns CFG on")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--compile", choices=["both", "on", "off"], default="both")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="a tiny SDXL (CPU test of this script)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    results = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
