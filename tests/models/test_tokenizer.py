"""The world's CLIPTokenizer, built from vocab.json and merges.txt."""

from __future__ import annotations

from pathlib import Path

import pytest

from renderq.models.shapes import tokenizer, world

pytest.importorskip("transformers")


def test_every_world_word_is_one_token(tmp_path: Path) -> None:
    tok = tokenizer.build_tokenizer(tmp_path)
    for word in world.vocabulary():
        ids = tok(word)["input_ids"]
        assert len(ids) == 3, (word, tok.convert_ids_to_tokens(ids))
    assert (tmp_path / "vocab.json").exists() and (tmp_path / "merges.txt").exists()


def test_longest_caption_fits(tmp_path: Path) -> None:
    tok = tokenizer.build_tokenizer(tmp_path)
    longest = "a large yellow triangle and a small purple circle on a orange background"
    ids = tok(longest)["input_ids"]
    assert len(ids) <= tokenizer.MAX_LENGTH
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id


def test_unknown_word_falls_back_to_letters(tmp_path: Path) -> None:
    tok = tokenizer.build_tokenizer(tmp_path)
    ids = tok("zebra")["input_ids"]
    assert len(ids) > 3
    assert tok.unk_token_id not in ids[1:-1]
