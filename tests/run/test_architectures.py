"""Each pipeline family's rules on tiny random SD, SDXL, SD3 and Flux pipelines.

The pipelines are built the way diffusers' own tests build theirs (tiny seeded configs),
saved and loaded through ``from_pretrained`` like any checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from renderq.backends.architectures import FAMILIES, GENERIC, Rules, architecture_of, bucket_for
from renderq.backends.diffusers import DiffusersExecutor
from renderq.core.errors import ConfigError
from renderq.core.types import Batch, BatchKey, Request
from renderq.testing import tiny

pytestmark = pytest.mark.slow

FAMILY = {a.name: a for a in FAMILIES}
BUILDERS = {
    "sd": lambda d: tiny.build_tiny_pipeline(d, sample_size=16),
    "sdxl": tiny.build_tiny_sdxl,
    "sd3": tiny.build_tiny_sd3,
    "flux": tiny.build_tiny_flux,
}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    name = str(request.param)
    folder = BUILDERS[name](tmp_path_factory.mktemp(f"tiny-{name}"))
    return name, DiffusersExecutor.load(str(folder), name=f"tiny-{name}")


def _request(ex: DiffusersExecutor, rid: str, prompt: str, seed: int, size: int, **kw: Any) -> Any:
    bucket = ex.prompt_length(prompt).bucket
    key = BatchKey(ex.model, size, size, 2, True, ex.sampler, "fp32", ex.device_class, bucket)
    return Request(rid, prompt, key, base_seed=seed, guidance_scale=5.0, **kw)


def _render(ex: DiffusersExecutor, reqs: list[Request]) -> list[np.ndarray]:
    result = ex.run(Batch(0, reqs[0].key, tuple(reqs), 0.0, len(reqs)))
    assert all(it.ok for it in result.items), [it.error for it in result.items]
    return [np.asarray(it.image, dtype=np.int16) for it in result.items]


def test_each_family_is_recognised(family: Any) -> None:
    name, ex = family
    assert ex.rules.arch is FAMILY[name]


def test_a_request_without_a_negative_prompt_renders_alone_as_in_a_mixed_batch(
    family: Any,
) -> None:
    name, ex = family
    size = 32
    plain = _request(ex, "a", "a red circle", 11, size)
    alone = _render(ex, [plain])[0]
    if name == "flux":
        with pytest.raises(ConfigError, match="would ignore negative_prompt 'blurry'"):
            ex.check_negative_prompt("blurry")
        other = _request(ex, "b", "a blue square", 12, size)
    else:
        ex.check_negative_prompt("blurry")
        other = _request(ex, "b", "a blue square", 12, size, negative_prompt="blurry")
    mixed = _render(ex, [plain, other])
    assert np.abs(mixed[0] - alone).max() <= 1
    assert np.abs(mixed[1] - _render(ex, [other])[0]).max() <= 1


def test_the_negative_prompt_changes_the_image_where_the_family_reads_it(family: Any) -> None:
    name, ex = family
    if name == "flux":
        pytest.skip("flux refuses negative prompts")
    plain = _render(ex, [_request(ex, "a", "a red circle", 11, 32)])[0]
    neg = _render(ex, [_request(ex, "a", "a red circle", 11, 32, negative_prompt="green")])[0]
    assert np.abs(neg - plain).max() > 1


def test_sizes_the_family_cannot_make_are_refused_and_others_render_exactly(
    family: Any,
) -> None:
    _, ex = family
    m = ex.size_multiple
    with pytest.raises(ConfigError, match=f"multiples of {m}"):
        ex.check_size(2 * m + 1, 2 * m)
    ex.check_size(3 * m, 2 * m)
    w, h = (48, 40) if m <= 8 else (3 * m, 2 * m)
    req = _request(ex, "a", "a red circle", 1, w)
    req = Request("a", "a red circle", BatchKey(ex.model, w, h, 2, True, ex.sampler, "fp32",
                  ex.device_class, req.key.prompt_bucket), guidance_scale=5.0)  # fmt: skip
    image = _render(ex, [req])[0]
    assert image.shape[:2] == (h, w)


@pytest.mark.parametrize(
    ("name", "attrs", "multiple"),
    [
        ("sd", {"vae_scale_factor": 8}, 8),
        ("sd", {"vae_scale_factor": 16}, 16),
        ("sdxl", {"vae_scale_factor": 8}, 8),
        ("sd3", {"vae_scale_factor": 8, "patch_size": 2}, 16),
        ("flux", {"vae_scale_factor": 8}, 16),
    ],
)
def test_full_size_multiples(name: str, attrs: dict[str, int], multiple: int) -> None:
    rules = Rules(FAMILY[name], SimpleNamespace(**attrs))
    assert rules.size_multiple == multiple
    with pytest.raises(ConfigError, match=rf"size 1028x1024 .*\({name}\).*multiples of"):
        rules.check_size("m", 1028, 1024)
    rules.check_size("m", 1024, 64 * multiple)


def test_an_unknown_pipeline_gets_the_generic_rules_with_a_warning() -> None:
    class PixelPipeline:
        vae_scale_factor = 4

    with pytest.warns(UserWarning, match="no rules for PixelPipeline"):
        arch = architecture_of(PixelPipeline())
    assert arch is GENERIC and Rules(arch, PixelPipeline()).size_multiple == 8


def test_t5_prompts_are_bucketed_and_rendered_at_their_bucket(family: Any) -> None:
    name, ex = family
    short, long = "a red circle", "a red circle " * 8  # ~12 and ~104 character tokens
    if name in ("sd", "sdxl"):
        assert ex.prompt_length(short).bucket == ex.prompt_length(long).bucket == 0
        return
    assert ex.prompt_length(short).bucket == 64 and ex.prompt_length(long).bucket == 128
    calls: list[dict[str, Any]] = []

    class Spy:
        inner = ex.pipeline

        def __getattr__(self, attr: str) -> Any:
            return getattr(ex.pipeline, attr)

        def __call__(self, **kwargs: Any) -> Any:
            calls.append(kwargs)
            return ex.pipeline(**kwargs)

    spied = DiffusersExecutor(Spy(), ex.model)
    _render(spied, [_request(ex, "a", short, 1, 32), _request(ex, "b", short + "s", 2, 32)])
    assert [c["max_sequence_length"] for c in calls] == [64]


def test_truncated_prompts_are_reported_per_encoder(family: Any) -> None:
    name, ex = family
    words = "a red circle and " * 30  # 510 characters: past CLIP's 77 and T5's limits
    cut = ex.prompt_length(words).truncated
    assert any(c.startswith("tokenizer: ") and "limit 77" in c for c in cut)
    if name in ("sd3", "flux"):
        t5 = ex.rules.arch.t5_tokenizer
        assert any(c.startswith(f"{t5}: ") for c in cut) == (len(words) + 1 > ex.rules.t5_limit())
    assert ex.prompt_length("a red circle").truncated == ()


def test_bucket_edges() -> None:
    assert [bucket_for(n, 512) for n in (1, 64, 65, 128, 129, 256, 257, 600)] == [
        64, 64, 128, 128, 256, 256, 512, 512,
    ]  # fmt: skip
    assert bucket_for(200, 256) == 256 and bucket_for(300, 256) == 256


def test_a_job_reports_truncated_prompts_and_refuses_what_the_model_would_ignore(
    tmp_path: Path, family: Any
) -> None:
    import json

    from renderq.backends.null import NullScorer
    from renderq.core.settings import ModelSpec, QASettings
    from renderq.jobs.runner import RunSettings, run_job

    name, ex = family
    long = "a red circle and " * 6  # 102 characters: past CLIP's 77 tokens
    lines = [{"prompt": long, "size": "32x32"}, {"prompt": "a blue square", "size": "32x32"}]
    if name == "flux":
        lines[1]["negative_prompt"] = "blurry"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = RunSettings(prompts, tmp_path / "out", ModelSpec(ex.model, steps=2), qa=QASettings(-1.0))
    notices: list[str] = []
    if name == "flux":
        with pytest.raises(ConfigError, match=r"p.jsonl:2: .*would ignore negative_prompt"):
            run_job(s, executor=ex, scorer=NullScorer(), warn=notices.append)
        return
    run_job(s, executor=ex, scorer=NullScorer(), warn=notices.append)
    assert len(notices) == 1 and "1 prompt(s)" in notices[0] and "line 1 (tokenizer: " in notices[0]
    rows = [json.loads(x) for x in (s.out / "metadata.jsonl").read_text().splitlines()]
    cut = {r["prompt"]: r["truncated"] for r in rows}
    assert cut["a blue square"] == [] and cut[long.strip()][0].startswith("tokenizer: ")


def test_no_prompt_buckets_renders_every_t5_prompt_at_the_full_padding(
    tmp_path: Path, family: Any
) -> None:
    import json

    from renderq.backends.null import NullScorer
    from renderq.core.settings import ModelSpec, QASettings
    from renderq.jobs.runner import RunSettings, run_job

    name, ex = family
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle\n" + "a red circle " * 8 + "\n")

    def buckets(out: str, on: bool) -> list[int]:
        s = RunSettings(prompts, tmp_path / out, ModelSpec(ex.model, steps=2),
                        qa=QASettings(-1.0), prompt_buckets=on)  # fmt: skip
        run_job(s, executor=ex, scorer=NullScorer())
        rows = [json.loads(x) for x in (s.out / "metadata.jsonl").read_text().splitlines()]
        return [r["prompt_bucket"] for r in rows]

    full = ex.rules.t5_limit()
    if name in ("sd", "sdxl"):  # CLIP-77 only: one bucket either way
        assert buckets("on", True) == buckets("off", False) == [0, 0]
        return
    assert buckets("on", True) == [64, 128] and buckets("off", False) == [full, full]
    assert full == {"sd3": 256, "flux": 512}[name]
    # Resuming a job with the other switch would mix paddings: refused, naming it.
    s = RunSettings(prompts, tmp_path / "off", ModelSpec(ex.model, steps=2),
                    qa=QASettings(-1.0), prompt_buckets=True)  # fmt: skip
    with pytest.raises(ConfigError, match="prompt_buckets"):
        run_job(s, executor=ex, scorer=NullScorer())
