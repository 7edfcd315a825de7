"""The shapes world: a seeded procedural generator of small images and their captions.

A scene is a flat background colour with one or two flat, non-overlapping shapes. Its
caption comes from a small grammar, for example ``"a small red triangle on a blue
background"`` or ``"a large green circle and a small white square on a black background"``.
The size words and the background clause are optional: ``"a red circle"``, ``"a large red
circle"`` and ``"a red circle on a blue background"`` are captions too, and state less
(any size, any background). Only numpy is needed; images are ``uint8`` arrays of shape
``(size, size, 3)``.
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

SHORT_SIZE_PROB = 0.3
"""Share of training captions that leave out the size words (of every shape)."""

MIXED_SIZE_PROB = 0.1
"""Share of two-shape training captions that name the size of one shape only."""

SHORT_BACKGROUND_PROB = 0.3
"""Share of training captions that leave out the background clause."""

EXAMPLE_PROMPT = "a red circle on a blue background"
"""A prompt inside the world's grammar, quoted to people whose prompt is outside it."""


@dataclass(frozen=True, slots=True)
class Shape:
    """One shape in a scene: what it is, its colour, size word, centre and half-extent."""

    kind: str
    colour: str
    size: str
    cx: int
    cy: int
    radius: int

    def phrase(self, with_size: bool = True) -> str:
        """The noun phrase for this shape, e.g. ``"a small red circle"`` (or ``"a red circle"``)."""
        if not with_size:
            return f"a {self.colour} {self.kind}"
        return f"a {self.size} {self.colour} {self.kind}"


@dataclass(frozen=True, slots=True)
class Scene:
    """A full scene: background colour and one or two shapes (first one is the subject)."""

    background: str
    shapes: tuple[Shape, ...]

    def caption(self, sizes: bool | tuple[bool, ...] = True, background: bool = True) -> str:
        """The grammar caption of this scene (the full form unless told to leave parts out)."""
        return caption_for(self.background, self.shapes, sizes=sizes, with_background=background)


def caption_for(
    background: str,
    shapes: tuple[Shape, ...] | list[Shape],
    sizes: bool | tuple[bool, ...] = True,
    with_background: bool = True,
) -> str:
    """Caption for a background and its shapes, in the world's grammar.

    ``sizes`` says whether each shape's size word is stated (one flag for all, or one per
    shape); ``with_background`` whether the ``on a <colour> background`` clause is.
    """
    flags = (sizes,) * len(shapes) if isinstance(sizes, bool) else sizes
    if len(flags) != len(shapes):
        raise ValueError(f"{len(flags)} size flags for {len(shapes)} shapes")
    subject = " and ".join(s.phrase(f) for s, f in zip(shapes, flags, strict=True))
    return f"{subject} on a {background} background" if with_background else subject


def training_caption(scene: Scene, rng: random.Random) -> str:
    """A caption of ``scene`` in a random form of the grammar, as the training sets use it.

    The size words are left out with ``SHORT_SIZE_PROB`` (a two-shape caption names one
    shape's size only with ``MIXED_SIZE_PROB``), the background clause with
    ``SHORT_BACKGROUND_PROB``; the rest are full captions.
    """
    u = rng.random()
    sizes: bool | tuple[bool, ...]
    if u < SHORT_SIZE_PROB:
        sizes = False
    elif len(scene.shapes) == 2 and u < SHORT_SIZE_PROB + MIXED_SIZE_PROB:
        first = rng.random() < 0.5
        sizes = (first, not first)
    else:
        sizes = True
    return scene.caption(sizes=sizes, background=rng.random() >= SHORT_BACKGROUND_PROB)


def caption_forms(scene: Scene, short_share: float = SHORT_SIZE_PROB) -> list[tuple[str, float]]:
    """Every form of ``scene``'s caption with its chance: sizes and background apart.

    The size words are left out with ``short_share`` (a two-shape caption names one
    shape's size only with ``MIXED_SIZE_PROB``, either shape alike), the background clause
    with ``short_share`` too, independently. With the default, the chances are those of
    :func:`training_caption` (``SHORT_BACKGROUND_PROB`` equals ``SHORT_SIZE_PROB``).
    """
    if not 0.0 <= short_share <= 1.0 - MIXED_SIZE_PROB:
        raise ValueError(f"short_share must be in [0, {1 - MIXED_SIZE_PROB}], got {short_share}")
    sizes: list[tuple[bool | tuple[bool, ...], float]] = [(False, short_share)]
    if len(scene.shapes) == 2:
        sizes += [((True, False), MIXED_SIZE_PROB / 2), ((False, True), MIXED_SIZE_PROB / 2)]
        sizes.append((True, 1.0 - short_share - MIXED_SIZE_PROB))
    else:
        sizes.append((True, 1.0 - short_share))
    return [
        (scene.caption(sizes=flags, background=bg), p * (1.0 - short_share if bg else short_share))
        for flags, p in sizes
        for bg in (True, False)
    ]


def vocabulary() -> list[str]:
    """Every word the caption grammar (and the zero-shot prompts) can produce."""
    return sorted({*FUNCTION_WORDS, *COLOURS, *SHAPES, *SIZES})


def prompt_words(prompt: str) -> list[str]:
    """The words of a prompt as the grammar reads them: lower case, split on blanks and
    punctuation (``"A red circle."`` has the words ``a``, ``red``, ``circle``)."""
    cleaned = "".join(ch if ch.isalnum() or ch.isspace() else " " for ch in prompt.lower())
    return cleaned.split()


def unknown_words(prompt: str) -> list[str]:
    """Words of ``prompt`` outside the world's vocabulary, once each, in prompt order."""
    known = set(vocabulary())
    seen: list[str] = []
    for word in prompt_words(prompt):
        if word not in known and word not in seen:
            seen.append(word)
    return seen


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
    """A random scene (random placement and exact size) that matches a grammar caption.

    What the caption leaves out is drawn at random: a size word for a shape without one, a
    background colour (other than the shapes' colours) when there is no background clause.
    """
    parsed = parse_caption(caption)
    background = parsed.background
    if background is None:
        used = {colour for _, colour, _ in parsed.shapes}
        background = rng.choice([c for c in COLOURS if c not in used] or list(COLOURS))
    while True:
        shapes: list[Shape] = []
        for kind, colour, stated in parsed.shapes:
            size_word = stated if stated is not None else rng.choice(tuple(SIZES))
            lo, hi = SIZES[size_word]
            r = rng.randint(lo, hi)
            where = _place(rng, r, size, shapes)
            if where is None:
                break
            shapes.append(Shape(kind, colour, size_word, where[0], where[1], r))
        if len(shapes) == len(parsed.shapes):
            return Scene(background, tuple(shapes))


@dataclass(frozen=True, slots=True)
class ParsedCaption:
    """What a grammar caption asks for: ``(kind, colour, size)`` per shape and a background.

    ``size`` is ``None`` for a shape whose caption names no size, ``background`` ``None``
    for a caption without the background clause: the caption does not ask for either.
    """

    shapes: tuple[tuple[str, str, str | None], ...]
    background: str | None

    @property
    def full(self) -> bool:
        """Whether the caption states every size and the background (the full form)."""
        return self.background is not None and all(s is not None for _, _, s in self.shapes)


def parse_caption(caption: str) -> ParsedCaption:
    """Parse a caption of the world's grammar; raises ``ValueError`` quoting a bad caption.

    The grammar: ``<shape> [and <shape>] [on a <colour> background]`` where ``<shape>`` is
    ``a [small|large] <colour> <circle|square|triangle>``.
    """
    words = caption.strip().lower().split()
    background: str | None = None
    subject = words
    if "on" in words:
        on = len(words) - 1 - words[::-1].index("on")
        tail = words[on:]
        if len(tail) != 4 or tail[1] != "a" or tail[2] not in PALETTE or tail[3] != "background":
            raise ValueError(f"caption {caption!r} does not end with 'on a <colour> background'")
        background = tail[2]
        subject = words[:on]
    elif "background" in words:
        raise ValueError(f"caption {caption!r} has no 'on a <colour> background' part")
    shapes: list[tuple[str, str, str | None]] = []
    for phrase in " ".join(subject).split(" and "):
        parts = phrase.split()
        size_word: str | None = None
        if len(parts) == 4 and parts[1] in SIZES:
            size_word = parts[1]
            parts = [parts[0], *parts[2:]]
        if len(parts) != 3 or parts[0] != "a" or parts[1] not in PALETTE or parts[2] not in SHAPES:
            raise ValueError(f"caption {caption!r}: bad shape phrase {phrase!r}")
        shapes.append((parts[2], parts[1], size_word))
    if not 1 <= len(shapes) <= 2:
        raise ValueError(f"caption {caption!r} must name one or two shapes")
    return ParsedCaption(tuple(shapes), background)


def sample_batch(rng: random.Random, n: int, two_shape_prob: float = 0.3) -> list[Scene]:
    """``n`` random scenes from one generator (a convenience for training loops)."""
    return [random_scene(rng, two_shape_prob) for _ in range(n)]


def random_caption(
    rng: random.Random, two_shape_prob: float = 0.3, short_forms: bool = False
) -> str:
    """A random grammar caption: the full caption of a random scene, or with
    ``short_forms`` one in the random form :func:`training_caption` draws."""
    scene = random_scene(rng, two_shape_prob)
    return training_caption(scene, rng) if short_forms else scene.caption()
