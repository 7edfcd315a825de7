"""The deterministic seed schedule for regenerations.

Attempt 0 uses the caller's seed as given, so a user who asks for seed 42 gets seed 42.
Attempt ``k >= 1`` uses ``splitmix64(base_seed + k * 0x9E3779B97F4A7C15) mod 2**63``:
the SplitMix64 finaliser spreads consecutive attempts and consecutive base seeds over the
whole range, so the retries of one prompt never collide with another prompt's first seeds
in practice, and the value fits every framework's generator (torch takes < 2**64).
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1
MAX_SEED = (1 << 63) - 1
"""The largest base seed: the store keeps seeds as SQLite's signed 64-bit integers."""
_GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(x: int) -> int:
    """The SplitMix64 output function (Steele et al., 2014) on a 64-bit word."""
    z = x & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def seed_for(base_seed: int, attempt: int) -> int:
    """Seed of attempt ``attempt`` (0-based) of a prompt whose first seed is ``base_seed``."""
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    if attempt == 0:
        return base_seed
    return splitmix64(base_seed + attempt * _GOLDEN) & MAX_SEED
