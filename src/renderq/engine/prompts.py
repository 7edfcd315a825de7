"""Reading a prompts file: plain text (one prompt a line) or JSONL (one object a line).

A JSONL line holds ``prompt`` and optionally ``seed``, ``negative_prompt``, ``width`` and
``height`` (or ``size`` as ``"WxH"`` or ``[W, H]``) and ``steps``. Every problem is
reported with its line number before anything renders.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from renderq.core.errors import ConfigError

_KEYS = frozenset({"prompt", "seed", "negative_prompt", "width", "height", "size", "steps", "id"})


@dataclass(frozen=True, slots=True)
class PromptSpec:
    """One prompt of the file with its optional overrides (None: the run's default)."""

    line: int
    prompt: str
    seed: int | None = None
    negative_prompt: str = ""
    width: int | None = None
    height: int | None = None
    steps: int | None = None


def file_digest(path: Path) -> str:
    """SHA-256 of the prompts file (a resumed job must read the same file)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_prompts(path: Path) -> list[PromptSpec]:
    """Parse ``path``; raises ConfigError naming the file and line of the first problem."""
    if not path.is_file():
        raise ConfigError(f"prompts file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc})") from None
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ConfigError(f"{path}: no prompts in the file")
    jsonl = path.suffix.lower() == ".jsonl" or lines[0].lstrip().startswith("{")
    specs = [_parse_line(path, n, line, jsonl) for n, line in enumerate(lines, start=1)]
    return specs


def _parse_line(path: Path, n: int, line: str, jsonl: bool) -> PromptSpec:
    where = f"{path}:{n}"
    if not jsonl:
        if not line.strip():
            raise ConfigError(f"{where}: empty prompt")
        return PromptSpec(n, line.strip())
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: malformed JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: each line must be a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(_KEYS)}")
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError(f"{where}: 'prompt' must be a non-empty string, got {prompt!r}")
    width, height = _size(where, obj)
    negative = obj.get("negative_prompt", "")
    if not isinstance(negative, str):
        raise ConfigError(f"{where}: 'negative_prompt' must be a string, got {negative!r}")
    return PromptSpec(
        line=n,
        prompt=prompt.strip(),
        seed=_int(where, obj, "seed", minimum=0),
        negative_prompt=negative,
        width=width,
        height=height,
        steps=_int(where, obj, "steps", minimum=1),
    )


def _int(where: str, obj: dict[str, Any], name: str, *, minimum: int) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: {name!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _size(where: str, obj: dict[str, Any]) -> tuple[int | None, int | None]:
    size = obj.get("size")
    if size is None:
        return _int(where, obj, "width", minimum=1), _int(where, obj, "height", minimum=1)
    if "width" in obj or "height" in obj:
        raise ConfigError(f"{where}: give either 'size' or 'width'/'height', not both")
    try:
        if isinstance(size, str):
            w, h = (int(v) for v in size.lower().split("x"))
        else:
            w, h = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: 'size' must be 'WxH' or [W, H], got {size!r}") from None
    if w <= 0 or h <= 0:
        raise ConfigError(f"{where}: 'size' must be positive, got {size!r}")
    return w, h
