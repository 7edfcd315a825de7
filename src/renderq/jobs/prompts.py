"""Reading a prompts file: plain text (one prompt a line) or JSONL (one object a line).

A JSONL line holds ``prompt`` and optionally ``id`` (the request id in the store and in
``metadata.jsonl``; the image is saved as ``images/<id>.png``), ``seed``,
``negative_prompt``, ``width`` and ``height`` (or ``size`` as ``"WxH"`` or ``[W, H]``) and
``steps``, and ``lora`` (a configured LoRA adapter, ``NAME`` or ``NAME@SCALE``; part of
the batch key). Every problem is reported with its line number before anything renders. A
UTF-8 byte-order mark (as some editors write) is not part of the first prompt.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from renderq.core.errors import ConfigError, not_a_file
from renderq.core.seeds import MAX_SEED

_KEYS = frozenset(
    {"prompt", "seed", "negative_prompt", "width", "height", "size", "steps", "id", "lora"}
)
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def generated_id(index: int) -> str:
    """The request id of the prompt at ``index`` (0-based) when its line names none."""
    return f"p{index:06d}"


@dataclass(frozen=True, slots=True)
class PromptSpec:
    """One prompt of the file with its optional overrides (None: the run's default)."""

    line: int
    prompt: str
    id: str | None = None
    seed: int | None = None
    negative_prompt: str = ""
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    #: A LoRA adapter from the run's configured set, ``NAME`` or ``NAME@SCALE`` ("": none).
    lora: str = ""


def file_digest(path: Path) -> str:
    """SHA-256 of the prompts file (a resumed job must read the same file)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_prompts(path: Path) -> list[PromptSpec]:
    """Parse ``path``; raises ConfigError naming the file and line of the first problem."""
    if not path.is_file():
        raise ConfigError(not_a_file("prompts file", path, path.is_dir()))
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc})") from None
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ConfigError(f"{path}: no prompts in the file")
    jsonl = path.suffix.lower() == ".jsonl" or lines[0].lstrip().startswith("{")
    specs = [_parse_line(path, n, line, jsonl) for n, line in enumerate(lines, start=1)]
    _check_ids(path, specs)
    return specs


def _check_ids(path: Path, specs: list[PromptSpec]) -> None:
    """Every request id (given or generated) names one prompt only."""
    seen: dict[str, int] = {}
    for i, s in enumerate(specs):
        rid = s.id if s.id is not None else generated_id(i)
        if rid in seen:
            raise ConfigError(
                f"{path}:{s.line}: id {rid!r} is already used on line {seen[rid]}; "
                "each prompt needs its own id"
            )
        seen[rid] = s.line


def _parse_line(path: Path, n: int, line: str, jsonl: bool) -> PromptSpec:
    where = f"{path}:{n}"
    if not jsonl:
        if not line.strip():
            raise ConfigError(f"{where}: empty prompt")
        if _json_prompt(line):
            raise ConfigError(
                f"{where}: a JSONL line in a plain-text prompts file (its first line is not "
                "JSON, so every line is read as a prompt): write every line as JSONL, or none"
            )
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
    lora = obj.get("lora", "")
    if not isinstance(lora, str):
        raise ConfigError(f"{where}: 'lora' must be a string NAME or NAME@SCALE, got {lora!r}")
    rid = obj.get("id")
    if rid is not None and (not isinstance(rid, str) or not _ID.fullmatch(rid)):
        raise ConfigError(
            f"{where}: 'id' must be 1-128 letters, digits, '.', '_' or '-' (starting with a "
            f"letter or digit), got {rid!r}"
        )
    return PromptSpec(
        line=n,
        prompt=prompt.strip(),
        id=rid,
        seed=_int(where, obj, "seed", minimum=0, maximum=MAX_SEED),
        negative_prompt=negative,
        width=width,
        height=height,
        steps=_int(where, obj, "steps", minimum=1),
        lora=lora.strip(),
    )


def _json_prompt(line: str) -> bool:
    """Whether a plain-text line is a JSONL prompt object (not a prompt to render)."""
    if not line.lstrip().startswith("{"):
        return False
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(obj, dict) and "prompt" in obj


def _int(
    where: str, obj: dict[str, Any], name: str, *, minimum: int, maximum: int = 2**31 - 1
) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ConfigError(
            f"{where}: {name!r} must be an integer from {minimum} to {maximum}, got {value!r}"
        )
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
