"""Command line: ``python -m renderq.models.shapes train|build|evaluate``.

``train --stage clip|vae|unet|clip-vision|all [--fresh]`` trains from nothing or resumes from the
checkpoint folder; ``build`` assembles the shipped folders from finished stages;
``evaluate`` prints every figure of the model card.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from renderq.models.shapes import common


def _train(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    checkpoints = Path(args.checkpoints)
    stages = ["clip", "vae", "unet", "clip-vision"] if args.stage == "all" else [args.stage]
    for stage in stages:
        if stage in ("clip", "clip-vision"):
            from renderq.models.shapes.clip_train import VISION_STEPS, train_clip

            vision = stage == "clip-vision"
            steps = args.steps or (VISION_STEPS if vision else None)
            kwargs = {} if steps is None else {"steps": steps}
            train_clip(
                checkpoints,
                checkpoints / "export" / "clip",
                resume=not args.fresh,
                vision_only=vision,
                **kwargs,
            )
        elif stage == "vae":
            from renderq.models.shapes.vae_train import train_vae

            kwargs = {} if args.steps is None else {"steps": args.steps}
            train_vae(checkpoints, resume=not args.fresh, **kwargs)
        else:
            from renderq.models.shapes.unet_train import train_unet

            kwargs = {} if args.steps is None else {"steps": args.steps}
            train_unet(checkpoints, resume=not args.fresh, **kwargs)


def _build(args: argparse.Namespace) -> None:
    from renderq.models.shapes.build import build_all

    build_all(Path(args.checkpoints), Path(args.out))


def _evaluate(args: argparse.Namespace) -> None:
    from renderq.models.shapes.evaluate import main as evaluate_main

    evaluate_main(args)


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` and run the chosen command."""
    parser = argparse.ArgumentParser(prog="python -m renderq.models.shapes")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train one stage or all, resuming by default")
    train.add_argument(
        "--stage", choices=["clip", "vae", "unet", "clip-vision", "all"], default="all"
    )
    train.add_argument("--checkpoints", default=str(common.DEFAULT_CHECKPOINTS))
    train.add_argument("--steps", type=int, default=None, help="total steps of the stage")
    train.add_argument("--fresh", action="store_true", help="ignore existing checkpoints")
    train.add_argument("--resume", action="store_true", help="resume (the default)")
    train.add_argument("--threads", type=int, default=2)
    train.set_defaults(func=_train)
    build = sub.add_parser("build", help="assemble the shipped weight folders")
    build.add_argument("--checkpoints", default=str(common.DEFAULT_CHECKPOINTS))
    build.add_argument("--out", default=str(common.WEIGHTS_DIR))
    build.set_defaults(func=_build)
    evaluate = sub.add_parser("evaluate", help="print every figure of the model card")
    from renderq.models.shapes.evaluate import add_arguments

    add_arguments(evaluate)
    evaluate.set_defaults(func=_evaluate)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
