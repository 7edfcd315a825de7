"""Choosing a CLIP threshold: for a target precision on a labelled set, or a target pass rate.

A calibration is stored in a small JSON file keyed by the scorer's name (and the score
scale), so ``renderq run`` can pick it up when no ``--threshold`` is given.

A calibration set is a JSONL file, one image a line: ``image`` (or ``file_name``, so a
renderq ``metadata.jsonl`` works as is) with a path relative to the file, ``prompt``, and
for the precision target a boolean ``label`` (true: the image matches its prompt).

Reviewer decisions are labels too (:func:`from_labels`): the scores a run already took,
each with the reviewer's verdict, need no image scored again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from renderq.core.errors import ConfigError, not_a_file

CALIBRATION_FILE = "renderq-calibration.json"
"""Default calibration file, in the working directory."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """A chosen threshold and how it was chosen."""

    scorer: str
    scale: str
    threshold: float
    method: str
    target: float
    achieved: float
    n: int
    recall: float | None = None


@dataclass(frozen=True, slots=True)
class LabelledImage:
    """One line of a calibration set."""

    image: Path
    prompt: str
    label: bool | None


def for_precision(
    scores: Sequence[float], labels: Sequence[bool], target: float
) -> tuple[float, float, float]:
    """The lowest threshold whose accepted set has precision >= ``target``.

    Lowest, because among thresholds that reach the precision it keeps the most good
    images (highest recall). Returns ``(threshold, precision, recall)``.
    """
    if len(scores) != len(labels) or not scores:
        raise ConfigError(f"need as many labels as scores (got {len(scores)}, {len(labels)})")
    if not 0.0 < target <= 1.0:
        raise ConfigError(f"target precision must be in (0, 1], got {target}")
    positives = sum(labels)
    if positives == 0:
        raise ConfigError("the labelled set has no positive (label: true) image")
    pairs = sorted(zip(scores, labels, strict=True), key=lambda p: -p[0])
    best: tuple[float, float, float] | None = None
    best_precision = 0.0
    tp = 0
    for i, (score, label) in enumerate(pairs):
        tp += label
        if i + 1 < len(pairs) and pairs[i + 1][0] == score:
            continue  # a threshold accepts every tie at once
        precision = tp / (i + 1)
        best_precision = max(best_precision, precision)
        if precision >= target:
            best = (score, precision, tp / positives)
    if best is None:
        raise ConfigError(
            f"no threshold reaches precision {target}; the best is {best_precision:.3f}"
        )
    return best


def for_pass_rate(scores: Sequence[float], rate: float) -> tuple[float, float]:
    """The threshold that passes a ``rate`` share of ``scores``; returns it and the share."""
    if not scores:
        raise ConfigError("no scores to calibrate on")
    if not 0.0 < rate <= 1.0:
        raise ConfigError(f"target pass rate must be in (0, 1], got {rate}")
    ordered = sorted(scores, reverse=True)
    k = max(1, math.ceil(rate * len(ordered)))
    threshold = ordered[k - 1]
    return threshold, sum(s >= threshold for s in ordered) / len(ordered)


def from_labels(
    scorer: str, scale: str, labelled: Sequence[tuple[float, bool]], target: float, method: str
) -> Calibration:
    """The :func:`for_precision` threshold over scores already labelled (``(score, label)``)."""
    if not labelled:
        raise ConfigError("no labelled scores to calibrate on")
    scores = [s for s, _ in labelled]
    t, precision, recall = for_precision(scores, [ok for _, ok in labelled], target)
    return Calibration(scorer, scale, t, method, target, precision, len(labelled), recall)


def read_set(path: Path) -> list[LabelledImage]:
    """Read a calibration set; errors name the line."""
    if not path.is_file():
        raise ConfigError(not_a_file("calibration set", path, path.is_dir()))
    out: list[LabelledImage] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n}: malformed JSON ({exc.msg})") from None
        image = obj.get("image", obj.get("file_name")) if isinstance(obj, dict) else None
        prompt = obj.get("prompt") if isinstance(obj, dict) else None
        if not isinstance(image, str) or not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"{path}:{n}: need 'image' (or 'file_name') and 'prompt'")
        label = obj.get("label")
        if label is not None and not isinstance(label, bool):
            raise ConfigError(f"{path}:{n}: 'label' must be true or false, got {label!r}")
        img = path.parent / image
        if not img.is_file():
            raise ConfigError(f"{path}:{n}: image {image!r} not found")
        out.append(LabelledImage(img, prompt, label))
    if not out:
        raise ConfigError(f"{path}: no images in the calibration set")
    return out


def scale_name(scale100: bool) -> str:
    """The stored name of a score scale."""
    return "clipscore" if scale100 else "cosine"


def save(path: Path, cal: Calibration) -> None:
    """Add or replace ``cal`` in the calibration file (keyed by scorer and scale)."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    data[f"{cal.scorer}|{cal.scale}"] = asdict(cal)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def lookup(path: Path, scorer: str, scale: str) -> float | None:
    """The stored threshold for a scorer and scale, or None."""
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text(encoding="utf-8")).get(f"{scorer}|{scale}")
    except (json.JSONDecodeError, AttributeError):
        raise ConfigError(f"calibration file {path} is not a renderq calibration file") from None
    return None if entry is None else float(entry["threshold"])
