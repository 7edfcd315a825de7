"""Shipped cost profiles, and loading a profile by name or path."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from renderq.core.cost import Profile
from renderq.core.errors import ProfileError, not_a_file


def shipped() -> list[str]:
    """Names of the profiles shipped with renderq."""
    root = resources.files(__name__)
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def load_profile(name_or_path: str) -> Profile:
    """Load a shipped profile by name, or a profile JSON file by path."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise ProfileError(not_a_file("profile file", name_or_path, path.is_dir()))
        text = path.read_text()
    else:
        res = resources.files(__name__).joinpath(f"{name_or_path}.json")
        if not res.is_file():
            raise ProfileError(f"unknown profile {name_or_path!r}; shipped: {', '.join(shipped())}")
        text = res.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"profile {name_or_path!r} is not valid JSON: {exc}") from None
    return Profile.from_dict(data)
