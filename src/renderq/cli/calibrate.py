"""``renderq calibrate``: pick a CLIP threshold and store it with the scorer's name."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer

from renderq.backends.calibrate import CALIBRATION_FILE, Calibration, LabelledImage
from renderq.core.errors import RenderqError
from renderq.core.settings import DEFAULT_SCORER


def calibrate(
    dataset: Path | None = typer.Argument(
        None, help="JSONL: image (or file_name), prompt[, label]. Not with --from-reviews."
    ),
    from_reviews: Path | None = typer.Option(
        None,
        help="A run folder: fit on its reviewer decisions and the scores its run took "
        "(its scorer and scale; needs --target-precision).",
    ),
    scorer: str = typer.Option(DEFAULT_SCORER, help="CLIP model: folder, hub id, embedded:*."),
    target_precision: float = typer.Option(
        None, help="Lowest threshold whose accepted images reach this precision (needs labels)."
    ),
    target_pass_rate: float = typer.Option(None, help="Threshold passing this share of images."),
    store: Path = typer.Option(Path(CALIBRATION_FILE), help="Calibration file to update."),
    device: str = typer.Option("cpu", help="cpu or cuda[:N]."),
    clipscore_scale: bool = typer.Option(
        False, "--clipscore-scale", metavar="", help="100*max(cos, 0)."
    ),
    batch_size: int = typer.Option(32, help="Images scored per batch."),
    label_with: str = typer.Option(
        None, help="Label images with a judge instead of the file: 'shapes-oracle'."
    ),
    as_json: bool = typer.Option(
        False, "--json", metavar="", help="Print the calibration as JSON."
    ),
) -> None:
    """Choose a threshold for a target precision or pass rate; store it for renderq run."""
    from renderq.backends.diffusers import quiet_libraries
    from renderq.core.errors import ConfigError

    quiet_libraries()
    try:
        if (dataset is None) == (from_reviews is None):
            raise ConfigError("give a labelled set or --from-reviews OUT (one of them)")
        if from_reviews is not None:
            if target_pass_rate is not None or label_with is not None:
                raise ConfigError("--from-reviews takes --target-precision only")
            cal = calibrate_from_reviews(from_reviews, target_precision, store)
        elif dataset is not None:
            cal = run_calibration(
                dataset, scorer, target_precision, target_pass_rate, store, device,
                clipscore_scale, batch_size, label_with,
            )  # fmt: skip
    except RenderqError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(asdict(cal), sort_keys=True))
    else:
        extra = "" if cal.recall is None else f", recall {cal.recall:.3f}"
        typer.echo(
            f"{cal.scorer} ({cal.scale}): threshold {cal.threshold:.4f} for {cal.method} "
            f"{cal.target} (achieved {cal.achieved:.3f}{extra}, {cal.n} images) -> {store}"
        )


def run_calibration(
    dataset: Path,
    scorer_id: str,
    target_precision: float | None,
    target_pass_rate: float | None,
    store: Path,
    device: str,
    scale100: bool,
    batch_size: int,
    label_with: str | None = None,
) -> Calibration:
    """Score the set, choose the threshold, save it; returns the :class:`Calibration`."""
    from PIL import Image

    from renderq.backends import calibrate as cal
    from renderq.backends.clip import ClipScorer
    from renderq.backends.registry import resolve
    from renderq.core.errors import ConfigError

    if (target_precision is None) == (target_pass_rate is None):
        raise ConfigError("give exactly one of --target-precision and --target-pass-rate")
    items = cal.read_set(dataset)
    if label_with is not None:
        items = oracle_labels(items, label_with)
    if target_precision is not None and any(i.label is None for i in items):
        raise ConfigError("--target-precision needs a boolean 'label' on every line")
    scorer = ClipScorer.load(resolve(scorer_id), device=device, scale100=scale100, name=scorer_id)
    scores: list[float] = []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        images = [Image.open(i.image).convert("RGB") for i in chunk]
        result = scorer.score(images, [i.prompt for i in chunk])
        scores += [float(s) for s in result.scores if s is not None]
    scale = cal.scale_name(scale100)
    if target_precision is not None:
        labels = [bool(i.label) for i in items]
        t, precision, recall = cal.for_precision(scores, labels, target_precision)
        out = cal.Calibration(scorer_id, scale, t, "precision", target_precision, precision,
                              len(items), recall)  # fmt: skip
    else:
        assert target_pass_rate is not None
        t, rate = cal.for_pass_rate(scores, target_pass_rate)
        out = cal.Calibration(scorer_id, scale, t, "pass_rate", target_pass_rate, rate, len(items))
    cal.save(store, out)
    return out


def calibrate_from_reviews(out: Path, target_precision: float | None, store: Path) -> Calibration:
    """Fit the threshold on the reviewer decisions of run folder ``out``; save it; return it.

    The attempt a reviewer accepted is a positive, every scored attempt of a prompt they
    rejected or edited a negative (``renderq.jobs.review.review_labels``). The scores are
    those the run's scorer took, so the calibration is stored under that scorer and scale.
    Reviewed prompts all scored under the run's threshold: the fit says how far it can
    come down at the target precision; labels above it need a labelled set.
    """
    from renderq.backends import calibrate as cal
    from renderq.core.errors import ConfigError
    from renderq.jobs.review import open_store, review_labels

    if target_precision is None:
        raise ConfigError("--from-reviews needs --target-precision")
    with open_store(out) as job:
        config = job.job_config() or {}
        labelled = review_labels(job)
    if not labelled:
        raise ConfigError(f"{out} holds no reviewer decisions with scores (renderq review {out})")
    scorer = str(config.get("scorer", DEFAULT_SCORER))
    scale = cal.scale_name(bool(config.get("scale100", False)))
    found = cal.from_labels(scorer, scale, labelled, target_precision, "review_precision")
    cal.save(store, found)
    return found


def oracle_labels(items: list[LabelledImage], judge: str) -> list[LabelledImage]:
    """Label each image by a judge: ``shapes-oracle`` reads shapes-world images by pixels."""
    import dataclasses

    import numpy as np
    from PIL import Image

    from renderq.core.errors import ConfigError

    if judge != "shapes-oracle":
        raise ConfigError(f"--label-with must be 'shapes-oracle', got {judge!r}")
    try:
        from renderq.models.shapes import oracle
    except ImportError as exc:
        raise ConfigError(f"the shapes oracle is not available: {exc}") from exc
    out = []
    for item in items:
        with Image.open(item.image) as im:
            pixels = np.asarray(im.convert("RGB"))
        try:
            label = bool(oracle.matches(pixels, item.prompt))
        except ValueError as exc:
            raise ConfigError(f"{item.image.name}: {exc}") from None
        out.append(dataclasses.replace(item, label=label))
    return out
