"""The shapes world: a seeded procedural generator of small images and their captions.

A scene is a flat background colour with one or two flat, non-overlapping shapes. Its
caption comes from a small grammar, for example ``"a small red triangle on a blue
background"`` or ``"a large green circle and a small white square on a black background"``.
Only numpy is needed; images are ``uint8`` arrays of shape ``(size, size, 3)``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

IMAGE_SIZE = 64
"""Side of a world image in pixels."""

# Colours are far apart in RGB so that a blurry generated image still maps to one entry.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 215, 40),
    "purple": (150, 60, 190),
    "orange": (245, 140, 30),
    "white": (240, 240, 240),
    "black": (25, 25, 25),
}
"""Named colours of the world, usable for shapes and backgrounds alike."""

COLOURS: tuple[str, ...] = tuple(PALETTE)
"""Colour names in a fixed order (class indices for classifiers)."""

SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
"""Shape names in a fixed order (class indices for classifiers)."""

# Half-extent ranges in pixels for each size word; the gap keeps the words unambiguous.
SIZES: dict[str, tuple[int, int]] = {"small": (7, 9), "large": (13, 16)}
"""Size words and the half-extent range (pixels) each one draws from."""

FUNCTION_WORDS: tuple[str, ...] = ("a", "and", "on", "background", "shape")
"""Grammar words other than colours, shapes and sizes."""


@dataclass(frozen=True, slots=True)
class Shape:
    """One shape in a scene: what it is, its colour, size word, centre and half-extent."""

    kind: str
    colour: str
    size: str
    cx: int
    cy: int
    radius: int

    def phrase(self) -> str:
        """The noun phrase for this shape, e.g. ``"a small red circle"``."""
        return f"a {self.size} {self.colour} {self.kind}"


@dataclass(frozen=True, slots=True)
class Scene:
    """A full scene: background colour and one or two shapes (first one is the subject)."""

    background: str
    shapes: tuple[Shape, ...]

    def caption(self) -> str:
        """The grammar caption of this scene."""
        return caption_for(self.background, self.shapes)


def caption_for(background: str, shapes: tuple[Shape, ...] | list[Shape]) -> str:
    """Caption for a background and its shapes, in the world's grammar."""
    subject = " and ".join(s.phrase() for s in shapes)
    return f"{subject} on a {background} background"


def vocabulary() -> list[str]:
    """Every word the caption grammar (and the zero-shot prompts) can produce."""
    return sorted({*FUNCTION_WORDS, *COLOURS, *SHAPES, *SIZES})


def _shape_mask(kind: str, cx: int, cy: int, r: int, size: int) -> np.ndarray:
    ys, xs = np.mgrid[0:size, 0:size]
    dx = xs - cx
    dy = ys - cy
    mask: np.ndarray
    if kind == "circle":
        mask = dx * dx + dy * dy <= r * r + r
    elif kind == "square":
        mask = (np.abs(dx) <= r) & (np.abs(dy) <= r)
    elif kind == "triangle":
        # Upright isosceles triangle: apex at the top centre, base along the bottom.
        inside_rows = (dy >= -r) & (dy <= r)
        mask = inside_rows & (np.abs(dx) <= (dy + r) / 2.0)
    else:
        raise ValueError(f"unknown shape kind {kind!r}; expected one of {SHAPES}")
    return mask


def render(scene: Scene, size: int = IMAGE_SIZE) -> np.ndarray:
    """Draw a scene as a ``uint8`` RGB array of shape ``(size, size, 3)``."""
    image: np.ndarray = np.empty((size, size, 3), dtype=np.uint8)
    image[:] = PALETTE[scene.background]
    for shape in scene.shapes:
        mask = _shape_mask(shape.kind, shape.cx, shape.cy, shape.radius, size)
        image[mask] = PALETTE[shape.colour]
    return image


def _place(rng: random.Random, r: int, size: int, placed: list[Shape]) -> tuple[int, int] | None:
    margin = 2
    for _ in range(50):
        cx = rng.randint(r + margin, size - 1 - r - margin)
        cy = rng.randint(r + margin, size - 1 - r - margin)
        # Bounding boxes stay apart so the oracle sees separate components.
        if all(
            abs(cx - p.cx) > r + p.radius + 3 or abs(cy - p.cy) > r + p.radius + 3 for p in placed
        ):
            return cx, cy
    return None


def random_scene(rng: random.Random, two_shape_prob: float = 0.3, size: int = IMAGE_SIZE) -> Scene:
    """Draw a random scene; with ``two_shape_prob`` it holds two shapes of distinct colours."""
    count = 2 if rng.random() < two_shape_prob else 1
    while True:
        background = rng.choice(COLOURS)
        colours = rng.sample([c for c in COLOURS if c != background], count)
        shapes: list[Shape] = []
        for colour in colours:
            size_word = rng.choice(tuple(SIZES))
            lo, hi = SIZES[size_word]
            r = rng.randint(lo, hi)
            where = _place(rng, r, size, shapes)
            if where is None:
                break
            kind = rng.choice(SHAPES)
            shapes.append(Shape(kind, colour, size_word, where[0], where[1], r))
        if len(shapes) == count:
            return Scene(background, tuple(shapes))


def scene_for_caption(caption: str, rng: random.Random, size: int = IMAGE_SIZE) -> Scene:
    """A random scene (random placement and exact size) that matches a grammar caption."""
    parsed = parse_caption(caption)
    while True:
        shapes: list[Shape] = []
        for kind, colour, size_word in parsed.shapes:
            lo, hi = SIZES[size_word]
            r = rng.randint(lo, hi)
            where = _place(rng, r, size, shapes)
            if where is None:
                break
            shapes.append(Shape(kind, colour, size_word, where[0], where[1], r))
        if len(shapes) == len(parsed.shapes):
            return Scene(parsed.background, tuple(shapes))


@dataclass(frozen=True, slots=True)
class ParsedCaption:
    """What a grammar caption asks for: ``(kind, colour, size)`` per shape and a background."""

    shapes: tuple[tuple[str, str, str], ...]
    background: str


def parse_caption(caption: str) -> ParsedCaption:
    """Parse a caption of the world's grammar; raises ``ValueError`` quoting a bad caption."""
    words = caption.strip().lower().split()
    try:
        on = len(words) - 1 - words[::-1].index("on")
    except ValueError:
        raise ValueError(f"caption {caption!r} has no 'on a <colour> background' part") from None
    tail = words[on:]
    if len(tail) != 4 or tail[1] != "a" or tail[2] not in PALETTE or tail[3] != "background":
        raise ValueError(f"caption {caption!r} does not end with 'on a <colour> background'")
    shapes: list[tuple[str, str, str]] = []
    for phrase in " ".join(words[:on]).split(" and "):
        parts = phrase.split()
        if (
            len(parts) != 4
            or parts[0] != "a"
            or parts[1] not in SIZES
            or parts[2] not in PALETTE
            or parts[3] not in SHAPES
        ):
            raise ValueError(f"caption {caption!r}: bad shape phrase {phrase!r}")
        shapes.append((parts[3], parts[2], parts[1]))
    if not 1 <= len(shapes) <= 2:
        raise ValueError(f"caption {caption!r} must name one or two shapes")
    return ParsedCaption(tuple(shapes), tail[2])


def sample_batch(rng: random.Random, n: int, two_shape_prob: float = 0.3) -> list[Scene]:
    """``n`` random scenes from one generator (a convenience for training loops)."""
    return [random_scene(rng, two_shape_prob) for _ in range(n)]


def random_caption(rng: random.Random, two_shape_prob: float = 0.3) -> str:
    """A random grammar caption (the caption of a random scene)."""
    return random_scene(rng, two_shape_prob).caption()
