"""Accepted share of a `renderq run` on the embedded model, by the prompt's caption form.

Reads the run's output folder (`metadata.jsonl` holds the accepted images, `review.jsonl`
the escalated prompts) and splits its prompts into full captions (every size word and the
background clause) and short ones, and by shape count. The demo's prompt file mixes the
two forms so that this split can be read off `make demo`'s folder.

Run: ``python benchmarks/demo_forms.py demo-out``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from renderq.models.shapes import world


def form(prompt: str) -> tuple[str, int]:
    """``("full" | "short", shape count)`` of a grammar prompt."""
    parsed = world.parse_caption(prompt)
    full = parsed.background is not None and all(s is not None for _, _, s in parsed.shapes)
    return ("full" if full else "short"), len(parsed.shapes)


def read_rows(folder: Path, name: str) -> list[dict[str, object]]:
    """The JSON lines of ``folder/name`` (none when the file is absent)."""
    path = folder / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the run's --out folder")
    folder = parser.parse_args().out
    accepted = {str(r["id"]): str(r["prompt"]) for r in read_rows(folder, "metadata.jsonl")}
    escalated = {str(r["id"]): str(r["prompt"]) for r in read_rows(folder, "review.jsonl")}
    if not accepted and not escalated:
        raise SystemExit(f"error: no metadata.jsonl or review.jsonl rows under {folder}")
    total: Counter[tuple[str, int]] = Counter()
    passed: Counter[tuple[str, int]] = Counter()
    for rid, prompt in {**escalated, **accepted}.items():
        key = form(prompt)
        total[key] += 1
        passed[key] += rid in accepted
    print("| prompts | accepted | of | share |")
    print("|---|---|---|---|")
    for label in ("full", "short"):
        for shapes in (1, 2, None):
            keys = [k for k in total if k[0] == label and (shapes is None or k[1] == shapes)]
            n, a = sum(total[k] for k in keys), sum(passed[k] for k in keys)
            name = f"{label}, {'all' if shapes is None else f'{shapes} shape(s)'}"
            print(f"| {name} | {a} | {n} | {a / n:.1%} |" if n else f"| {name} | 0 | 0 | - |")


if __name__ == "__main__":
    main()
