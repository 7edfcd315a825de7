"""Arrival processes for the simulator and the bench: when each request shows up.

Spec strings (as on the command line):

- ``offline``: everything at t=0 (MLPerf's Offline scenario);
- ``poisson:RATE``: exponential gaps at RATE requests per second (the Server scenario);
- ``burst:SIZE@PERIOD``: SIZE requests at once every PERIOD seconds;
- ``trace:PATH``: one arrival per line, either a bare number of seconds or a JSON object
  with ``"t"`` (and optional ``"priority"``, ``"deadline_s"``, ``"prompt"``, ``"lora"``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from renderq.core.errors import ConfigError, not_a_file


@dataclass(frozen=True, slots=True)
class Arrival:
    """One arrival: its time and optional per-request settings from a trace."""

    t: float
    priority: int = 0
    deadline_s: float | None = None
    prompt: str | None = None
    #: The LoRA adapter label (``"ink"``, ``"ink@0.8"``) the request renders with; "": none.
    lora: str = ""
    #: Denoising steps the request renders with; 0: the profile's.
    steps: int = 0


def _positive(spec: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"arrival {spec!r}: {text!r} is not a number") from None
    if not value > 0:
        raise ConfigError(f"arrival {spec!r}: {text!r} must be > 0")
    return value


def arrivals(spec: str, n: int, rng: random.Random) -> list[Arrival]:
    """``n`` arrivals following ``spec`` (a trace gives its own count, capped at ``n``)."""
    if n < 0:
        raise ConfigError(f"number of requests must be >= 0, got {n}")
    kind, _, arg = spec.partition(":")
    if kind == "offline" and not arg:
        return [Arrival(0.0) for _ in range(n)]
    if kind == "poisson":
        rate = _positive(spec, arg)
        t = 0.0
        out = []
        for _ in range(n):
            t += rng.expovariate(rate)
            out.append(Arrival(t))
        return out
    if kind == "burst":
        size_text, _, period_text = arg.partition("@")
        size = int(_positive(spec, size_text))
        period = _positive(spec, period_text)
        return [Arrival((i // size) * period) for i in range(n)]
    if kind == "trace":
        return read_trace(Path(arg))[:n]
    raise ConfigError(
        f"unknown arrival {spec!r}: use offline, poisson:RATE, burst:SIZE@PERIOD or trace:PATH"
    )


def read_trace(path: Path) -> list[Arrival]:
    """Read a trace file; errors name the file and line."""
    if not path.is_file():
        raise ConfigError(not_a_file("trace file", path, path.is_dir()))
    out: list[Arrival] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            if line.startswith("{"):
                obj = json.loads(line)
                deadline = obj.get("deadline_s")
                out.append(
                    Arrival(
                        float(obj["t"]),
                        int(obj.get("priority", 0)),
                        None if deadline is None else float(deadline),
                        obj.get("prompt"),
                        str(obj.get("lora") or ""),
                    )
                )
            else:
                out.append(Arrival(float(line)))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{lineno}: bad trace line {line!r} ({exc})") from None
    return sorted(out, key=lambda a: a.t)


def write_trace(path: Path, items: list[Arrival]) -> None:
    """Write arrivals as a JSONL trace that ``read_trace`` reads back."""
    with path.open("w") as fh:
        for a in items:
            obj: dict[str, object] = {"t": a.t, "priority": a.priority}
            if a.deadline_s is not None:
                obj["deadline_s"] = a.deadline_s
            if a.prompt is not None:
                obj["prompt"] = a.prompt
            if a.lora:
                obj["lora"] = a.lora
            fh.write(json.dumps(obj) + "\n")
