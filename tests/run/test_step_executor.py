"""The step-level executor against the whole-batch path: embedded mini-SD, tiny SDXL, SD3, Flux.

Equality is checked two ways. In float32, a running batch that starts together with one
step count is the same computation as one pipeline call and must match it to 1e-4. With
requests joining mid-way and different step counts, a request's rows ride in running
batches of other sizes than any whole-batch call; on a CPU, float32 kernels round
differently by batch size (the whole-batch path itself moves by ~2e-4 between a request
alone and in a batch of three on the embedded model), so those cases run both paths in
float64, where that rounding is far below 1e-4 and any real difference (a wrong timestep,
guidance scale or scheduler state) is not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from renderq.backends.diffusers import DiffusersExecutor
from renderq.backends.registry import resolve
from renderq.backends.step import StepExecutor, StepState
from renderq.core.errors import ConfigError
from renderq.core.settings import ModelSpec, key_for
from renderq.core.types import Batch, Request
from renderq.testing import tiny

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

TOL = 1e-4
PROMPTS = ["a small red circle", "a large green square", "a small blue triangle", "a red square"]


@pytest.fixture(scope="module")
def mini32() -> DiffusersExecutor:
    """The embedded mini-SD in float32 (its DDIM scheduler)."""
    return DiffusersExecutor.load(resolve("embedded:mini-sd"), name="mini-sd")


@pytest.fixture(scope="module")
def mini64() -> DiffusersExecutor:
    """The embedded mini-SD cast to float64 (see the module docstring)."""
    ex = DiffusersExecutor.load(resolve("embedded:mini-sd"), name="mini-sd")
    ex.pipeline.to(torch.float64)
    return ex


@pytest.fixture
def sampler(request: pytest.FixtureRequest, mini64: DiffusersExecutor) -> Iterator[str]:
    """Swap the float64 pipeline's scheduler for the one named (None: its own DDIM)."""
    import diffusers

    name = request.param
    own = mini64.pipeline.scheduler
    if name is not None:
        mini64.pipeline.scheduler = getattr(diffusers, name).from_config(own.config)
    try:
        yield type(mini64.pipeline.scheduler).__name__
    finally:
        mini64.pipeline.scheduler = own


def _req(ex: DiffusersExecutor, i: int, steps: int, guidance: float = 7.5, **kw: Any) -> Request:
    w, h = ex.default_size()
    key = key_for(ex.model, w, h, steps, guidance, ex.sampler, "fp32", ex.device_class)
    return Request(f"r{i}", PROMPTS[i % len(PROMPTS)], key, 300 + i, guidance_scale=guidance, **kw)


def _whole_batch(ex: DiffusersExecutor, reqs: Sequence[Request]) -> list[Any]:
    """Float images of one whole-batch pipeline call (the diffusers executor's own call)."""
    return list(ex._call(reqs))


def _drive(st: StepExecutor, plan: dict[int, list[Request]]) -> tuple[dict[str, Any], int]:
    """Run requests that join at the step numbers in ``plan``; images by id and steps run."""
    running: list[StepState] = []
    images: dict[str, Any] = {}
    n = 0
    while running or any(k >= n for k in plan):
        running += [st.prepare(r) for r in plan.get(n, [])]
        if running:
            st.step(running)
            done = [s for s in running if s.done]
            images.update(zip([s.request.id for s in done], st.images(done), strict=True))
            running = [s for s in running if not s.done]
        n += 1
    return images, n


def test_a_batch_that_starts_together_equals_one_pipeline_call(mini32: DiffusersExecutor) -> None:
    reqs = [_req(mini32, i, 5, guidance=7.5) for i in range(3)]
    ref = _whole_batch(mini32, reqs)
    got, _ = _drive(StepExecutor(mini32.pipeline, mini32.model), {0: reqs})
    for r, image in zip(reqs, ref, strict=True):
        assert got[r.id].shape == image.shape == (64, 64, 3)
        assert np.abs(got[r.id] - image).max() <= TOL
    # The tolerance discriminates: two seeds differ by far more than it.
    assert np.abs(got["r0"] - got["r1"]).max() > 100 * TOL


@pytest.mark.parametrize(
    "sampler", [None, "DPMSolverMultistepScheduler", "UniPCMultistepScheduler"], indirect=True
)
def test_joins_and_mixed_step_counts_equal_the_whole_batch_path(
    mini64: DiffusersExecutor, sampler: str
) -> None:
    """Two start, one joins after two steps; 4, 6 and 5 steps; guidance 7.5, 3.0 and 5.0."""
    a = _req(mini64, 0, 4)
    b = _req(mini64, 1, 6, guidance=3.0, negative_prompt="blurry")
    c = _req(mini64, 2, 5, guidance=5.0)
    got, _ = _drive(StepExecutor(mini64.pipeline, mini64.model), {0: [a, b], 2: [c]})
    for r in (a, b, c):
        (ref,) = _whole_batch(mini64, [r])
        assert np.abs(got[r.id] - ref).max() <= TOL, (sampler, r.id)
    assert np.abs(got["r0"] - got["r2"]).max() > 100 * TOL


def test_a_paused_request_resumes_where_it_stopped(mini64: DiffusersExecutor) -> None:
    """Preemption at a step boundary keeps latents and scheduler state: same image."""
    st = StepExecutor(mini64.pipeline, mini64.model)
    bulk, urgent = _req(mini64, 0, 5), _req(mini64, 3, 3)
    s = st.prepare(bulk)
    st.step([s])
    st.step([s])
    u = st.prepare(urgent)
    while not u.done:  # the bulk request waits, its state untouched
        st.step([u])
    while not s.done:
        st.step([s])
    for state in (s, u):
        (ref,) = _whole_batch(mini64, [state.request])
        assert np.abs(st.images([state])[0] - ref).max() <= TOL


def test_device_seconds_are_shared_out_exactly(mini32: DiffusersExecutor) -> None:
    st = StepExecutor(mini32.pipeline, mini32.model)
    a, b = st.prepare(_req(mini32, 0, 2)), st.prepare(_req(mini32, 1, 3))
    prepared = a.device_seconds + b.device_seconds
    assert a.device_seconds > 0 and b.device_seconds > 0
    spent = st.step([a, b]) + st.step([a, b])
    decoded_a = a.device_seconds
    st.images([a])
    decode_a = a.device_seconds - decoded_a
    spent += st.step([b])
    before_b = b.device_seconds
    st.images([b])
    decode_b = b.device_seconds - before_b
    assert a.device_seconds + b.device_seconds == pytest.approx(
        prepared + spent + decode_a + decode_b, rel=1e-9
    )


def test_run_renders_a_batch_of_mixed_step_counts(mini32: DiffusersExecutor) -> None:
    st = StepExecutor(mini32.pipeline, mini32.model)
    reqs = (_req(mini32, 0, 2), _req(mini32, 1, 4), _req(mini32, 2, 3))
    result = st.run(Batch(7, reqs[0].key, reqs, 0.0, 3))
    assert [it.request_id for it in result.items] == ["r0", "r1", "r2"]
    assert all(it.ok and it.image.dtype == np.uint8 for it in result.items)
    assert result.batch_id == 7 and result.device_seconds > 0


def test_bad_running_batches_are_refused(mini32: DiffusersExecutor) -> None:
    st = StepExecutor(mini32.pipeline, mini32.model)
    cfg, plain = st.prepare(_req(mini32, 0, 2)), st.prepare(_req(mini32, 1, 2, guidance=1.0))
    with pytest.raises(ConfigError, match="cannot share a step"):
        st.step([cfg, plain])
    with pytest.raises(ConfigError, match="2 denoising steps left"):
        st.images([cfg])
    st.step([cfg])
    st.step([cfg])
    with pytest.raises(ConfigError, match="no denoising step left"):
        st.step([cfg])


def test_sdxl_joins_mid_way_and_equals_the_whole_batch_path(tmp_path: Path) -> None:
    """Tiny SDXL (Euler): per-request step index, pooled embeddings, time ids, zeros."""
    ex = DiffusersExecutor.load(str(tiny.build_tiny_sdxl(tmp_path)), name="tiny-sdxl")
    ex.pipeline.to(torch.float64)
    a, b = _req(ex, 0, 3, guidance=5.0), _req(ex, 1, 4, guidance=3.0, negative_prompt="dark")
    c = _req(ex, 2, 2, guidance=5.0)
    got, _ = _drive(StepExecutor(ex.pipeline, ex.model), {0: [a, b], 1: [c]})
    for r in (a, b, c):
        (ref,) = _whole_batch(ex, [r])
        assert np.abs(got[r.id] - ref).max() <= TOL, r.id


@pytest.mark.parametrize("shifting", [False, True])
def test_sd3_flow_matching_joins_mid_way_and_equals_the_whole_batch_path(
    tmp_path: Path, shifting: bool
) -> None:
    """Tiny SD3 (FlowMatchEuler, with and without resolution-dependent shifting), float32."""
    import diffusers

    ex = DiffusersExecutor.load(str(tiny.build_tiny_sd3(tmp_path)), name="tiny-sd3")
    if shifting:
        config = ex.pipeline.scheduler.config
        ex.pipeline.scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(
            config, use_dynamic_shifting=True
        )
    w, h = ex.default_size()

    def sd3(i: int, steps: int, guidance: float, negative: str = "") -> Request:
        prompt = PROMPTS[i]
        bucket = ex.prompt_length(prompt).bucket
        key = key_for(ex.model, w, h, steps, guidance, ex.sampler, "fp32", "cpu", bucket)
        return Request(f"r{i}", prompt, key, 500 + i, guidance_scale=guidance,
                       negative_prompt=negative)  # fmt: skip

    a, b, c = sd3(0, 3, 5.0), sd3(1, 4, 3.0, "dark"), sd3(2, 2, 5.0)
    got, _ = _drive(StepExecutor(ex.pipeline, ex.model), {0: [a, b], 1: [c]})
    for r in (a, b, c):
        (ref,) = _whole_batch(ex, [r])
        assert np.abs(got[r.id] - ref).max() <= TOL, r.id
    assert np.abs(got["r0"] - got["r2"]).max() > 100 * TOL


@pytest.mark.parametrize("embedded_guidance", [True, False])
def test_flux_joins_mid_way_and_equals_the_whole_batch_path(
    tmp_path: Path, embedded_guidance: bool
) -> None:
    """Tiny Flux: packed latents, shifted sigmas, guidance per row as an embedding."""
    ex = DiffusersExecutor.load(str(tiny.build_tiny_flux(tmp_path)), name="tiny-flux")
    ex.pipeline.transformer.register_to_config(guidance_embeds=embedded_guidance)
    if not embedded_guidance:
        ex.pipeline.transformer.time_text_embed = _without_guidance(ex.pipeline.transformer)
    w, h = ex.default_size()

    def flux(i: int, steps: int, guidance: float) -> Request:
        prompt = PROMPTS[i]
        bucket = ex.prompt_length(prompt).bucket
        key = key_for(ex.model, w, h, steps, guidance, ex.sampler, "fp32", "cpu", bucket)
        return Request(f"r{i}", prompt, key, 700 + i, guidance_scale=guidance)

    a, b, c = flux(0, 3, 3.5), flux(1, 4, 5.0), flux(2, 2, 3.5)
    got, _ = _drive(StepExecutor(ex.pipeline, ex.model), {0: [a, b], 1: [c]})
    for r in (a, b, c):
        (ref,) = _whole_batch(ex, [r])
        assert np.abs(got[r.id] - ref).max() <= TOL, r.id
    assert np.abs(got["r0"] - got["r2"]).max() > 100 * TOL
    # A negative prompt is refused by name, as the whole-batch path refuses it.
    st = StepExecutor(ex.pipeline, ex.model)
    with pytest.raises(ConfigError, match="tiny-flux"):
        st.prepare(dataclasses.replace(a, negative_prompt="dark"))


def _without_guidance(transformer: Any) -> Any:
    """The transformer's time-and-text embedding without its guidance branch (as a Flux
    checkpoint without guidance embeds, e.g. Schnell, builds it)."""
    from diffusers.models.embeddings import CombinedTimestepTextProjEmbeddings

    old = transformer.time_text_embed
    new = CombinedTimestepTextProjEmbeddings(
        embedding_dim=old.timestep_embedder.linear_2.out_features,
        pooled_projection_dim=old.text_embedder.linear_1.in_features,
    )
    new.timestep_embedder.load_state_dict(old.timestep_embedder.state_dict())
    new.text_embedder.load_state_dict(old.text_embedder.state_dict())
    return new


def test_step_level_profile_measures_steps_by_running_batch_size(
    mini32: DiffusersExecutor,
) -> None:
    from renderq.bench.model_profile import ProfileSettings
    from renderq.bench.step_profile import profile_loaded_steps
    from renderq.core.step import StepCost

    st = StepExecutor(mini32.pipeline, "embedded:mini-sd")
    s = ProfileSettings(ModelSpec("embedded:mini-sd"), max_batch=3, repeats=1, warmup=0)
    doc = profile_loaded_steps(st, s, name="t")
    assert [n for n, _ in doc["step"]["points"]] == [1, 2, 3]
    assert [n for n, _ in doc["decode"]["points"]] == [1, 2, 3]
    assert doc["resolution"] == [64, 64] and doc["source"]["kind"] == "measured"
    cost = StepCost.from_dict(doc)
    assert cost.cap == 3 and cost.prepare_s > 0 and cost.step.latency(2) > 0


def test_profile_step_level_command_writes_a_step_profile(tiny_model: Path, tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from renderq.cli.main import app
    from renderq.core.step import StepCost

    out = tmp_path / "step.json"
    args = ["profile", "--step-level", "--model", str(tiny_model), "--max-batch", "2",
            "--repeats", "1", "--warmup", "0", "--name", "tiny-step",
            "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["name"] == "tiny-step" and doc["resolution"] == [32, 32]
    assert StepCost.from_dict(doc).cap == 2


def test_run_fails_only_the_request_that_cannot_be_prepared(mini32: DiffusersExecutor) -> None:
    st = StepExecutor(mini32.pipeline, mini32.model)
    good = _req(mini32, 0, 2)
    odd = dataclasses.replace(good, id="odd", key=dataclasses.replace(good.key, width=60))
    result = st.run(Batch(1, good.key, (good, odd), 0.0, 2))
    assert result.items[0].ok
    assert not result.items[1].ok and "60x64" in str(result.items[1].error)


def test_run_steps_rows_that_cannot_share_a_step_apart(mini32: DiffusersExecutor) -> None:
    st = StepExecutor(mini32.pipeline, mini32.model)
    cfg, plain = _req(mini32, 0, 2), _req(mini32, 1, 3, guidance=1.0)
    result = st.run(Batch(2, cfg.key, (cfg, plain), 0.0, 2))
    assert all(it.ok for it in result.items), [it.error for it in result.items]
