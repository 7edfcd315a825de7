"""The package's import rules (docs/architecture.md), read from the source with ``ast``.

- ``renderq.core`` imports the standard library and itself only.
- A module imports only its own layer or the layers below it; ``TYPE_CHECKING`` imports
  count (they are how two modules came to need each other).
- No two modules import each other.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src" / "renderq"

#: Each top-level package's layer, lowest first. Packages of one layer may import each
#: other's modules (executors and scorers are both backends).
LAYERS: dict[str, int] = {
    "core": 0,
    "profiles": 1, "store": 1, "output": 1,
    "backends": 2, "models": 2, "testing": 2,
    "runtime": 3,
    "jobs": 4,
    "service": 5, "bench": 5, "cli": 6, "__main__": 7,
}  # fmt: skip


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    name = ".".join(("renderq", *parts))
    return name.removesuffix(".__init__")


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """renderq modules ``path`` imports; ``from pkg import sub`` counts as ``pkg.sub``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("renderq"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("renderq"):
                continue
            subs = {f"{node.module}.{a.name}" for a in node.names}
            found = subs & known
            out.update(found or {node.module})
    return out


def _stdlib_only(path: Path) -> list[str]:
    bad = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
            else []
        )
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and not name.startswith("renderq.core"):
                bad.append(name)
    return bad


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__main__"
    return LAYERS.get(top, -1)


def test_every_package_has_a_layer() -> None:
    tops = {m.split(".")[1] for m in _modules() if "." in m}
    assert tops <= set(LAYERS), f"add {sorted(tops - set(LAYERS))} to LAYERS and the docs"


def test_the_core_imports_the_standard_library_only() -> None:
    bad = {
        m: names
        for m, p in _modules().items()
        if m.startswith("renderq.core") and (names := _stdlib_only(p))
    }
    assert bad == {}


def test_no_module_imports_a_higher_layer() -> None:
    mods = _modules()
    known = set(mods)
    upward = [
        f"{m} -> {dep}"
        for m, p in mods.items()
        for dep in _imports(p, known)
        if dep != "renderq" and _layer(dep) > _layer(m)
    ]
    assert upward == []


def test_no_two_modules_import_each_other() -> None:
    mods = _modules()
    known = set(mods)
    deps = {m: _imports(p, known) for m, p in mods.items()}
    pairs = sorted(
        {tuple(sorted((a, b))) for a, ds in deps.items() for b in ds if a in deps.get(b, ())}
    )
    assert pairs == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from renderq.jobs import runner\n", {"renderq.jobs.runner"}),
        ("import renderq.core.types\n", {"renderq.core.types"}),
        ("from renderq.core.types import Batch\n", {"renderq.core.types"}),
    ],
)
def test_imports_are_read_as_modules(tmp_path: Path, source: str, expected: set[str]) -> None:
    f = tmp_path / "m.py"
    f.write_text(source)
    assert _imports(f, set(_modules())) == expected


def test_the_runtime_sees_the_core_and_the_protocols_only() -> None:
    """The engine step runs any executor: it may not reach for a concrete backend.

    The one exception is the simulator's virtual executor, which lives on its clock.
    """
    mods = _modules()
    known = set(mods)
    allowed = ("renderq.core", "renderq.runtime", "renderq.backends.simulated")
    bad = [
        f"{m} -> {dep}"
        for m, p in mods.items()
        if m.startswith("renderq.runtime")
        for dep in _imports(p, known)
        if not dep.startswith(allowed)
    ]
    assert bad == []
