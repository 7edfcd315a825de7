"""Cost and memory models: batch latency and memory per (model profile, device, precision).

A profile is plain data (see ``renderq/profiles/*.json``) that always says where its
numbers came from (``source.kind``: ``measured``, ``claim`` or ``assumption``). Latency is
piecewise linear between measured batch sizes; beyond the largest measured size the model
does not extrapolate, so the largest batch a profile allows is the smaller of what fits in
memory and what was measured.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from renderq.core.errors import ProfileError

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class LatencyCurve:
    """Batch latency in seconds at measured batch sizes, linear in between."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.seconds):
            raise ProfileError("a latency curve needs one latency per measured batch size")
        if list(self.sizes) != sorted(set(self.sizes)) or self.sizes[0] < 1:
            raise ProfileError(f"batch sizes must be >= 1 and increasing, got {self.sizes}")
        if any(not math.isfinite(s) or s <= 0 for s in self.seconds):
            raise ProfileError(f"latencies must be positive, got {self.seconds}")

    @classmethod
    def from_points(cls, points: Sequence[Sequence[float]]) -> LatencyCurve:
        """Build from ``[[batch_size, seconds], ...]`` (any order)."""
        try:
            pts = sorted((int(b), float(s)) for b, s in points)
        except (TypeError, ValueError):
            raise ProfileError(
                f"latency points must be [batch_size, seconds], got {points!r}"
            ) from None
        return cls(tuple(b for b, _ in pts), tuple(s for _, s in pts))

    @property
    def max_size(self) -> int:
        """The largest measured batch size."""
        return self.sizes[-1]

    def latency(self, n: int) -> float:
        """Seconds for a batch of ``n``; below the first point, scaled per image."""
        if n < 1:
            raise ProfileError(f"batch size must be >= 1, got {n}")
        if n > self.max_size:
            raise ProfileError(f"batch size {n} is beyond the measured maximum {self.max_size}")
        i = bisect.bisect_left(self.sizes, n)
        if self.sizes[i] == n:
            return self.seconds[i]
        if i == 0:
            return self.seconds[0] * n / self.sizes[0]
        b0, b1 = self.sizes[i - 1], self.sizes[i]
        s0, s1 = self.seconds[i - 1], self.seconds[i]
        return s0 + (s1 - s0) * (n - b0) / (b1 - b0)

    def best_size(self, cap: int) -> int:
        """The batch size up to ``cap`` with the lowest latency per image."""
        return min(range(1, min(cap, self.max_size) + 1), key=lambda n: self.latency(n) / n)


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """Peak device memory of a batch: ``base + per_image * n`` bytes."""

    base_bytes: float
    per_image_bytes: float
    device_bytes: float

    def __post_init__(self) -> None:
        if self.base_bytes < 0 or self.per_image_bytes <= 0 or self.device_bytes <= 0:
            raise ProfileError(
                "memory model needs base >= 0, per_image > 0 and device > 0, got "
                f"{self.base_bytes}, {self.per_image_bytes}, {self.device_bytes}"
            )

    def peak(self, n: int) -> float:
        """Peak bytes of a batch of ``n``."""
        return self.base_bytes + self.per_image_bytes * n

    def max_fit(self) -> int:
        """The largest batch whose peak fits in the device (0 if none does)."""
        return max(0, int((self.device_bytes - self.base_bytes) // self.per_image_bytes))


@dataclass(frozen=True, slots=True)
class StageCost:
    """Latency (and optionally memory) of one stage (render or score) on one device."""

    curve: LatencyCurve
    memory: MemoryModel | None = None
    #: Seconds a worker takes to make this key's LoRA adapter the active one when it holds
    #: another (0: no adapters, or a switch too cheap to price); measured by
    #: ``renderq profile --lora``. Admission and the fair order across keys price it.
    switch_s: float = 0.0
    #: How much longer a batch takes with a LoRA adapter active than with none (unfused
    #: adapter layers add their own matmuls; 1: not measured); measured by ``renderq
    #: profile --lora``. A key with an adapter is priced at ``adapter_factor`` times the
    #: curve (:meth:`for_adapter`).
    adapter_factor: float = 1.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.switch_s) or self.switch_s < 0:
            raise ProfileError(f"an adapter switch must take >= 0 seconds, got {self.switch_s}")
        if not math.isfinite(self.adapter_factor) or self.adapter_factor <= 0:
            raise ProfileError(f"adapter_factor must be > 0, got {self.adapter_factor}")

    def scaled(self, factor: float) -> StageCost:
        """This cost with every latency times ``factor`` (another step count: a render's
        time is about linear in its steps)."""
        if factor == 1.0:
            return self
        seconds = tuple(s * factor for s in self.curve.seconds)
        return StageCost(
            LatencyCurve(self.curve.sizes, seconds), self.memory, self.switch_s, self.adapter_factor
        )

    def for_adapter(self, adapter: str) -> StageCost:
        """The cost of a key with ``adapter`` ("" for none): the curve times
        ``adapter_factor`` when one is active, this cost itself otherwise."""
        if not adapter or self.adapter_factor == 1.0:
            return self
        return dataclasses.replace(self.scaled(self.adapter_factor), adapter_factor=1.0)

    def cap(self) -> int:
        """The largest batch this stage can run: measured and fitting in memory."""
        fit = self.memory.max_fit() if self.memory else self.curve.max_size
        return min(fit, self.curve.max_size)

    def latency(self, n: int) -> float:
        """Seconds for a batch of ``n``."""
        return self.curve.latency(n)


@dataclass(frozen=True, slots=True)
class Profile:
    """Measured (or claimed) costs of one model on one device class and precision."""

    name: str
    model: str
    device_class: str
    precision: str
    width: int
    height: int
    steps: int
    render: StageCost
    score: StageCost
    source: Mapping[str, str]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """Parse a profile document (the JSON files' schema); errors name the field."""
        try:
            source = dict(data["source"])
            if source.get("kind") not in {"measured", "claim", "assumption"}:
                raise ProfileError(
                    "profile source.kind must be measured, claim or assumption, "
                    f"got {source.get('kind')!r}"
                )
            device_bytes = float(data["device_memory_gib"]) * GIB
            width, height = (int(v) for v in data["resolution"])
            return cls(
                name=str(data["name"]),
                model=str(data["model"]),
                device_class=str(data["device_class"]),
                precision=str(data["precision"]),
                width=width,
                height=height,
                steps=int(data["steps"]),
                render=_stage(data["render"], device_bytes),
                score=_stage(data["score"], device_bytes),
                source=source,
            )
        except KeyError as exc:
            raise ProfileError(f"profile is missing the field {exc.args[0]!r}") from None

    @property
    def render_cap(self) -> int:
        """The largest render batch this profile allows."""
        return self.render.cap()


def _stage(data: Mapping[str, Any], device_bytes: float) -> StageCost:
    curve = LatencyCurve.from_points(data["points"])
    mem = data.get("memory_gib")
    memory = None
    if mem is not None:
        memory = MemoryModel(
            base_bytes=float(mem["base"]) * GIB,
            per_image_bytes=float(mem["per_image"]) * GIB,
            device_bytes=device_bytes,
        )
    return StageCost(
        curve=curve,
        memory=memory,
        switch_s=float(data.get("switch_s", 0.0)),
        adapter_factor=float(data.get("adapter_factor", 1.0)),
    )
