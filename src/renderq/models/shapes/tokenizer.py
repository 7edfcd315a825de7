"""A ``CLIPTokenizer`` over the shapes world's vocabulary, built from files.

The merges come from a tiny byte-pair-encoding learner run over the world's words, so every
grammar word encodes to exactly one token (BPE replays its own training segmentation).
Letters and their end-of-word forms stay in the vocabulary, so an unseen word still
tokenizes into letters instead of failing.
"""

from __future__ import annotations

import itertools
import json
import string
from collections import Counter
from pathlib import Path
from typing import Any

from renderq.models.shapes.world import vocabulary

MAX_LENGTH = 16
"""Token positions of the text tower (start + words + end + padding); captions fit in 14."""

BOS = "<|startoftext|>"
EOS = "<|endoftext|>"


def learn_merges(words: list[str]) -> list[tuple[str, str]]:
    """Learn BPE merges until every word in ``words`` is a single symbol."""
    pieces = {w: [*w[:-1], w[-1] + "</w>"] for w in words}
    merges: list[tuple[str, str]] = []
    while True:
        counts: Counter[tuple[str, str]] = Counter()
        for symbols in pieces.values():
            for pair in itertools.pairwise(symbols):
                counts[pair] += 1
        if not counts:
            return merges
        # Ties break on the pair itself so the merge list is reproducible.
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        for word, symbols in pieces.items():
            out: list[str] = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            pieces[word] = out


def write_tokenizer_files(folder: Path) -> Path:
    """Write ``vocab.json`` and ``merges.txt`` for the world's vocabulary into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    merges = learn_merges(vocabulary())
    tokens: list[str] = []
    for letter in string.ascii_lowercase:
        tokens += [letter, letter + "</w>"]
    for left, right in merges:
        if left + right not in tokens:
            tokens.append(left + right)
    tokens += [BOS, EOS]
    (folder / "vocab.json").write_text(
        json.dumps({tok: i for i, tok in enumerate(tokens)}, indent=0), encoding="utf-8"
    )
    lines = ["#version: 0.2", *(f"{a} {b}" for a, b in merges)]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def build_tokenizer(folder: Path) -> Any:
    """Write the files into ``folder`` and load them as a ``transformers.CLIPTokenizer``."""
    from transformers import CLIPTokenizer

    write_tokenizer_files(folder)
    return CLIPTokenizer(
        vocab=str(folder / "vocab.json"),
        merges=str(folder / "merges.txt"),
        model_max_length=MAX_LENGTH,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=EOS,
    )
