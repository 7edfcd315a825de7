"""The pixel oracle: classical image analysis that reads a shapes-world image.

From an image alone it recovers the background colour and each foreground shape's colour
and kind, without any learned model, so a generated image can be checked against its
prompt independently of CLIP:

1. background = nearest palette colour to the median of the border pixels;
2. every pixel gets its nearest palette colour; for each non-background colour the mask is
   opened (3x3 erosion then dilation) so thin blends along edges do not count as shapes;
3. connected components above ``min_area`` pixels are shapes; the kind comes from the
   component's geometry (see :func:`classify_component`): an upright triangle holds its
   area low in its box; a square fills its box and reaches further along the diagonals
   than a circle does.

The thresholds are set for *soft* images, not only the world's crisp ones: generated
images are blurred, apexes rounded and corners softened, and the VAE alone does that to
world images whose truth is known. ``python -m renderq.models.shapes evaluate`` measures
the oracle on such reconstructions (the model card has the figures).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from renderq.models.shapes.world import COLOURS, PALETTE, parse_caption

_PALETTE_ARRAY = np.array([PALETTE[c] for c in COLOURS], dtype=np.float32)

MIN_AREA = 30
"""Smallest component (pixels, on a 64x64 image) that counts as a shape."""


@dataclass(frozen=True, slots=True)
class Detection:
    """One shape the oracle found: kind, colour name, pixel area and bounding box."""

    kind: str
    colour: str
    area: int
    bbox: tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class Reading:
    """Everything the oracle read from one image: background colour and shapes, largest first."""

    background: str
    shapes: tuple[Detection, ...]

    def pairs(self) -> list[tuple[str, str]]:
        """``(colour, kind)`` of every detected shape, largest first."""
        return [(d.colour, d.kind) for d in self.shapes]


@dataclass(frozen=True, slots=True)
class Verdict:
    """How an image compares with a caption.

    ``whole_ok``: the image shows everything the caption states: each named shape (colour
    and kind) is a distinct detection, of the named size where the caption names one, and
    the background is the named one where the caption has a background clause. What the
    caption leaves out is not checked (``"a red circle"`` passes on any background, at any
    size, beside other shapes). This is the QA check (:func:`matches`).
    ``subject_ok``: the caption's first shape (colour and kind) is among the detections,
    the QA check of earlier releases. ``all_ok``: the strict reading: ``whole_ok``, and
    nothing else is detected, and (even for a caption without the clause) the background
    is a colour no named shape has.
    """

    subject_ok: bool
    all_ok: bool
    reading: Reading
    whole_ok: bool = False


def _nearest_colour_index(pixels: np.ndarray) -> np.ndarray:
    diff = pixels[..., None, :].astype(np.float32) - _PALETTE_ARRAY
    index: np.ndarray = np.argmin((diff * diff).sum(axis=-1), axis=-1)
    return index


def _shift_all(mask: np.ndarray, reduce_and: bool) -> np.ndarray:
    padded = np.pad(mask, 1, constant_values=not reduce_and)
    h, w = mask.shape
    out = mask.copy()
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            window = padded[dy : dy + h, dx : dx + w]
            out = (out & window) if reduce_and else (out | window)
    return out


def _open(mask: np.ndarray) -> np.ndarray:
    eroded = _shift_all(mask, reduce_and=True)
    opened: np.ndarray = _shift_all(eroded, reduce_and=False) & mask
    return opened


def _components(mask: np.ndarray) -> list[np.ndarray]:
    """4-connected components of a boolean mask, each as an ``(n, 2)`` array of (y, x)."""
    seen = np.zeros_like(mask)
    h, w = mask.shape
    found: list[np.ndarray] = []
    for y0, x0 in zip(*np.nonzero(mask), strict=True):
        if seen[y0, x0]:
            continue
        seen[y0, x0] = True
        queue = deque([(int(y0), int(x0))])
        members: list[tuple[int, int]] = []
        while queue:
            y, x = queue.popleft()
            members.append((y, x))
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        found.append(np.array(members))
    return found


TRIANGLE_CENTROID = 0.54
"""Centroid depth (share of the box height from its top) above which a shape is a triangle.

An upright triangle's centroid lies at 2/3 of its height, a circle's or square's at 1/2;
a soft render rounds the apex off, which lifts the box top and the ratio toward 1/2.
"""

SQUARENESS = 2.48
"""Threshold on box fill plus diagonal reach above which a (non-triangle) shape is a square.

Fill: the component's area over its box's (square 1, circle pi/4). Diagonal reach: its
extent along the two diagonals over its extent along the axes (square 2, circle sqrt 2).
Their sum is about 2.9 for a world square and 2.2 for a world circle; softened corners
lower a square's fill and reach together, hence the threshold below the midpoint.
"""


def shape_features(points: np.ndarray) -> tuple[float, float, float]:
    """``(centroid depth, box fill, diagonal reach)`` of ``(n, 2)`` (y, x) pixel coordinates."""
    ys: np.ndarray = points[:, 0].astype(np.float64)
    xs: np.ndarray = points[:, 1].astype(np.float64)
    height = ys.max() - ys.min() + 1
    width = xs.max() - xs.min() + 1
    depth = float((ys.mean() - ys.min() + 0.5) / height)
    fill = len(points) / float(height * width)
    down, up = xs + ys, xs - ys
    diagonal = (down.max() - down.min() + 1) + (up.max() - up.min() + 1)
    return depth, fill, float(diagonal / (height + width))


def classify_component(points: np.ndarray) -> str:
    """Shape kind of a component given as ``(n, 2)`` (y, x) pixel coordinates."""
    depth, fill, reach = shape_features(points)
    if depth > TRIANGLE_CENTROID:
        return "triangle"
    return "square" if fill + reach > SQUARENESS else "circle"


def read_image(image: np.ndarray, min_area: int = MIN_AREA) -> Reading:
    """Read background and shapes from an RGB ``uint8`` (or 0-255 float) ``(H, W, 3)`` array."""
    pixels = np.asarray(image)
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) RGB array, got shape {pixels.shape}")
    scale = pixels.shape[0] / 64.0
    border = np.concatenate(
        [pixels[0], pixels[-1], pixels[1:-1, 0], pixels[1:-1, -1]], axis=0
    ).astype(np.float32)
    bg_index = int(_nearest_colour_index(np.median(border, axis=0)[None])[0])
    labels = _nearest_colour_index(pixels)
    detections: list[Detection] = []
    for index, colour in enumerate(COLOURS):
        if index == bg_index:
            continue
        mask = _open(labels == index)
        if not mask.any():
            continue
        for points in _components(mask):
            if len(points) < min_area * scale * scale:
                continue
            ys, xs = points[:, 0], points[:, 1]
            bbox = (int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max()))
            detections.append(Detection(classify_component(points), colour, len(points), bbox))
    detections.sort(key=lambda d: -d.area)
    return Reading(COLOURS[bg_index], tuple(detections))


SMALL_MAX_HALF_EXTENT = 11
"""Detections whose half-extent (half the longer box side) exceeds this read as ``large``.

The world draws ``small`` shapes at half-extent 7-9 px and ``large`` ones at 13-16 px (on
64 px images; the bound scales with the image).
"""


def size_word(detection: Detection, image_size: int = 64) -> str:
    """``"small"`` or ``"large"``: the size word a detection's box extent reads as."""
    x0, y0, x1, y1 = detection.bbox
    half = max(x1 - x0, y1 - y0) / 2 * (64.0 / image_size)
    return "small" if half <= SMALL_MAX_HALF_EXTENT else "large"


def _fits(wanted: tuple[str, str, str | None], found: Detection, image_size: int) -> bool:
    kind, colour, size = wanted
    if (found.colour, found.kind) != (colour, kind):
        return False
    return size is None or size_word(found, image_size) == size


def _all_named_found(
    wanted: list[tuple[str, str, str | None]], found: list[Detection], image_size: int
) -> bool:
    """Whether each wanted shape is a distinct detection (a small bipartite search)."""
    if not wanted:
        return True
    head, rest = wanted[0], wanted[1:]
    for i, detection in enumerate(found):
        if _fits(head, detection, image_size) and _all_named_found(
            rest, found[:i] + found[i + 1 :], image_size
        ):
            return True
    return False


def check(image: np.ndarray, caption: str) -> Verdict:
    """Compare an image with a grammar caption (see :class:`Verdict`)."""
    parsed = parse_caption(caption)
    reading = read_image(image)
    image_size = int(np.asarray(image).shape[0])
    found = reading.pairs()
    wanted = [(colour, kind) for kind, colour, _ in parsed.shapes]
    subject_ok = wanted[0] in found
    background_ok = parsed.background is None or reading.background == parsed.background
    whole_ok = background_ok and _all_named_found(
        list(parsed.shapes), list(reading.shapes), image_size
    )
    all_ok = (
        whole_ok
        and len(found) == len(wanted)
        and reading.background not in {colour for colour, _ in wanted}
    )
    return Verdict(subject_ok, all_ok, reading, whole_ok)


def matches(image: np.ndarray, caption: str) -> bool:
    """Whether the image shows everything the caption states: the QA check (``whole_ok``)."""
    return check(image, caption).whole_ok


def matches_subject(image: np.ndarray, caption: str) -> bool:
    """The earlier QA check: the caption's first shape (colour and kind) is in the image."""
    return check(image, caption).subject_ok
