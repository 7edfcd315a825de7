"""What T5 prompt-length buckets save on SD3 and Flux: FLOPs at full size, time on tiny pipelines.

SD3 and Flux pad every T5 prompt to ``max_sequence_length`` (256 and 512); renderq renders
each prompt at the smallest bucket (64, 128, 256, 512) that holds it. This script prints:

1. **Full size, counted** (no weights, no download): SD3-medium's and Flux-dev's
   transformers and the T5-XXL encoder built on the meta device from the configs in
   ``t5/`` (the CLIP towers from ``gpu/sdxl/``, the same CLIP-L and OpenCLIP bigG-14), FLOPs
   counted with ``torch.utils.flop_counter`` at 1024x1024 per bucket: one transformer
   pass, one T5 encoding, a whole image (SD3: 28 steps with CFG, two transformer passes
   a step, the negative prompt encoded too; Flux-dev: 28 steps, one pass; both with their
   CLIP encodings and the VAE decode), and the share saved against the pipeline's default
   padding. SD3's joint transformer reads CLIP's 77 tokens and the T5 tokens as text
   tokens; Flux's reads the T5 tokens only.
2. **Tiny pipelines, timed**: ``renderq.testing.tiny`` SD3 and Flux rendered through
   ``DiffusersExecutor`` (the bucket -> ``max_sequence_length`` path of ``renderq run``) at
   the size whose image-token count is the full-size one (64 x 64 patches: 4096), every
   bucket in each round (the order rotating), split into T5, transformer and the rest
   (medians of the rounds); each bucket's time against the default padding is the median of
   the rounds' ratios (one round's renders follow each other, so a slow spell of a shared
   machine weighs on both), beside the same ratio of the tiny config's counted FLOPs.
3. **Does the padding change the image?** The same seed and prompt at each bucket against
   the default padding (max abs pixel difference, 0-255). Random weights give no pass
   rate; that needs the real weights and a real CLIP (see docs/benchmarks.md).
4. **CLIP-77 pipelines**: the tiny SD pipeline's bucket is 0 (one bucket) for any prompt.

    python benchmarks/t5_buckets.py --json t5.json
    python benchmarks/t5_buckets.py --steps 2 --repeats 1 --size 32   # quick

Config sources (the keys that shape the layers, each value checked against the text of the
published ``config.json``, as quoted in public code):
``t5/sd3_transformer.json``: stabilityai/stable-diffusion-3-medium-diffusers,
transformer/config.json (2.03 B parameters); ``t5/flux_transformer.json``:
black-forest-labs/FLUX.1-dev, transformer/config.json (11.9 B); ``t5/t5_xxl.json``: the
T5 v1.1 XXL encoder both ship (SD3 text_encoder_3/, Flux text_encoder_2/config.json,
4.76 B); ``t5/vae.json``: SD3's vae/config.json (Flux-dev's VAE has the same layers, only
its scaling and shift factors differ, which cost no FLOPs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROMPT = "a red fox in snow at dawn"  # 20 T5 tokens with the tiny character-level tokenizer
#: Per family: steps and CFG passes of the published defaults, and the T5 default padding.
FULL = {"sd3": dict(steps=28, passes=2, limit=256), "flux": dict(steps=28, passes=1, limit=512)}
GUIDANCE = {"sd3": 7.0, "flux": 3.5}


def count(fn: Any) -> float:
    """FLOPs of ``fn()`` (matmuls, convolutions, attention), counted op by op."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        fn()
    return float(counter.get_total_flops())


def full_size_parts(arch: str) -> dict[str, Any]:
    """Full-size transformer, T5-XXL, CLIP towers and VAE on the meta device."""
    import torch
    import transformers as tf
    from diffusers import AutoencoderKL, FluxTransformer2DModel, SD3Transformer2DModel

    def cfg(path: Path) -> dict[str, Any]:
        return dict(json.loads(path.read_text()))

    with torch.device("meta"):
        t5 = tf.T5EncoderModel(tf.T5Config(**cfg(HERE / "t5" / "t5_xxl.json")))
        clip_l = tf.CLIPTextConfig(**cfg(HERE / "gpu" / "sdxl" / "text_encoder.json"))
        vae = AutoencoderKL.from_config(cfg(HERE / "t5" / "vae.json"))
        if arch == "sd3":
            model = SD3Transformer2DModel.from_config(cfg(HERE / "t5" / "sd3_transformer.json"))
            clip_g = tf.CLIPTextConfig(**cfg(HERE / "gpu" / "sdxl" / "text_encoder_2.json"))
            clips = [tf.CLIPTextModelWithProjection(c) for c in (clip_l, clip_g)]
        else:
            model = FluxTransformer2DModel.from_config(cfg(HERE / "t5" / "flux_transformer.json"))
            clips = [tf.CLIPTextModel(clip_l)]
    return {"transformer": model, "t5": t5, "clips": clips, "vae": vae}


def pipeline_parts(pipe: Any, arch: str, meta: bool = False) -> dict[str, Any]:
    """The same parts of a loaded pipeline, or (``meta``) copies of them on the meta device.

    FLOPs are counted on the copies: torch's counter has no formula for the CPU's fused
    attention kernel and would count a CPU model's attention as zero.
    """
    import torch
    from diffusers import ModelMixin

    def copy(m: Any) -> Any:
        if not meta:
            return m
        with torch.device("meta"):
            return type(m).from_config(m.config) if isinstance(m, ModelMixin) else type(m)(m.config)

    names = ["text_encoder", "text_encoder_2"] if arch == "sd3" else ["text_encoder"]
    t5 = pipe.text_encoder_3 if arch == "sd3" else pipe.text_encoder_2
    clips = [copy(getattr(pipe, n)) for n in names]
    return {"transformer": copy(pipe.transformer), "t5": copy(t5), "clips": clips,
            "vae": copy(pipe.vae)}  # fmt: skip


def transformer_flops(model: Any, arch: str, latent: int, t5_tokens: int) -> float:
    """One transformer pass over a ``latent`` x ``latent`` latent and ``t5_tokens`` of T5."""
    import torch

    c = model.config
    with torch.device(next(model.parameters()).device):
        t = torch.tensor([500.0])
        pooled = torch.zeros(1, c.pooled_projection_dim)
        if arch == "sd3":  # CLIP's 77 tokens and the T5 tokens, side by side
            x = torch.zeros(1, c.in_channels, latent, latent)
            text = torch.zeros(1, 77 + t5_tokens, c.joint_attention_dim)
            return count(lambda: model(x, text, pooled, t))
        n = (latent // 2) ** 2  # Flux packs 2x2 latent patches; its text is T5 alone
        x, text = torch.zeros(1, n, c.in_channels), torch.zeros(1, t5_tokens, c.joint_attention_dim)
        ids, txt_ids = torch.zeros(n, 3), torch.zeros(t5_tokens, 3)
        g = torch.tensor([3.5]) if c.guidance_embeds else None
        return count(lambda: model(x, text, pooled, t / 1000, ids, txt_ids, g))


def encoder_flops(encoder: Any, tokens: int) -> float:
    """One text encoding of ``tokens`` tokens."""
    import torch

    ids = torch.zeros(1, tokens, dtype=torch.long, device=next(encoder.parameters()).device)
    return count(lambda: encoder(ids))


def bucket_flops(
    parts: dict[str, Any], arch: str, latent: int, buckets: list[int], steps: int, passes: int
) -> list[dict[str, Any]]:
    """Per bucket: FLOPs of a transformer pass, a T5 encoding, an image; share saved.

    An image is ``steps`` x ``passes`` transformer passes, ``passes`` encodings by every
    text encoder (with CFG the negative prompt is encoded too) and one VAE decode.
    """
    import torch

    vae = parts["vae"]
    with torch.device(next(vae.parameters()).device):
        z = torch.zeros(1, vae.config.latent_channels, latent, latent)
    clips = sum(encoder_flops(c, 77) for c in parts["clips"])
    fixed = passes * clips + count(lambda: vae.decode(z))
    rows = []
    for b in buckets:
        one = transformer_flops(parts["transformer"], arch, latent, b)
        t5 = encoder_flops(parts["t5"], b)
        text = b + (77 if arch == "sd3" else 0)
        image = steps * passes * one + passes * t5 + fixed
        rows.append(dict(bucket=b, text_tokens=text, t5=t5, image=image, **{"pass": one}))
    for r in rows:
        r["saved"] = 1.0 - r["image"] / rows[-1]["image"]
    return rows


def predict(size: int = 1024) -> dict[str, Any]:
    """The full-size FLOP tables of SD3-medium and Flux-dev."""
    out = {}
    for arch, spec in FULL.items():
        buckets = [e for e in (64, 128, 256, 512) if e <= spec["limit"]]
        out[arch] = bucket_flops(
            full_size_parts(arch), arch, size // 8, buckets, spec["steps"], spec["passes"]
        )
    return out


class PartTimer:
    """Seconds spent in a module's forward calls, through forward hooks."""

    def __init__(self, module: Any) -> None:
        self.seconds, self._start = 0.0, 0.0
        module.register_forward_pre_hook(lambda *_: setattr(self, "_start", time.perf_counter()))
        module.register_forward_hook(lambda *_: self._add())

    def _add(self) -> None:
        self.seconds += time.perf_counter() - self._start

    def take(self) -> float:
        """The seconds since the last take."""
        s, self.seconds = self.seconds, 0.0
        return s


def tiny_executor(arch: str, root: Path) -> Any:
    """A tiny random pipeline of ``arch`` (sd, sd3, flux), loaded by the executor."""
    from renderq.backends.diffusers import DiffusersExecutor
    from renderq.testing import tiny

    build = dict(sd=tiny.build_tiny_pipeline, sd3=tiny.build_tiny_sd3, flux=tiny.build_tiny_flux)
    return DiffusersExecutor.load(str(build[arch](root / arch)), name=f"tiny-{arch}")


def render(ex: Any, bucket: int, size: int, steps: int, guidance: float, seed: int) -> Any:
    """One image of :data:`PROMPT` at ``bucket``; returns (pixels, seconds)."""
    from renderq.core.settings import key_for
    from renderq.core.types import Batch, Request

    key = key_for(
        ex.model, size, size, steps, guidance, ex.sampler, ex.precision, ex.device_class, bucket
    )
    req = Request("r", PROMPT, key, base_seed=seed, guidance_scale=guidance)
    result = ex.run(Batch(0, key, (req,), 0.0, 1))
    if not result.items[0].ok:
        raise RuntimeError(f"bucket {bucket}: {result.items[0].error}")
    return result.items[0].image, float(result.device_seconds)


def measure_tiny(
    arch: str, root: Path, size: int | None, steps: int, repeats: int
) -> dict[str, Any]:
    """Time every bucket on the tiny ``arch`` pipeline, rounds interleaved; FLOPs beside."""
    import numpy as np

    ex = tiny_executor(arch, root)
    pipe, limit = ex.pipeline, ex.rules.t5_limit()
    size = size or 64 * ex.size_multiple  # 64 x 64 patches: 4096 image tokens, as at 1024²
    buckets = [e for e in (64, 128, 256, 512) if e < limit] + [limit]
    parts = pipeline_parts(pipe, arch)
    t5_timer, tr_timer = PartTimer(parts["t5"]), PartTimer(parts["transformer"])
    guidance, passes = GUIDANCE[arch], FULL[arch]["passes"]
    times: dict[int, list[tuple[float, float, float]]] = {b: [] for b in buckets}
    images: dict[int, list[Any]] = {b: [] for b in buckets}
    for b in buckets:  # warm-up: first calls allocate
        render(ex, b, size, steps, guidance, seed=7)
    t5_timer.take(), tr_timer.take()
    for r in range(repeats):
        for b in buckets[r % len(buckets) :] + buckets[: r % len(buckets)]:
            image, secs = render(ex, b, size, steps, guidance, seed=7)
            times[b].append((secs, t5_timer.take(), tr_timer.take()))
            images[b].append(np.asarray(image, dtype=np.int16))
    latent = size // int(pipe.vae_scale_factor)
    flops = bucket_flops(
        pipeline_parts(pipe, arch, meta=True), arch, latent, buckets, steps, passes
    )
    rows = []
    for f in flops:
        b = f["bucket"]
        total, t5, tr = (statistics.median(x[i] for x in times[b]) for i in range(3))
        first = images[b][0]
        again = max(int(np.abs(i - first).max()) for i in images[b])
        rows.append(dict(f, seconds=total, t5_s=t5, transformer_s=tr, other_s=total - t5 - tr,
                         runs=[x[0] for x in times[b]], repeat_px_diff=again,
                         max_px_diff=int(np.abs(first - images[limit][0]).max())))  # fmt: skip
    for r in rows:  # each round's ratio to the default padding, then the median of rounds:
        # a round runs every bucket back to back, so a slow spell weighs on both sides
        pairs = list(zip(times[r["bucket"]], times[limit], strict=True))
        r["time_ratio"] = statistics.median(x[0] / d[0] for x, d in pairs)
        r["tr_time_ratio"] = statistics.median(x[2] / d[2] for x, d in pairs)
        r["flop_ratio"], r["tr_flop_ratio"] = 1 - r["saved"], r["pass"] / rows[-1]["pass"]
    return dict(arch=arch, size=size, steps=steps, repeats=repeats, guidance=guidance,
                image_tokens=(latent // 2) ** 2, prompt_bucket=ex.prompt_length(PROMPT).bucket,
                limit=limit, cpu_share=ex.timer.cpu_share(), rows=rows)  # fmt: skip


def clip77(root: Path) -> dict[str, Any]:
    """The tiny SD pipeline's buckets for a short and a long prompt (both 0: one bucket)."""
    ex = tiny_executor("sd", root)
    short, long = ex.prompt_length(PROMPT), ex.prompt_length(" ".join([PROMPT] * 6))
    return {"short": short.bucket, "long": long.bucket, "truncated": list(long.truncated)}


def report(full: dict[str, Any], tiny: list[dict[str, Any]], sd: dict[str, Any]) -> None:
    """Print the tables."""
    print("## Full size at 1024x1024, counted on meta tensors (TFLOP)")
    print("| model | T5 bucket | text tokens | transformer pass | T5 encoding | image | saved |")
    print("|---|---|---|---|---|---|---|")
    for arch, rows in full.items():
        for r in rows:
            print(
                f"| {arch} | {r['bucket']} | {r['text_tokens']} | {r['pass'] / 1e12:.2f} | "
                f"{r['t5'] / 1e12:.2f} | {r['image'] / 1e12:.1f} | {r['saved']:.1%} |"
            )
    for t in tiny:
        print(
            f"\n## tiny {t['arch']}, {t['size']}x{t['size']} ({t['image_tokens']} image tokens), "
            f"{t['steps']} steps, guidance {t['guidance']}, {t['repeats']} rounds; the prompt "
            f"({PROMPT!r}) is in bucket {t['prompt_bucket']}; CPU share "
            f"{t['cpu_share'] or 0:.2f}"
        )
        print(
            "| T5 bucket | s/image | T5 s | transformer s | other s | image: time / FLOPs vs "
            "default | transformer: time / FLOPs vs default | max px diff vs default | "
            "between repeats |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in t["rows"]:
            print(
                f"| {r['bucket']} | {r['seconds']:.3f} | {r['t5_s']:.3f} | "
                f"{r['transformer_s']:.3f} | {r['other_s']:.3f} | {r['time_ratio']:.3f} / "
                f"{r['flop_ratio']:.3f} | {r['tr_time_ratio']:.3f} / {r['tr_flop_ratio']:.3f} | "
                f"{r['max_px_diff']} | {r['repeat_px_diff']} |"
            )
    print(
        f"\ntiny SD (CLIP-77): prompt_bucket {sd['short']} for {PROMPT!r} and {sd['long']} for "
        f"it six times over (truncated: {'; '.join(sd['truncated']) or 'none'}): one bucket, "
        "nothing to gain"
    )


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, count, render, print, and write the JSON when asked."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="tiny pipelines' steps")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds over the buckets")
    ap.add_argument("--size", type=int, default=None, help="tiny image side (default: 4096 tokens)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    from renderq.backends.diffusers import quiet_libraries, set_cpu_threads

    quiet_libraries()
    set_cpu_threads(args.threads)
    full = predict()
    with tempfile.TemporaryDirectory(prefix="renderq-t5-") as tmp:
        root = Path(tmp)
        tiny = [measure_tiny(a, root, args.size, args.steps, args.repeats) for a in ("sd3", "flux")]
        sd = clip77(root)
    report(full, tiny, sd)
    if args.json is not None:
        args.json.write_text(json.dumps({"full": full, "tiny": tiny, "clip77": sd}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
