"""Prompt-length buckets: requests only share a batch when their padded lengths agree.

CLIP text encoders pad every prompt to a fixed 77 tokens, so one bucket serves all
lengths there. T5-style encoders pad to the longest prompt in the batch, and one long
prompt makes every batch-mate pay for it; bucketing by length bounds that waste.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from renderq.core.errors import ConfigError

DEFAULT_EDGES: tuple[int, ...] = (64, 128, 256)


@dataclass(frozen=True, slots=True)
class PromptBuckets:
    """Upper bucket edges in tokens; ``fixed_length=True`` folds everything into bucket 0.

    Bucket ``i`` holds lengths in ``(edges[i-1], edges[i]]``; with the default edges the
    buckets are <=64, 65-128 and 129-256 tokens. A prompt longer than the last edge is an
    error (the encoder would truncate it silently).
    """

    edges: tuple[int, ...] = DEFAULT_EDGES
    fixed_length: bool = False

    def __post_init__(self) -> None:
        if not self.edges:
            raise ConfigError("prompt bucket edges must not be empty")
        if any(e <= 0 for e in self.edges) or list(self.edges) != sorted(set(self.edges)):
            raise ConfigError(
                f"prompt bucket edges must be positive and strictly increasing, got {self.edges}"
            )

    @classmethod
    def parse(cls, text: str) -> PromptBuckets:
        """Parse ``"64,128,256"`` (or ``"fixed"``) as given on a command line."""
        if text.strip().lower() == "fixed":
            return cls(fixed_length=True)
        try:
            edges = tuple(int(p) for p in text.split(","))
        except ValueError:
            raise ConfigError(f"prompt bucket edges must be integers, got {text!r}") from None
        return cls(edges=edges)

    def bucket(self, n_tokens: int) -> int:
        """Bucket index of a prompt of ``n_tokens`` tokens."""
        if n_tokens < 0:
            raise ConfigError(f"token count must be >= 0, got {n_tokens}")
        if self.fixed_length:
            return 0
        for i, edge in enumerate(self.edges):
            if n_tokens <= edge:
                return i
        raise ConfigError(
            f"prompt of {n_tokens} tokens is longer than the last bucket edge {self.edges[-1]}"
        )

    def bounds(self) -> Sequence[tuple[int, int]]:
        """Inclusive ``(low, high)`` token range of each bucket."""
        lows = (1, *(e + 1 for e in self.edges[:-1]))
        return list(zip(lows, self.edges, strict=True))
