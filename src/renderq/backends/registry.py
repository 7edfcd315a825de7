"""Model ids: ``embedded:*`` names for the shipped shapes models, anything else as given.

``embedded:mini-sd`` and ``embedded:clip`` resolve to the folders shipped inside
``renderq.models.shapes``; any other id is passed to ``from_pretrained`` unchanged (a
local folder or a hub id).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
from pathlib import Path

from renderq.core.errors import ConfigError
from renderq.core.settings import DEFAULT_MODEL, DEFAULT_SCORER

EMBEDDED_PREFIX = "embedded:"

# Embedded name -> (function in renderq.models.shapes that returns the folder, folder name
# under its weights directory used when that function is absent).
_EMBEDDED: dict[str, tuple[str, str]] = {
    "mini-sd": ("default_pipeline_path", "mini-sd"),
    "clip": ("default_clip_path", "clip"),
}

FALLBACK_STEPS = 20
FALLBACK_GUIDANCE = 7.5


def model_defaults(model_id: str) -> tuple[int, float]:
    """Default ``(steps, guidance)`` for a model.

    The embedded model's own; for a diffusers folder (or a hub id already in the local
    cache) the defaults of its pipeline class's ``__call__`` (SD 1.x 50 / 7.5, SDXL 50 /
    5.0, SD3 28 / 7.0, Flux 28 / 3.5); else ``FALLBACK_STEPS`` / ``FALLBACK_GUIDANCE``.
    """
    if model_id == DEFAULT_MODEL:
        try:
            shapes = importlib.import_module("renderq.models.shapes")
            return int(shapes.DEFAULT_STEPS), float(shapes.DEFAULT_GUIDANCE)
        except (ImportError, AttributeError):
            pass
    found = _pipeline_call_defaults(model_id)
    return found if found is not None else (FALLBACK_STEPS, FALLBACK_GUIDANCE)


def _model_index(model_id: str) -> Path | None:
    """The model's ``model_index.json``: in its folder, or in the hub cache (no download)."""
    try:
        local = Path(resolve(model_id)).expanduser() / "model_index.json"
    except ConfigError:
        return None
    if local.is_file():
        return local
    if model_id.count("/") != 1 or model_id.startswith((".", "/", "~")) or model_id.endswith("/"):
        return None  # not a hub id (a missing folder is reported when the model loads)
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_id, "model_index.json")
    except Exception:  # an id the hub client refuses, or no client: no defaults from it
        return None
    return Path(cached) if isinstance(cached, str) else None


def _pipeline_call_defaults(model_id: str) -> tuple[int, float] | None:
    index = _model_index(model_id)
    if index is None:
        return None
    try:
        name = json.loads(index.read_text(encoding="utf-8")).get("_class_name")
        diffusers = importlib.import_module("diffusers")
        params = inspect.signature(getattr(diffusers, str(name)).__call__).parameters
        steps = params["num_inference_steps"].default
        guidance = params["guidance_scale"].default
    except (ImportError, AttributeError, KeyError, ValueError, OSError):
        return None
    if not isinstance(steps, int) or not isinstance(guidance, int | float):
        return None
    return steps, float(guidance)


def vocabulary_notice(model_id: str, prompts: list[tuple[int, str]]) -> str | None:
    """For the embedded model: the prompts (line, text) with words its world never shows.

    The embedded models know only the shapes world's words; a prompt with others renders
    something unrelated to them and fails the gate. None when every word is known or the
    model is not the embedded one.
    """
    if model_id != DEFAULT_MODEL:
        return None
    try:
        shapes = importlib.import_module("renderq.models.shapes")
        unknown, example = shapes.unknown_words, shapes.example_prompt
    except (ImportError, AttributeError):
        return None
    hits = [(line, words) for line, text in prompts if (words := unknown(text))]
    if not hits:
        return None
    shown = "; ".join(f"line {line}: {', '.join(map(repr, w))}" for line, w in hits[:3])
    more = "; ..." if len(hits) > 3 else ""
    return (
        f"{len(hits)} prompt(s) use words the embedded model has never seen ({shown}{more}); "
        f"it knows the shapes world only, for example {example()!r}"
    )


def resolve(model_id: str) -> str:
    """The path or hub id to load for ``model_id``; ``embedded:*`` names become folders."""
    if not model_id.startswith(EMBEDDED_PREFIX):
        return model_id
    name = model_id[len(EMBEDDED_PREFIX) :]
    if name not in _EMBEDDED:
        raise ConfigError(
            f"unknown embedded model {model_id!r}; known: "
            f"{', '.join(EMBEDDED_PREFIX + n for n in _EMBEDDED)}"
        )
    func_name, folder = _EMBEDDED[name]
    try:
        shapes = importlib.import_module("renderq.models.shapes")
    except ImportError as exc:
        raise ConfigError(f"embedded model {model_id!r} is not available: {exc}") from exc
    func = getattr(shapes, func_name, None)
    if callable(func):
        path = Path(str(func()))
    else:
        common = importlib.import_module("renderq.models.shapes.common")
        path = Path(common.WEIGHTS_DIR) / folder
    if not path.is_dir():
        raise ConfigError(
            f"embedded model {model_id!r} is not installed (no folder {path.name!r} among the "
            "shipped weights); pass --model/--scorer with a diffusers/CLIP folder or hub id"
        )
    return str(path)


def scorer_default_threshold(scorer_id: str, scale100: bool = False) -> float | None:
    """The embedded CLIP's own threshold, if the package ships one.

    ``renderq.models.shapes.DEFAULT_THRESHOLD`` is read as a cosine similarity; on the
    CLIPScore scale it is multiplied by 100.
    """
    if scorer_id != DEFAULT_SCORER:
        return None
    try:
        shapes = importlib.import_module("renderq.models.shapes")
    except ImportError:
        return None
    value = getattr(shapes, "DEFAULT_THRESHOLD", None)
    if not isinstance(value, int | float):
        return None
    return 100.0 * max(float(value), 0.0) if scale100 else float(value)


_FULL_HASH_BYTES = 64 << 20
_EDGE_BYTES = 1 << 20


def fingerprint(model_id: str) -> str:
    """A digest of a local model folder: every file's name, size and content.

    A resumed job compares it, so a rebuilt or replaced checkpoint under the same id is
    not mixed into a dataset made with the old one. Files up to 64 MiB are hashed whole;
    larger ones (multi-gigabyte weights) by their first and last MiB and their size, which
    keeps this fast. Hub ids give themselves.
    """
    path = Path(resolve(model_id)).expanduser()
    if not path.is_dir():
        return model_id
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = f.relative_to(path).as_posix()
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        size = f.stat().st_size
        digest.update(f"{rel}\0{size}\0".encode())
        with open(f, "rb") as fh:
            if size <= _FULL_HASH_BYTES:
                digest.update(fh.read())
            else:
                digest.update(fh.read(_EDGE_BYTES))
                fh.seek(size - _EDGE_BYTES)
                digest.update(fh.read(_EDGE_BYTES))
    return "sha256:" + digest.hexdigest()


def fix_curve(spec: str) -> tuple[float, ...]:
    """A regeneration curve for the simulator: ``embedded`` or comma-separated chances.

    ``embedded`` is the embedded model's measured curve (``weights/figures.json``
    ``fix_curve``: of the prompts whose first attempts failed the whole-prompt check, the
    share the next seed fixes, by attempt), as the model card reports it.
    """
    spec = spec.strip()
    if not spec:
        return ()
    if spec == "embedded":
        common = importlib.import_module("renderq.models.shapes.common")
        figures = json.loads((Path(common.WEIGHTS_DIR) / "figures.json").read_text())
        return tuple(float(v) for v in figures["fix_curve"])
    try:
        curve = tuple(float(v) for v in spec.split(","))
    except ValueError:
        raise ConfigError(
            f"--fix-curve must be 'embedded' or chances like 0.35,0.14,0.12, got {spec!r}"
        ) from None
    bad = [v for v in curve if not 0.0 <= v <= 1.0]
    if bad:
        raise ConfigError(f"--fix-curve chances must be in [0, 1], got {bad[0]} in {spec!r}")
    return curve
