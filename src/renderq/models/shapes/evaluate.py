"""Print every figure of the model card; ``--json PATH`` also writes them as JSON.

Figures: tiny-CLIP zero-shot colour/shape top-1 on held-out images; mini-SD oracle match
rate (whole prompt, and the earlier first-shape form) at the first seed and within four
seeds, for full and short prompts apart; the regeneration curve (the share of failed first
attempts each later seed fixes); the CLIP gate as a detector of failed images (recall,
specificity, balanced accuracy, AUC, with intervals, for one- and two-shape prompts
apart) at a threshold calibrated on other prompts; per-image render time at batch 1 and
at the best batch size (median of repeats).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from renderq.models.shapes import common, oracle, world
from renderq.models.shapes.build import DEFAULT_GUIDANCE, DEFAULT_STEPS
from renderq.models.shapes.vae_train import reconstruction_oracle_rate

HELD_OUT_SEED = 50_000
PROMPT_SEED = 60_000
CALIBRATION_SEED = 70_000
MAX_SEEDS = 4
GATE_RECALL_TARGET = 0.96
"""Recall the threshold keeps on the calibration prompts (the card's target is 95%
held out; the point above it is a margin for the calibration set's own noise)."""
BOOTSTRAP_SEED = 90_000
BOOTSTRAP_ROUNDS = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``evaluate`` options to ``parser``."""
    parser.add_argument(
        "--weights", default=str(common.WEIGHTS_DIR), help="folder holding clip/ and mini-sd/"
    )
    parser.add_argument("--clip-images", type=int, default=1000)
    parser.add_argument("--prompts", type=int, default=1500)
    parser.add_argument("--calibration-prompts", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=16, help="batch for the QA runs")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--guidance", type=float, default=DEFAULT_GUIDANCE)
    parser.add_argument("--timing-repeats", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma list of: clip,oracle,sd,timing")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--prompt-seed", type=int, default=PROMPT_SEED, help="seed of the QA run's prompts"
    )
    parser.add_argument(
        "--calibration-seed",
        type=int,
        default=CALIBRATION_SEED,
        help="seed of the gate's calibration prompts (another pair of seeds gives another "
        "held-out set, for choosing between scorers without the card's own images)",
    )
    parser.add_argument("--json", default=None, help="also write the figures here")


def single_shape_captions() -> list[str]:
    """Every one-shape caption of the grammar (the zero-shot label set)."""
    out = []
    for size, colour, kind, bg in itertools.product(
        world.SIZES, world.COLOURS, world.SHAPES, world.COLOURS
    ):
        if colour != bg:
            out.append(f"a {size} {colour} {kind} on a {bg} background")
    return out


class ClipJudge:
    """Image/text embeddings and scores from a ``CLIPModel`` + ``CLIPProcessor`` folder."""

    def __init__(self, path: Path) -> None:
        """Load the model and processor with ``from_pretrained``."""
        from transformers import CLIPModel, CLIPProcessor

        self.model = CLIPModel.from_pretrained(path).eval()
        self.processor = CLIPProcessor.from_pretrained(path)

    def image_embeds(self, images: list[np.ndarray]) -> Any:
        """L2-normalised image embeddings of ``uint8`` HWC images."""
        import torch
        from PIL import Image

        chunks = []
        for i in range(0, len(images), 256):
            pil = [Image.fromarray(im) for im in images[i : i + 256]]
            pixels = self.processor(images=pil, return_tensors="pt")["pixel_values"]
            with torch.no_grad():
                emb = self.model.get_image_features(pixel_values=pixels)
            chunks.append(_unit(emb))
        return torch.cat(chunks)

    def text_embeds(self, texts: list[str]) -> Any:
        """L2-normalised text embeddings."""
        import torch

        tokens = self.processor(text=texts, padding="max_length", return_tensors="pt")
        with torch.no_grad():
            emb = self.model.get_text_features(
                input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"]
            )
        return _unit(emb)

    def scores(self, images: list[np.ndarray], prompts: list[str]) -> np.ndarray:
        """CLIP score per (image, prompt) pair: 100 x cosine similarity."""
        sims = (self.image_embeds(images) * self.text_embeds(prompts)).sum(-1)
        out: np.ndarray = 100.0 * sims.numpy()
        return out


def _unit(x: Any) -> Any:
    out = getattr(x, "pooler_output", x)
    return out / out.norm(dim=-1, keepdim=True)


def clip_zero_shot(judge: ClipJudge, n: int) -> dict[str, float]:
    """Zero-shot colour/shape top-1 on ``n`` held-out one-shape images.

    Each image's softmax over every one-shape caption is summed per colour and per shape.
    """
    rng = random.Random(HELD_OUT_SEED)
    scenes = [world.random_scene(rng, two_shape_prob=0.0) for _ in range(n)]
    labels = single_shape_captions()
    parsed = [world.parse_caption(c) for c in labels]
    img = judge.image_embeds([world.render(s) for s in scenes])
    txt = judge.text_embeds(labels)
    probs = (judge.model.logit_scale.exp() * img @ txt.T).softmax(-1).detach().numpy()
    colour_of = np.array([world.COLOURS.index(p.shapes[0][1]) for p in parsed])
    shape_of = np.array([world.SHAPES.index(p.shapes[0][0]) for p in parsed])
    colour_p = np.stack([probs[:, colour_of == i].sum(1) for i in range(len(world.COLOURS))], 1)
    shape_p = np.stack([probs[:, shape_of == i].sum(1) for i in range(len(world.SHAPES))], 1)
    true_c = np.array([world.COLOURS.index(s.shapes[0].colour) for s in scenes])
    true_s = np.array([world.SHAPES.index(s.shapes[0].kind) for s in scenes])
    return {
        "clip_colour_top1": float((colour_p.argmax(1) == true_c).mean()),
        "clip_shape_top1": float((shape_p.argmax(1) == true_s).mean()),
    }


def generate(
    pipe: Any, prompts: list[str], seeds: list[int], steps: int, guidance: float, batch_size: int
) -> list[np.ndarray]:
    """Render prompts (one generator per prompt) in batches; ``uint8`` HWC images."""
    import torch

    out: list[np.ndarray] = []
    for i in range(0, len(prompts), batch_size):
        gens = [torch.Generator().manual_seed(s) for s in seeds[i : i + batch_size]]
        images = pipe(
            prompts[i : i + batch_size],
            generator=gens,
            num_inference_steps=steps,
            guidance_scale=guidance,
            output_type="np",
        ).images
        out += [np.asarray((im * 255).round().clip(0, 255), dtype=np.uint8) for im in images]
    return out


def qa_run(pipe: Any, prompts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Seeds 0..3 per prompt until the oracle's QA check passes; every image and verdict.

    The QA check is :func:`oracle.matches` (the whole prompt shown). The first attempt's
    earlier first-shape form and the strict reading are counted beside it.
    """
    records: list[dict[str, Any]] = []
    pending = list(range(len(prompts)))
    matched_at: dict[int, int] = {}
    first_subject: list[bool] = []
    first_strict: list[bool] = []
    for attempt in range(MAX_SEEDS):
        if not pending:
            break
        batch_prompts = [prompts[i] for i in pending]
        seeds = [1000 * i + attempt for i in pending]
        images = generate(pipe, batch_prompts, seeds, args.steps, args.guidance, args.batch_size)
        still = []
        for i, image in zip(pending, images, strict=True):
            verdict = oracle.check(image, prompts[i])
            records.append(
                {"prompt": prompts[i], "image": image, "ok": verdict.whole_ok, "attempt": attempt}
            )
            if attempt == 0:
                first_subject.append(verdict.subject_ok)
                first_strict.append(verdict.all_ok)
            if verdict.whole_ok:
                matched_at[i] = attempt
            else:
                still.append(i)
        pending = still
    return {
        "records": records,
        "matched_at": matched_at,
        "first_subject": first_subject,
        "first_strict": first_strict,
    }


def qa_figures(prompts: list[str], qa: dict[str, Any]) -> dict[str, Any]:
    """First-attempt and within-seeds rates, by prompt form and shape count; the fix curve.

    ``fix_curve[k]`` is the share of prompts still failing before attempt ``k + 2`` that pass
    at it; ``fix_cumulative[k]`` the share of failed first attempts fixed by attempt
    ``k + 2``; ``never_pass`` the share of failed first attempts that no seed fixes.
    """
    n = len(prompts)
    at: dict[int, int] = qa["matched_at"]
    parsed = [world.parse_caption(p) for p in prompts]
    out: dict[str, Any] = {
        "sd_prompts": float(n),
        "sd_first_attempt": sum(1 for a in at.values() if a == 0) / n,
        f"sd_within_{MAX_SEEDS}_seeds": len(at) / n,
        "sd_first_attempt_subject": float(np.mean(qa["first_subject"])),
        "sd_first_attempt_strict": float(np.mean(qa["first_strict"])),
    }
    groups = {
        "full": [p.full for p in parsed],
        "short": [not p.full for p in parsed],
        "one_shape": [len(p.shapes) == 1 for p in parsed],
        "two_shape": [len(p.shapes) == 2 for p in parsed],
    }
    for name, member in groups.items():
        idx = [i for i in range(n) if member[i]]
        out[f"sd_prompts_{name}"] = float(len(idx))
        out[f"sd_first_attempt_{name}"] = (
            sum(1 for i in idx if at.get(i) == 0) / len(idx) if idx else float("nan")
        )
        out[f"sd_within_{MAX_SEEDS}_seeds_{name}"] = (
            sum(1 for i in idx if i in at) / len(idx) if idx else float("nan")
        )
    failed_first = [i for i in range(n) if at.get(i) != 0]
    curve, cumulative = [], []
    still = len(failed_first)
    for attempt in range(1, MAX_SEEDS):
        fixed = sum(1 for i in failed_first if at.get(i) == attempt)
        curve.append(fixed / still if still else 0.0)
        cumulative.append(
            sum(1 for i in failed_first if 0 < at.get(i, MAX_SEEDS) <= attempt)
            / max(1, len(failed_first))
        )
        still -= fixed
    out["fix_failed_first"] = float(len(failed_first))
    out["fix_curve"] = curve
    out["fix_cumulative"] = cumulative
    out["never_pass"] = still / max(1, len(failed_first))
    return out


def calibrate_threshold(scores: np.ndarray, truth: np.ndarray) -> float:
    """The threshold (midpoint between sorted scores) that maximises agreement with ``truth``."""
    ordered = np.sort(scores)
    candidates = np.concatenate(
        [[ordered[0] - 1], (ordered[1:] + ordered[:-1]) / 2, [ordered[-1] + 1]]
    )
    agreement = [((scores >= c) == truth).mean() for c in candidates]
    return float(candidates[int(np.argmax(agreement))])


def threshold_for_recall(scores: np.ndarray, truth: np.ndarray, recall: float) -> float:
    """The highest threshold that keeps at least ``recall`` of the good images (``truth``).

    It stops as many bad images as any threshold can while keeping that share of good
    ones: the midpoint below the good score at the ``1 - recall`` quantile.
    """
    good = np.sort(scores[truth])
    if not len(good):
        raise ValueError("no good images to calibrate a recall on")
    drop = int(np.floor((1.0 - recall) * len(good) + 1e-9))  # good images allowed below
    if drop == 0:
        lower = scores[scores < good[0]]
        return float((good[0] + lower.max()) / 2) if len(lower) else float(good[0] - 1e-3)
    return float((good[drop - 1] + good[drop]) / 2)


def auc(scores: np.ndarray, truth: np.ndarray) -> float:
    """How often a good image outscores a bad one (ties count half); nan without both."""
    pos, neg = scores[truth], scores[~truth]
    if not len(pos) or not len(neg):
        return float("nan")
    wins = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    return float(wins.mean())


def detector_figures(
    scores: np.ndarray,
    truth: np.ndarray,
    threshold: float,
    prefix: str,
    groups: np.ndarray | None = None,
    thresholds: np.ndarray | None = None,
) -> dict[str, Any]:
    """Recall, specificity, balanced accuracy and AUC of the gate, each with a 95% interval.

    The intervals are percentiles of ``BOOTSTRAP_ROUNDS`` seeded bootstrap resamples. With
    ``groups`` (each image's prompt) a resample draws prompts, each with all its images:
    a prompt's retries are not independent draws (a hard prompt fails, and is scored, on
    every seed), so resampling images would make the intervals too narrow. With
    ``thresholds`` (one a round) each round judges at its own threshold: one calibrated on
    a resample of the calibration prompts, so that the intervals also hold the threshold's
    own noise (a 500-prompt calibration set moves it by about a point, and recall on
    two-shape prompts by several points with it).
    """
    accept = scores >= threshold
    good, bad = float(truth.sum()), float((~truth).sum())
    kept, stopped = float((accept & truth).sum()), float((~accept & ~truth).sum())
    recall = kept / good if good else float("nan")
    specificity = stopped / bad if bad else float("nan")
    ids = np.arange(len(scores)) if groups is None else groups
    members = [np.flatnonzero(ids == g) for g in np.unique(ids)]
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    rounds: list[tuple[float, float, float, float]] = []
    for b in range(BOOTSTRAP_ROUNDS):
        picks = rng.integers(0, len(members), len(members))
        idx = np.concatenate([members[i] for i in picks]) if members else np.array([], int)
        t = truth[idx]
        if t.all() or not t.any():
            continue
        a = scores[idx] >= (threshold if thresholds is None else thresholds[b])
        r, sp = (a & t).sum() / t.sum(), (~a & ~t).sum() / (~t).sum()
        rounds.append((float(r), float(sp), float((r + sp) / 2), auc(scores[idx], t)))

    def interval(column: int) -> list[float]:
        if not rounds:
            return [float("nan"), float("nan")]
        values = [row[column] for row in rounds]
        return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]

    return {
        f"{prefix}images": float(len(scores)),
        f"{prefix}good": good,
        f"{prefix}recall": recall,
        f"{prefix}recall_ci": interval(0),
        f"{prefix}specificity": specificity,
        f"{prefix}specificity_ci": interval(1),
        f"{prefix}balanced_accuracy": (recall + specificity) / 2,
        f"{prefix}balanced_accuracy_ci": interval(2),
        f"{prefix}auc": auc(scores, truth),
        f"{prefix}auc_ci": interval(3),
        f"{prefix}agreement": float((accept == truth).mean()),
    }


def calibration_thresholds(scores: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """The threshold :func:`threshold_for_recall` sets on each of ``BOOTSTRAP_ROUNDS``
    seeded resamples of the calibration images (one image a prompt)."""
    rng = np.random.default_rng(BOOTSTRAP_SEED + 1)
    out = np.empty(BOOTSTRAP_ROUNDS)
    for b in range(BOOTSTRAP_ROUNDS):
        idx = rng.integers(0, len(scores), len(scores))
        out[b] = threshold_for_recall(scores[idx], truth[idx], GATE_RECALL_TARGET)
    return out


def gate_figures(
    judge: ClipJudge, pipe: Any, args: argparse.Namespace, records: list[dict[str, Any]]
) -> dict[str, Any]:
    """Calibrate the gate on a separate prompt set, then score it on the QA run's images.

    The threshold is the highest that keeps ``GATE_RECALL_TARGET`` of the calibration
    images the oracle passes; the detector figures are then measured on every image of the
    QA run (first attempts and retries; prompts drawn apart from the calibration ones,
    though texts recur in so small a grammar, and other image seeds).
    """
    rng = random.Random(args.calibration_seed)
    cal_prompts = [
        world.random_caption(rng, short_forms=True) for _ in range(args.calibration_prompts)
    ]
    cal_images = generate(
        pipe,
        cal_prompts,
        [7 + i for i in range(len(cal_prompts))],
        args.steps,
        args.guidance,
        args.batch_size,
    )
    cal_truth = np.array(
        [oracle.matches(im, p) for im, p in zip(cal_images, cal_prompts, strict=True)]
    )
    cal_scores = judge.scores(cal_images, cal_prompts)
    threshold = threshold_for_recall(cal_scores, cal_truth, GATE_RECALL_TARGET)
    scores = judge.scores([r["image"] for r in records], [r["prompt"] for r in records])
    truth = np.array([r["ok"] for r in records])
    two = np.array([len(world.parse_caption(r["prompt"]).shapes) == 2 for r in records])
    prompt_of = {p: i for i, p in enumerate(dict.fromkeys(r["prompt"] for r in records))}
    groups = np.array([prompt_of[r["prompt"]] for r in records])
    cuts = calibration_thresholds(cal_scores, cal_truth)
    accept = scores >= threshold
    tp = float((accept & truth).sum())
    out: dict[str, Any] = {
        "gate_threshold": threshold,
        "gate_recall_target": GATE_RECALL_TARGET,
        "gate_calibration_images": float(len(cal_images)),
        "gate_calibration_pass_rate": float(cal_truth.mean()),
        "gate_oracle_pass_rate": float(truth.mean()),
        "gate_precision": tp / max(1.0, float(accept.sum())),
        "gate_agreement_threshold": calibrate_threshold(cal_scores, cal_truth),
    }
    for prefix, part in (
        ("gate_", np.ones(len(records), bool)), ("gate_one_shape_", ~two), ("gate_two_shape_", two)
    ):  # fmt: skip
        out |= detector_figures(scores[part], truth[part], threshold, prefix, groups[part], cuts)
    out["gate_threshold_ci"] = [float(np.percentile(cuts, 2.5)), float(np.percentile(cuts, 97.5))]
    # The earlier form of the QA check (first shape only), same images, same threshold.
    subject = np.array([oracle.matches_subject(r["image"], r["prompt"]) for r in records])
    out |= {
        "gate_subject_recall": float((accept & subject).sum() / max(1, subject.sum())),
        "gate_subject_specificity": float((~accept & ~subject).sum() / max(1, (~subject).sum())),
        "gate_subject_auc": auc(scores, subject),
        "gate_subject_pass_rate": float(subject.mean()),
    }
    return out


def _pct(x: Any) -> str:
    return f"{100 * float(x):.1f}%"


def print_detector(figures: dict[str, Any], prefix: str, label: str) -> None:
    """One line of detector figures with their intervals."""
    f = {k[len(prefix) :]: v for k, v in figures.items() if k.startswith(prefix)}

    def ci(name: str, pct: bool = True) -> str:
        lo, hi = f[f"{name}_ci"]
        return f"[{_pct(lo)}, {_pct(hi)}]" if pct else f"[{lo:.3f}, {hi:.3f}]"

    print(
        f"  {label} ({int(f['images'])} images, {int(f['good'])} good): recall "
        f"{_pct(f['recall'])} {ci('recall')}, specificity {_pct(f['specificity'])} "
        f"{ci('specificity')}, balanced accuracy {_pct(f['balanced_accuracy'])} "
        f"{ci('balanced_accuracy')}, AUC {f['auc']:.3f} {ci('auc', False)}",
        flush=True,
    )


def timing(pipe: Any, args: argparse.Namespace) -> dict[str, float]:
    """Median per-image seconds at each batch size; reports batch 1 and the best batch."""
    prompt = "a small red circle on a blue background"
    per_image: dict[int, float] = {}
    generate(pipe, [prompt], [0], args.steps, args.guidance, 1)  # warm-up
    for size in (1, 4, 16):
        runs = []
        for r in range(args.timing_repeats):
            start = time.perf_counter()
            generate(
                pipe, [prompt] * size, list(range(r, r + size)), args.steps, args.guidance, size
            )
            runs.append((time.perf_counter() - start) / size)
        per_image[size] = statistics.median(runs)
        print(f"  batch {size:2d}: {per_image[size] * 1000:.1f} ms/image", flush=True)
    best = min(per_image, key=lambda k: per_image[k])
    return {
        "render_s_batch1": per_image[1],
        "best_batch": float(best),
        "render_s_best_batch": per_image[best],
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the chosen evaluations, print each figure, optionally write JSON."""
    import torch
    from diffusers import StableDiffusionPipeline

    torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    weights = Path(args.weights)
    figures: dict[str, Any] = {
        "steps": float(args.steps),
        "guidance": args.guidance,
        "threads": float(args.threads),
    }
    judge = ClipJudge(weights / "clip")
    if "clip" not in skip:
        figures |= clip_zero_shot(judge, args.clip_images)
        print(
            f"tiny CLIP zero-shot on {args.clip_images} held-out images: colour top-1 "
            f"{figures['clip_colour_top1']:.1%}, shape top-1 {figures['clip_shape_top1']:.1%}",
            flush=True,
        )
    pipe = StableDiffusionPipeline.from_pretrained(weights / "mini-sd")
    pipe.set_progress_bar_config(disable=True)
    if "oracle" not in skip:
        read = reconstruction_oracle_rate(pipe.vae)
        figures |= {"oracle_recon_subject": read["subject"], "oracle_recon_strict": read["strict"]}
        print(
            f"pixel oracle on 500 VAE reconstructions of known world scenes: subject right "
            f"{read['subject']:.1%}, exactly right {read['strict']:.1%}",
            flush=True,
        )
    if "sd" not in skip:
        rng = random.Random(args.prompt_seed)
        prompts = [world.random_caption(rng, short_forms=True) for _ in range(args.prompts)]
        qa = qa_run(pipe, prompts, args)
        figures |= qa_figures(prompts, qa)
        f = figures
        print(
            f"mini-SD on {args.prompts} prompts ({args.steps} steps, guidance {args.guidance}), "
            f"oracle match of the whole prompt: first seed {_pct(f['sd_first_attempt'])}, "
            f"within {MAX_SEEDS} seeds {_pct(f[f'sd_within_{MAX_SEEDS}_seeds'])}; first seed "
            f"on {int(f['sd_prompts_full'])} full prompts {_pct(f['sd_first_attempt_full'])}, "
            f"{int(f['sd_prompts_short'])} short {_pct(f['sd_first_attempt_short'])}, "
            f"one-shape {_pct(f['sd_first_attempt_one_shape'])}, two-shape "
            f"{_pct(f['sd_first_attempt_two_shape'])}; first shape only (earlier check) "
            f"{_pct(f['sd_first_attempt_subject'])}, strict {_pct(f['sd_first_attempt_strict'])}",
            flush=True,
        )
        curve = ", ".join(f"attempt {k + 2} {_pct(x)}" for k, x in enumerate(figures["fix_curve"]))
        print(
            f"regeneration: of {int(f['fix_failed_first'])} failed first attempts, pass share "
            f"among those still failing: {curve}; fixed by attempt {MAX_SEEDS} "
            f"{_pct(f['fix_cumulative'][-1])}, never pass {_pct(f['never_pass'])}",
            flush=True,
        )
        figures |= gate_figures(judge, pipe, args, qa["records"])
        print(
            f"CLIP gate at threshold {f['gate_threshold']:.2f} (recall "
            f"{_pct(GATE_RECALL_TARGET)} on {args.calibration_prompts} other prompts, whose "
            f"oracle pass rate is {_pct(f['gate_calibration_pass_rate'])}), on "
            f"{len(qa['records'])} images (oracle pass rate {_pct(f['gate_oracle_pass_rate'])}): "
            f"agreement {_pct(f['gate_agreement'])}, precision {_pct(f['gate_precision'])}",
            flush=True,
        )
        print_detector(figures, "gate_", "all prompts")
        print_detector(figures, "gate_one_shape_", "one-shape prompts")
        print_detector(figures, "gate_two_shape_", "two-shape prompts")
        print(
            f"  against the earlier first-shape check: recall "
            f"{_pct(f['gate_subject_recall'])}, specificity "
            f"{_pct(f['gate_subject_specificity'])}, AUC {f['gate_subject_auc']:.3f}",
            flush=True,
        )
    if "timing" not in skip:
        print(f"render time ({args.threads} threads, median of {args.timing_repeats}):", flush=True)
        figures |= timing(pipe, args)
        print(
            f"per image: batch 1 {figures['render_s_batch1'] * 1000:.1f} ms, best batch "
            f"{int(figures['best_batch'])} {figures['render_s_best_batch'] * 1000:.1f} ms",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return figures
