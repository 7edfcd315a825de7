"""LoRA adapters as part of the batch key: a configured set, loaded once per worker.

A request names an adapter from the configured set and a scale (``"ink"``, ``"ink@0.8"``);
the pair is its batch key's ``adapter``, so a batch never mixes adapters and a worker
switches between batches only. :class:`AdapterSet` loads every configured adapter into
the pipeline once (``load_lora_weights``), activates one per batch (``set_adapters``)
or none (``disable_lora``), and times each switch, so its cost can be measured and
priced apart from rendering.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from renderq.core.errors import ConfigError


def adapter_label(name: str, scale: float = 1.0) -> str:
    """The batch-key form of an adapter and its scale (``"ink@0.8"``; ``"ink"`` at 1)."""
    if not math.isfinite(scale):
        raise ConfigError(f"LoRA scale must be a finite number, got {scale}")
    return name if scale == 1.0 else f"{name}@{scale:g}"


def parse_label(label: str) -> tuple[str, float]:
    """``"ink@0.8"`` -> ``("ink", 0.8)``; ``"ink"`` -> ``("ink", 1.0)``."""
    name, _, scale = label.partition("@")
    if not name:
        raise ConfigError(f"LoRA adapter {label!r} has no name (use NAME or NAME@SCALE)")
    try:
        value = float(scale) if scale else 1.0
    except ValueError:
        raise ConfigError(f"LoRA adapter {label!r}: scale {scale!r} is not a number") from None
    adapter_label(name, value)  # checks the scale
    return name, value


def parse_adapter_paths(specs: list[str]) -> dict[str, str]:
    """``["ink=/loras/ink", ...]`` -> ``{"ink": "/loras/ink"}`` (the ``--lora`` option)."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--lora takes NAME=PATH, got {spec!r}")
        if "@" in name:
            raise ConfigError(f"--lora name {name!r} may not contain '@' (it separates scales)")
        if name in out:
            raise ConfigError(f"--lora {name!r} is given twice")
        out[name] = path
    return out


@dataclass(slots=True)
class AdapterSet:
    """The adapters a worker's pipeline holds, and which one is active."""

    paths: Mapping[str, str]
    active: str = ""
    #: Switches made and the seconds they took (included in their batch's device time).
    switches: int = 0
    switch_s: float = 0.0
    _loaded: bool = field(default=False, repr=False)

    def check(self, label: str) -> None:
        """Raise ConfigError unless ``label`` names a configured adapter with a valid scale."""
        if not label:
            return
        name, _ = parse_label(label)
        if name not in self.paths:
            known = ", ".join(sorted(self.paths)) or "none (give --lora NAME=PATH)"
            raise ConfigError(f"unknown LoRA adapter {name!r}; configured: {known}")

    def load(self, pipeline: Any) -> None:
        """Load every configured adapter into ``pipeline`` (once), none of them active."""
        if self._loaded or not self.paths:
            return
        for name, path in self.paths.items():
            try:
                with warnings.catch_warnings():
                    # peft warns that a second adapter makes several: that is the point.
                    warnings.filterwarnings("ignore", message=".*multiple adapters.*")
                    pipeline.load_lora_weights(str(Path(path).expanduser()), adapter_name=name)
            except (OSError, ValueError) as exc:
                raise ConfigError(
                    f"cannot load LoRA adapter {name!r} from {path!r}: {exc}"
                ) from exc
        pipeline.disable_lora()
        self._loaded = True

    def activate(self, pipeline: Any, label: str) -> None:
        """Make ``label`` (or no adapter) the active one, timing the switch."""
        if label == self.active:
            return
        start = time.perf_counter()
        if label:
            name, scale = parse_label(label)
            if not self.active:
                pipeline.enable_lora()
            pipeline.set_adapters([name], adapter_weights=[scale])
        else:
            pipeline.disable_lora()
        self.switch_s += time.perf_counter() - start
        self.switches += 1
        self.active = label
