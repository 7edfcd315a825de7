"""Command line: ``python -m renderq.models.shapes train|build|evaluate``.

``train --stage clip|vae|unet|clip-gate|all [--fresh]`` trains from nothing or resumes from the
checkpoint folder (``all`` runs every stage, then builds the shipped folders and prints
their hashes and the wall time); ``build`` assembles the shipped folders from finished
stages; ``unpack`` restores the export folders from shipped weights so a stage can continue
from them; ``evaluate`` prints every figure of the model card; ``hashes`` the sha256 of
each shipped weight file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from renderq.models.shapes import common


def _train(args: argparse.Namespace) -> None:
    import time

    import torch

    torch.set_num_threads(args.threads)
    checkpoints = Path(args.checkpoints)
    stages = ["clip", "vae", "unet", "clip-gate"] if args.stage == "all" else [args.stage]
    started = time.monotonic()
    for stage in stages:
        if stage == "clip":
            from renderq.models.shapes.clip_train import train_clip

            kwargs = {} if args.steps is None else {"steps": args.steps}
            train_clip(
                checkpoints, checkpoints / "export" / "clip", resume=not args.fresh, **kwargs
            )
        elif stage == "clip-gate":
            _train_gate(args, checkpoints)
        elif stage == "vae":
            from renderq.models.shapes.vae_train import train_vae

            kwargs = {} if args.steps is None else {"steps": args.steps}
            train_vae(checkpoints, resume=not args.fresh, **kwargs)
        else:
            _train_unet(args, checkpoints)
    if args.stage == "all":
        # The one command: every stage, then the shipped folders, their hashes, the time.
        from renderq.models.shapes.build import build_all, weight_hashes

        out = build_all(checkpoints, Path(args.out))
        for name, digest in weight_hashes(out).items():
            print(f"sha256 {digest}  {name}", flush=True)
        print(f"[all] wall time {(time.monotonic() - started) / 60:.1f} min", flush=True)


def _train_unet(args: argparse.Namespace, checkpoints: Path) -> None:
    """The recipe's phases (``unet_train.UNET_RECIPE``), or with any option one schedule."""
    from renderq.models.shapes.unet_train import train_unet, train_unet_recipe

    options = {
        "steps": args.steps, "lr": args.lr, "warmup": args.warmup,
        "two_shape_share": args.two_shape_share, "dataset_size": args.dataset_size,
        "short_share": args.short_share,
    }  # fmt: skip
    given = {k: v for k, v in options.items() if v is not None}
    if not given and not args.init_from:
        train_unet_recipe(checkpoints, resume=not args.fresh)
        return
    init = Path(args.init_from) if args.init_from else None
    train_unet(checkpoints, resume=not args.fresh, init_from=init, **given)


def _shares(text: str) -> list[float]:
    """``--render-two-shape-share``: one share or several, comma-separated, each in [0, 1]."""
    try:
        shares = [float(part) for part in text.split(",")]
    except ValueError as err:
        msg = f"not a share or a comma-separated list: {text!r}"
        raise argparse.ArgumentTypeError(msg) from err
    bad = [s for s in shares if not 0.0 <= s <= 1.0]
    if bad or len(set(shares)) != len(shares):
        raise argparse.ArgumentTypeError(f"shares must be distinct and in [0, 1], got {text!r}")
    return shares


def _train_gate(args: argparse.Namespace, checkpoints: Path) -> None:
    from renderq.models.shapes.clip_gate import (
        GATE_STEPS,
        RENDER_STEPS,
        merge_renders,
        render_cache,
        render_training_set,
        train_clip_gate,
    )

    # Renders come from mini-SD as the earlier stages left it (assembled anew each time, so
    # never from a stale UNet), unless --render-with names a pipeline folder. They are cached
    # in clip-gate/ (renders.pt, then renders-<share>.pt for each further share); delete
    # them after retraining the UNet.
    pipeline = Path(args.render_with) if args.render_with else checkpoints / "export" / "mini-sd"
    if not args.render_with:
        from diffusers import AutoencoderKL, UNet2DConditionModel

        from renderq.models.shapes.build import assemble_pipeline, save_pipeline

        export = checkpoints / "export"
        vae = AutoencoderKL.from_pretrained(export / "vae")
        unet = UNet2DConditionModel.from_pretrained(export / "unet")
        save_pipeline(assemble_pipeline(export / "clip", vae, unet), pipeline, export / "clip")
    renders = merge_renders([
        render_training_set(pipeline, args.renders, render_cache(checkpoints, i, share),
                            two_shape_share=share)
        for i, share in enumerate(args.render_two_shape_share)
    ])  # fmt: skip
    train_clip_gate(
        checkpoints,
        checkpoints / "export" / "clip-gate",
        renders,
        init_from=Path(args.init_from) if args.init_from else None,
        steps=GATE_STEPS if args.steps is None else args.steps,
        render_steps=RENDER_STEPS if args.render_steps is None else args.render_steps,
        rendered_share=args.rendered_share,
        two_shape_share=0.4 if args.two_shape_share is None else args.two_shape_share,
        matched_caption=args.matched_caption,
        gate_weight=args.gate_weight,
        gate_balance=args.gate_balance,
        resume=not args.fresh,
        **({} if args.lr is None else {"lr": args.lr}),
        **({} if args.render_lr is None else {"render_lr": args.render_lr}),
    )


def _build(args: argparse.Namespace) -> None:
    from renderq.models.shapes.build import build_all

    build_all(Path(args.checkpoints), Path(args.out))


def _hashes(args: argparse.Namespace) -> None:
    from renderq.models.shapes.build import weight_hashes

    for name, digest in weight_hashes(Path(args.weights)).items():
        print(f"sha256 {digest}  {name}")


def _unpack(args: argparse.Namespace) -> None:
    from renderq.models.shapes.build import unpack_shipped

    print(unpack_shipped(Path(args.weights), Path(args.checkpoints)))


def _evaluate(args: argparse.Namespace) -> None:
    from renderq.models.shapes.evaluate import main as evaluate_main

    evaluate_main(args)


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` and run the chosen command."""
    parser = argparse.ArgumentParser(prog="python -m renderq.models.shapes")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train one stage or all, resuming by default")
    train.add_argument(
        "--stage", choices=["clip", "vae", "unet", "clip-gate", "all"], default="all"
    )
    train.add_argument("--checkpoints", default=str(common.DEFAULT_CHECKPOINTS))
    train.add_argument(
        "--steps",
        type=int,
        default=None,
        help="total steps of the stage (clip-gate: of its first part)",
    )
    train.add_argument("--fresh", action="store_true", help="ignore existing checkpoints")
    train.add_argument("--resume", action="store_true", help="resume (the default)")
    train.add_argument("--threads", type=int, default=2)
    train.add_argument("--init-from", default=None, help="warm-start folder (unet, clip-gate)")
    train.add_argument("--render-with", default=None, help="mini-SD folder (clip-gate)")
    train.add_argument("--renders", type=int, default=8192, help="renders (clip-gate)")
    train.add_argument(
        "--rendered-share", type=float, default=0.6, help="renders' share of a batch (clip-gate)"
    )
    train.add_argument(
        "--two-shape-share",
        type=float,
        default=None,
        help="share of world images with two shapes (unet's latent set in one schedule, default "
        "0.3; clip-gate, default 0.4)",
    )
    train.add_argument(
        "--render-two-shape-share",
        type=_shares,
        default=[0.5],
        help="share of the rendered training prompts that name two shapes (clip-gate); "
        "several, comma-separated, train on a set of --renders renders for each",
    )
    train.add_argument(
        "--matched-caption",
        choices=["reading", "prompt"],
        default="prompt",
        help="caption of a render that shows its prompt's subject (clip-gate)",
    )
    train.add_argument(
        "--gate-weight",
        type=float,
        default=3.0,
        help="weight of the ranking loss on (image, prompt) scores across images (clip-gate)",
    )
    train.add_argument(
        "--gate-balance",
        action="store_true",
        help="weigh that loss's pairings of one- and two-shape prompts alike (clip-gate)",
    )
    train.add_argument(
        "--render-steps", type=int, default=None, help="steps with renders (clip-gate)"
    )
    train.add_argument(
        "--lr", type=float, default=None, help="peak learning rate (unet; clip-gate part 1)"
    )
    train.add_argument(
        "--render-lr", type=float, default=None, help="peak learning rate (clip-gate part 2)"
    )
    train.add_argument("--warmup", type=int, default=None, help="warm-up steps (unet)")
    train.add_argument(
        "--dataset-size", type=int, default=None, help="world images in the latent set (unet)"
    )
    train.add_argument(
        "--short-share",
        type=float,
        default=None,
        help="unet: every image keeps all its caption's forms, each step draws one, leaving out "
        "the size words and the background clause each with this chance (default in one "
        "schedule: one fixed caption per image, drawn once). Without any unet option the stage "
        "runs the recipe (unet_train.UNET_RECIPE) instead",
    )
    train.add_argument(
        "--out", default=str(common.WEIGHTS_DIR), help="where --stage all builds the weights"
    )
    train.set_defaults(func=_train)
    hashes = sub.add_parser("hashes", help="sha256 of every shipped weight file")
    hashes.add_argument("--weights", default=str(common.WEIGHTS_DIR))
    hashes.set_defaults(func=_hashes)
    build = sub.add_parser("build", help="assemble the shipped weight folders")
    build.add_argument("--checkpoints", default=str(common.DEFAULT_CHECKPOINTS))
    build.add_argument("--out", default=str(common.WEIGHTS_DIR))
    build.set_defaults(func=_build)
    unpack = sub.add_parser(
        "unpack", help="restore export/clip and export/vae from shipped weights"
    )
    unpack.add_argument("--weights", default=str(common.WEIGHTS_DIR))
    unpack.add_argument("--checkpoints", default=str(common.DEFAULT_CHECKPOINTS))
    unpack.set_defaults(func=_unpack)
    evaluate = sub.add_parser("evaluate", help="print every figure of the model card")
    from renderq.models.shapes.evaluate import add_arguments

    add_arguments(evaluate)
    evaluate.set_defaults(func=_evaluate)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
