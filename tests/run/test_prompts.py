"""Reading prompts files: text and JSONL, and the errors with line numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from renderq.core.errors import ConfigError
from renderq.jobs.prompts import read_prompts


def test_text_file_one_prompt_a_line(tmp_path: Path) -> None:
    p = tmp_path / "p.txt"
    p.write_text("a red circle\n  a blue square  \n\n", encoding="utf-8")
    specs = read_prompts(p)
    assert [s.prompt for s in specs] == ["a red circle", "a blue square"]
    assert [s.line for s in specs] == [1, 2]


def test_jsonl_with_overrides(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text(
        '{"prompt": "a red circle", "seed": 7, "negative_prompt": "blur", "size": "64x32"}\n'
        '{"prompt": "a blue square", "width": 16, "height": 48, "steps": 5}\n',
        encoding="utf-8",
    )
    a, b = read_prompts(p)
    assert (a.seed, a.negative_prompt, a.width, a.height, a.steps) == (7, "blur", 64, 32, None)
    assert (b.seed, b.width, b.height, b.steps) == (None, 16, 48, 5)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("p.txt", "a red circle\n   \na blue square\n", "p.txt:2: empty prompt"),
        ("p.jsonl", '{"prompt": "ok"}\n{"prompt": "ok",\n', "p.jsonl:2: malformed JSON"),
        ("p.jsonl", '{"prompt": "ok"}\n{"prompt": ""}\n', "p.jsonl:2: 'prompt' must be"),
        ("p.jsonl", '{"prompt": "ok", "sede": 1}\n', "p.jsonl:1: unknown field(s) ['sede']"),
        ("p.jsonl", '{"prompt": "ok", "seed": -1}\n', "p.jsonl:1: 'seed' must be an integer"),
        ("p.jsonl", '{"prompt": "ok", "size": "big"}\n', "p.jsonl:1: 'size' must be"),
        ("p.jsonl", "[1, 2]\n", "p.jsonl:1: each line must be a JSON object"),
        ("p.txt", "\n\n", "no prompts"),
        (
            "p.txt",
            'a red circle\n{"prompt": "a blue square", "seed": 7}\n',
            "p.txt:2: a JSONL line in a plain-text prompts file",
        ),
    ],
)
def test_bad_input_names_the_line(tmp_path: Path, name: str, text: str, message: str) -> None:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        read_prompts(p)
    assert message in str(info.value)


def test_a_plain_prompt_may_start_with_a_brace(tmp_path: Path) -> None:
    p = tmp_path / "p.txt"
    p.write_text("a red circle\n{red} circle, not JSON\n", encoding="utf-8")
    assert [s.prompt for s in read_prompts(p)] == ["a red circle", "{red} circle, not JSON"]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_prompts(tmp_path / "nope.txt")


def test_a_folder_is_named_as_a_folder_wherever_a_file_is_read(tmp_path: Path) -> None:
    from renderq.backends.calibrate import read_set
    from renderq.core.errors import ProfileError
    from renderq.profiles import load_profile
    from renderq.runtime.arrivals import read_trace
    from renderq.service.config import load_config

    folder = str(tmp_path)
    for read in (read_prompts, read_trace, load_config, read_set):
        with pytest.raises(ConfigError, match=f"'{folder}' is a folder, not a file"):
            read(tmp_path)
    with pytest.raises(ProfileError, match=f"'{folder}' is a folder, not a file"):
        load_profile(folder)
