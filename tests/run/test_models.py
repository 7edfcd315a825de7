"""Model ids: the embedded names, and a run on the embedded models once they are shipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from renderq.backends.registry import DEFAULT_MODEL, DEFAULT_SCORER, model_defaults, resolve
from renderq.cli.main import app
from renderq.core.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "renderq" / "examples" / "shapes-200.txt"


def _embedded() -> bool:
    try:
        resolve(DEFAULT_MODEL)
        resolve(DEFAULT_SCORER)
    except ConfigError:
        return False
    return True


def test_plain_ids_pass_through() -> None:
    assert resolve("org/some-model") == "org/some-model"
    assert resolve("./local/folder") == "./local/folder"


def test_unknown_embedded_name() -> None:
    with pytest.raises(ConfigError, match="unknown embedded model 'embedded:nope'"):
        resolve("embedded:nope")


def test_embedded_missing_or_present_is_clear() -> None:
    if _embedded():
        assert Path(resolve(DEFAULT_MODEL), "model_index.json").is_file()
    else:
        with pytest.raises(ConfigError, match="not installed"):
            resolve(DEFAULT_MODEL)
    steps, guidance = model_defaults("some/other-model")
    assert (steps, guidance) == (20, 7.5)


def test_example_prompts_are_shapes_captions() -> None:
    lines = EXAMPLES.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 200 and len(set(lines)) == 200
    world = pytest.importorskip("renderq.models.shapes.world")
    for line in lines:
        world.parse_caption(line)


@pytest.mark.slow
@pytest.mark.skipif(not _embedded(), reason="the embedded models are not built")
def test_run_on_the_embedded_models(tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(EXAMPLES.read_text().splitlines()[:4]) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(prompts), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["accepted"] + summary["escalated"] == 4
    rows = [json.loads(x) for x in (out / "metadata.jsonl").read_text().splitlines()]
    assert all(r["model"] == DEFAULT_MODEL and (out / r["file_name"]).is_file() for r in rows)


def test_fingerprint_follows_the_folder(tmp_path: Path) -> None:
    from renderq.backends.registry import fingerprint

    (tmp_path / "unet").mkdir()
    (tmp_path / "model_index.json").write_text('{"a": 1}')
    (tmp_path / "unet" / "w.bin").write_bytes(b"x" * 10)
    first = fingerprint(str(tmp_path))
    assert first.startswith("sha256:") and fingerprint(str(tmp_path)) == first
    (tmp_path / ".renderq.lock").write_text("123")  # hidden files do not count
    assert fingerprint(str(tmp_path)) == first
    (tmp_path / "unet" / "w.bin").write_bytes(b"y" * 10)  # same size, new weights
    assert fingerprint(str(tmp_path)) != first
    assert fingerprint("org/hub-model") == "org/hub-model"


def test_a_pipeline_folder_gets_its_pipeline_classes_defaults(tiny_model: Path) -> None:
    # The tiny folder is a StableDiffusionPipeline: diffusers' own 50 steps, guidance 7.5.
    assert model_defaults(str(tiny_model)) == (50, 7.5)


def test_prompts_outside_the_embedded_world_get_a_notice_naming_the_words() -> None:
    from renderq.backends.registry import vocabulary_notice

    if not _embedded():
        pytest.skip("the embedded model is not installed")
    prompts = [(1, "a red circle"), (2, "a photo of a dog on a red background"), (3, "a cat")]
    note = vocabulary_notice(DEFAULT_MODEL, prompts)
    assert note is not None and note.startswith("2 prompt(s) use words")
    assert "line 2: 'photo', 'of', 'dog'" in note and "line 3: 'cat'" in note
    assert "for example '" in note
    assert vocabulary_notice(DEFAULT_MODEL, prompts[:1]) is None
    assert vocabulary_notice("some/other-model", prompts) is None
