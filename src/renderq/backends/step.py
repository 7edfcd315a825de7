"""The step-level executor: it owns the denoising loop, one step of the running batch at a time.

Whole-batch rendering calls the pipeline once per batch, so a request that arrives while a
batch denoises waits for all of it. Here the loop is split into three calls that a step
policy drives:

- :meth:`StepExecutor.prepare` encodes one request's prompt (and its negative prompt for
  classifier-free guidance), draws its initial latents from its own seeded generator
  exactly as the whole-batch path does, and gives it its own copy of the pipeline's
  scheduler with ``set_timesteps(request's steps)``. Schedulers keep per-instance state
  (Euler's step index, multistep solvers' history), so requests cannot share one.
- :meth:`StepExecutor.step` runs one denoising step over the running batch: latents
  stacked, each row's own timestep gathered into one ``[B]`` tensor (the denoiser takes one
  timestep per row), guidance as paired rows (all unconditional rows, then all
  conditional ones, as the pipelines do), each request's own guidance scale applied to its
  own rows, and the noise prediction split and stepped by each request's own scheduler.
  Requests may differ in step count and in how far they are.
- :meth:`StepExecutor.decode` decodes the requests that finished, in one VAE batch.

Device time is booked per request: its own prepare, an equal share of every step it rode
in (rows of one running batch cost the same: same key, same guidance on/off), and an equal
share of the decode batch it left in. The shares of one call add up to what the call took,
so a ledger fed from them stays exact when the batch changes every step.

Supported: the UNet pipelines (Stable Diffusion 1.x/2.x and the embedded mini-SD, SDXL)
with any diffusers scheduler whose ``step`` takes one request's tensors, and the
flow-matching transformers: SD3 (``FlowMatchEulerDiscreteScheduler``, with
resolution-dependent shifting where configured) and Flux (packed 2x2 latent patches, its
own sigma schedule shifted by the image's sequence length, the guidance scale as an
embedding per row rather than paired rows; negative prompts are refused, as the
whole-batch path refuses them).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from renderq.backends.architectures import Rules, rules_for
from renderq.backends.device import on_device
from renderq.backends.diffusers import DeviceTimer, _check_image, import_torch, load_pipeline
from renderq.core.errors import ConfigError
from renderq.core.settings import uses_cfg
from renderq.core.types import Batch, BatchResult, ItemResult, Request

_FAMILIES = ("sd", "sdxl", "sd3", "flux")


@dataclass(slots=True)
class StepState:
    """One request in flight: its latents, its scheduler and how far it has come.

    Kept between steps (and across a preemption): resuming a request continues from
    ``index`` with the same latents and scheduler state, nothing recomputed.
    """

    request: Request
    #: The request's own scheduler instance (a deep copy of the pipeline's).
    scheduler: Any
    #: The request's timesteps (``scheduler.timesteps`` after ``set_timesteps``).
    timesteps: Any
    #: Current latents, shape ``[1, C, h, w]``.
    latents: Any
    #: Conditioning tensors by name, first dimension 2 (negative, positive) with guidance
    #: on, else 1 (positive): ``embeds`` and, for SDXL, ``text_embeds`` and ``time_ids``.
    cond: dict[str, Any]
    #: The request's generator, kept for schedulers whose ``step`` draws noise.
    generator: Any
    #: Steps done so far.
    index: int = 0
    #: Device-seconds booked to this request so far (prepare, step shares, decode share).
    device_seconds: float = 0.0

    @property
    def total_steps(self) -> int:
        """How many denoising steps this request takes in all."""
        return len(self.timesteps)

    @property
    def remaining(self) -> int:
        """Steps still to do."""
        return self.total_steps - self.index

    @property
    def done(self) -> bool:
        """Whether every denoising step has run (the request is ready to decode)."""
        return self.index >= self.total_steps


@dataclass(slots=True)
class StepExecutor:
    """Prepares, steps and decodes requests on a loaded text-to-image pipeline.

    ``device_class`` names the worker pool in the scheduler (the device string by default).
    It also implements the executor protocol (:meth:`run`): a batch rendered step by step,
    so a whole-batch engine can use it too.
    """

    pipeline: Any
    model: str
    device: str = "cpu"
    precision: str = "fp32"
    device_class: str = ""
    clock: Callable[[], float] = time.perf_counter
    timer: DeviceTimer = field(init=False)
    rules: Rules = field(init=False)

    def __post_init__(self) -> None:
        if not self.device_class:
            self.device_class = self.device
        self.timer = DeviceTimer(self.device, self.clock)
        self.rules = rules_for(self.pipeline)
        if self.rules.arch.name not in _FAMILIES or self._denoiser() is None:
            raise ConfigError(
                f"the step executor renders {', '.join(_FAMILIES)} pipelines; model "
                f"{self.model!r} is {type(self.pipeline).__name__}"
            )
        if getattr(self._denoiser().config, "time_cond_proj_dim", None) is not None:
            raise ConfigError(
                f"model {self.model!r} embeds the guidance scale in its timestep (LCM-style); "
                "the step executor does not drive such UNets"
            )

    @classmethod
    def load(
        cls, model: str, *, device: str = "cpu", precision: str = "fp32", name: str | None = None
    ) -> StepExecutor:
        """Load ``model`` (folder or hub id) and wrap it; ``name`` is the model's label."""
        pipe = on_device(device, lambda: load_pipeline(model, device=device, precision=precision))
        return cls(pipe, name or model, device=device, precision=precision)

    def _denoiser(self) -> Any:
        """The UNet or, for SD3, the transformer."""
        return getattr(self.pipeline, "unet", None) or getattr(self.pipeline, "transformer", None)

    def _shift(self, key: Any) -> dict[str, Any]:
        """``mu`` for flow-matching schedulers with resolution-dependent shifting (as SD3)."""
        config = self.pipeline.scheduler.config
        if not config.get("use_dynamic_shifting", False):
            return {}
        from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import (
            calculate_shift,
        )

        vae = int(getattr(self.pipeline, "vae_scale_factor", 8) or 8)
        patch = int(self._denoiser().config.patch_size)
        seq_len = (key.height // vae // patch) * (key.width // vae // patch)
        mu = calculate_shift(
            seq_len,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.16),
        )
        return {"mu": mu}

    def default_size(self) -> tuple[int, int]:
        """The resolution the model was built for (its sample size times the VAE factor)."""
        vae = int(getattr(self.pipeline, "vae_scale_factor", 8) or 8)
        sample = getattr(self._denoiser().config, "sample_size", None)
        if self.rules.arch.name not in ("sd3", "flux") and isinstance(sample, int):
            return (sample * vae, sample * vae)
        default = getattr(self.pipeline, "default_sample_size", None)
        if isinstance(default, int):
            return (default * vae, default * vae)
        return (512, 512)

    # -- prepare ----------------------------------------------------------------------

    def prepare(self, request: Request) -> StepState:
        """Encode ``request``, draw its initial latents and give it its own scheduler."""
        state, seconds = self.timer.measure(lambda: self._prepare(request))
        state.device_seconds += seconds
        return state

    def _prepare(self, request: Request) -> StepState:
        torch = import_torch()
        pipe, key = self.pipeline, request.key
        # The family's size rule, as the whole-batch path's callers check it.
        self.rules.check_size(self.model, key.width, key.height)
        if self.rules.arch.name == "flux":
            return self._prepare_flux(request)
        vae_factor = int(getattr(pipe, "vae_scale_factor", 8) or 8)
        with torch.inference_mode():
            cond = self._encode(request)
            scheduler = copy.deepcopy(pipe.scheduler)
            scheduler.set_timesteps(key.steps, device=self.device, **self._shift(key))
            if hasattr(scheduler, "set_begin_index"):
                scheduler.set_begin_index(0)
            # One generator per request, on the device, drawn exactly as the pipeline's
            # prepare_latents draws each row of a batch: the image depends on its seed alone.
            generator = torch.Generator(device=self.device).manual_seed(request.seed)
            shape = (
                1,
                int(self._denoiser().config.in_channels),
                key.height // vae_factor,
                key.width // vae_factor,
            )
            from diffusers.utils.torch_utils import randn_tensor

            noise = randn_tensor(
                shape,
                generator=generator,
                device=torch.device(self.device),
                dtype=cond["embeds"].dtype,
            )
            # Flow-matching schedulers start from the noise itself (no init_noise_sigma).
            sigma = getattr(scheduler, "init_noise_sigma", None)
            latents = noise if sigma is None else noise * sigma
        return StepState(request, scheduler, scheduler.timesteps, latents, cond, generator)

    def _prepare_flux(self, request: Request) -> StepState:
        """Flux as its pipeline prepares a row: packed latents from the request's generator,
        the image's position ids, and its sigmas shifted by the image's sequence length."""
        import numpy as np
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

        torch = import_torch()
        pipe, key = self.pipeline, request.key
        self.rules.check_negative_prompt(self.model, request.negative_prompt)
        bucket = key.prompt_bucket
        with torch.inference_mode():
            embeds, pooled, txt_ids = pipe.encode_prompt(
                prompt=request.prompt,
                prompt_2=None,
                device=self.device,
                num_images_per_prompt=1,
                **({"max_sequence_length": bucket} if bucket else {}),
            )
            generator = torch.Generator(device=self.device).manual_seed(request.seed)
            latents, img_ids = pipe.prepare_latents(
                1,
                int(pipe.transformer.config.in_channels) // 4,
                key.height,
                key.width,
                embeds.dtype,
                torch.device(self.device),
                generator,
                None,
            )
            scheduler = copy.deepcopy(pipe.scheduler)
            config = scheduler.config
            sigmas = None
            if not config.get("use_flow_sigmas", False):
                sigmas = np.linspace(1.0, 1 / key.steps, key.steps)
            mu = calculate_shift(
                int(latents.shape[1]),
                config.get("base_image_seq_len", 256),
                config.get("max_image_seq_len", 4096),
                config.get("base_shift", 0.5),
                config.get("max_shift", 1.15),
            )
            timesteps, _ = retrieve_timesteps(
                scheduler, key.steps, self.device, sigmas=sigmas, mu=mu
            )
            scheduler.set_begin_index(0)
        cond = {"embeds": embeds, "pooled": pooled, "txt_ids": txt_ids, "img_ids": img_ids}
        return StepState(request, scheduler, timesteps, latents, cond, generator)

    def _encode(self, request: Request) -> dict[str, Any]:
        """The request's conditioning, negative row first when guidance is on."""
        torch = import_torch()
        pipe = self.pipeline
        cfg = uses_cfg(request.guidance_scale)
        negative = request.negative_prompt or None
        if self.rules.arch.name == "sd":
            pos, neg = pipe.encode_prompt(request.prompt, self.device, 1, cfg, negative)
            return {"embeds": torch.cat([neg, pos]) if cfg else pos}
        if self.rules.arch.name == "sd3":
            bucket = request.key.prompt_bucket
            pos, neg, pooled, neg_pooled = pipe.encode_prompt(
                prompt=request.prompt,
                prompt_2=None,
                prompt_3=None,
                negative_prompt=negative,
                do_classifier_free_guidance=cfg,
                device=self.device,
                num_images_per_prompt=1,
                **({"max_sequence_length": bucket} if bucket else {}),
            )
            if not cfg:
                return {"embeds": pos, "pooled": pooled}
            return {"embeds": torch.cat([neg, pos]), "pooled": torch.cat([neg_pooled, pooled])}
        # SDXL: the rules' "zeros" case (no negative prompt, force_zeros_for_empty_prompt)
        # is what encode_prompt itself does when given no negative prompt.
        pos, neg, pooled, neg_pooled = pipe.encode_prompt(
            prompt=request.prompt,
            device=self.device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=cfg,
            negative_prompt=negative,
        )
        enc2 = getattr(pipe, "text_encoder_2", None)
        proj = int(pooled.shape[-1]) if enc2 is None else int(enc2.config.projection_dim)
        size = (request.key.height, request.key.width)
        time_ids = pipe._get_add_time_ids(
            size, (0, 0), size, dtype=pos.dtype, text_encoder_projection_dim=proj
        ).to(self.device)
        if not cfg:
            return {"embeds": pos, "text_embeds": pooled, "time_ids": time_ids}
        return {
            "embeds": torch.cat([neg, pos]),
            "text_embeds": torch.cat([neg_pooled, pooled]),
            "time_ids": torch.cat([time_ids, time_ids]),
        }

    # -- step -------------------------------------------------------------------------

    def step(self, running: Sequence[StepState]) -> float:
        """Run one denoising step of every request in ``running``; returns its seconds.

        Every request must still have a step to do, and all must share guidance on/off and
        latent shape (the step policy's compatible key). Each request is booked an equal
        share of the step's time.
        """
        if not running:
            return 0.0
        _check_running(running)
        _, seconds = self.timer.measure(lambda: self._step(running))
        for s in running:
            s.device_seconds += seconds / len(running)
        return seconds

    def _step(self, running: Sequence[StepState]) -> None:
        torch = import_torch()
        if self.rules.arch.name == "flux":
            return self._step_flux(running)
        cfg = uses_cfg(running[0].request.guidance_scale)
        with torch.inference_mode():
            ts = [s.timesteps[s.index] for s in running]
            # Each request's scheduler scales its own rows (Euler divides by its sigma).
            scaled = [
                s.scheduler.scale_model_input(s.latents, t)
                if hasattr(s.scheduler, "scale_model_input")
                else s.latents
                for s, t in zip(running, ts, strict=True)
            ]
            latents = torch.cat(scaled)
            timestep = torch.stack([torch.as_tensor(t) for t in ts]).to(self.device)
            names = running[0].cond
            if cfg:
                latents = torch.cat([latents, latents])
                timestep = torch.cat([timestep, timestep])
                cond = {
                    k: torch.cat(
                        [s.cond[k][:1] for s in running] + [s.cond[k][1:] for s in running]
                    )
                    for k in names
                }
            else:
                cond = {k: torch.cat([s.cond[k] for s in running]) for k in names}
            noise = self._predict(latents, timestep, cond)
            if cfg:
                uncond, text = noise.chunk(2)
                scale = torch.tensor(
                    [s.request.guidance_scale for s in running],
                    dtype=noise.dtype,
                    device=noise.device,
                ).view(-1, *([1] * (noise.dim() - 1)))
                noise = uncond + scale * (text - uncond)
            for i, (s, t) in enumerate(zip(running, ts, strict=True)):
                s.latents = s.scheduler.step(
                    noise[i : i + 1], t, s.latents, **_step_kwargs(s), return_dict=False
                )[0]
                s.index += 1

    def _step_flux(self, running: Sequence[StepState]) -> None:
        """One Flux step: rows stacked, each its own timestep and guidance embedding (the
        rows of one running batch share size and text length, so position ids too)."""
        torch = import_torch()
        transformer = self.pipeline.transformer
        with torch.inference_mode():
            latents = torch.cat([s.latents for s in running])
            ts = [s.timesteps[s.index] for s in running]
            timestep = torch.stack([torch.as_tensor(t) for t in ts]).to(latents.dtype)
            guidance = None
            if transformer.config.guidance_embeds:
                scales = [s.request.guidance_scale for s in running]
                guidance = torch.tensor(scales, device=latents.device, dtype=torch.float32)
            first = running[0].cond
            noise = transformer(
                hidden_states=latents,
                timestep=timestep.to(latents.device) / 1000,
                guidance=guidance,
                pooled_projections=torch.cat([s.cond["pooled"] for s in running]),
                encoder_hidden_states=torch.cat([s.cond["embeds"] for s in running]),
                txt_ids=first["txt_ids"],
                img_ids=first["img_ids"],
                return_dict=False,
            )[0]
            for i, (s, t) in enumerate(zip(running, ts, strict=True)):
                s.latents = s.scheduler.step(noise[i : i + 1], t, s.latents, return_dict=False)[0]
                s.index += 1

    def _predict(self, latents: Any, timestep: Any, cond: dict[str, Any]) -> Any:
        """The denoiser's prediction for stacked rows, one timestep per row."""
        if self.rules.arch.name == "sd3":
            return self.pipeline.transformer(
                hidden_states=latents,
                timestep=timestep,
                encoder_hidden_states=cond["embeds"],
                pooled_projections=cond["pooled"],
                return_dict=False,
            )[0]
        added = None
        if "text_embeds" in cond:
            added = {"text_embeds": cond["text_embeds"], "time_ids": cond["time_ids"]}
        return self.pipeline.unet(
            latents,
            timestep,
            encoder_hidden_states=cond["embeds"],
            added_cond_kwargs=added,
            return_dict=False,
        )[0]

    # -- decode -----------------------------------------------------------------------

    def decode(self, finished: Sequence[StepState]) -> list[ItemResult]:
        """Decode finished requests in one VAE batch: an image or an error for each."""
        return [
            _check_image(s.request.id, image)
            for s, image in zip(finished, self.images(finished), strict=True)
        ]

    def images(self, finished: Sequence[StepState]) -> list[Any]:
        """The float images (HWC, values in [0, 1]) of finished requests, one VAE batch.

        Each request is booked an equal share of the decode's time.
        """
        if not finished:
            return []
        for s in finished:
            if not s.done:
                raise ConfigError(
                    f"request {s.request.id!r} has {s.remaining} denoising steps left; "
                    "only finished requests can be decoded"
                )
        out, seconds = self.timer.measure(lambda: self._decode(finished))
        for s in finished:
            s.device_seconds += seconds / len(finished)
        return list(out)

    def _decode(self, finished: Sequence[StepState]) -> Any:
        torch = import_torch()
        pipe = self.pipeline
        vae = pipe.vae
        with torch.inference_mode():
            latents = torch.cat([s.latents for s in finished])
            if self.rules.arch.name == "flux":
                key = finished[0].request.key  # one step key: one size
                factor = pipe.vae_scale_factor
                latents = pipe._unpack_latents(latents, key.height, key.width, factor)
            mean = getattr(vae.config, "latents_mean", None)
            std = getattr(vae.config, "latents_std", None)
            if self.rules.arch.name == "sdxl" and mean is not None and std is not None:
                m = torch.tensor(mean).view(1, -1, 1, 1).to(latents.device, latents.dtype)
                d = torch.tensor(std).view(1, -1, 1, 1).to(latents.device, latents.dtype)
                latents = latents * d / vae.config.scaling_factor + m
            elif self.rules.arch.name in ("sd3", "flux"):
                latents = latents / vae.config.scaling_factor + vae.config.shift_factor
            else:
                latents = latents / vae.config.scaling_factor
            upcast = vae.dtype == torch.float16 and bool(getattr(vae.config, "force_upcast", False))
            if upcast and self.rules.arch.name == "sdxl":
                pipe.upcast_vae()
                latents = latents.to(next(iter(vae.post_quant_conv.parameters())).dtype)
            image = vae.decode(latents, return_dict=False)[0]
            if upcast and self.rules.arch.name == "sdxl":
                vae.to(dtype=torch.float16)
            watermark = getattr(pipe, "watermark", None)
            if watermark is not None:
                image = watermark.apply_watermark(image)
            return pipe.image_processor.postprocess(image, output_type="np")

    # -- the executor protocol --------------------------------------------------------

    def run(self, batch: Batch) -> BatchResult:
        """Render ``batch`` step by step (requests leave as their own step count ends).

        A failure in prepare fails that request; a failure in a step or a decode fails the
        requests it ran, never the call.
        """
        out: dict[str, ItemResult] = {}
        states: list[StepState] = []
        for r in batch.requests:
            try:
                states.append(self.prepare(r))
            except Exception as exc:
                out[r.id] = ItemResult(r.id, error=f"{type(exc).__name__}: {exc}")
        # Rows that cannot share a step (another size, guidance on/off) run apart.
        groups: dict[tuple[Any, ...], list[StepState]] = {}
        for st in states:
            shape = (*st.latents.shape, uses_cfg(st.request.guidance_scale))
            groups.setdefault(shape, []).append(st)
        for group in groups.values():
            self._run_group(group, out)
        seconds = sum(s.device_seconds for s in states)
        items_out = tuple(out[r.id] for r in batch.requests)
        return BatchResult(batch.id, items_out, seconds, self.device_class)

    def _run_group(self, running: list[StepState], out: dict[str, ItemResult]) -> None:
        while running:
            try:
                self.step(running)
                done = [s for s in running if s.done]
                items = self.decode(done) if done else []
            except Exception as exc:
                for s in running:
                    out[s.request.id] = ItemResult(
                        s.request.id, error=f"{type(exc).__name__}: {exc}"
                    )
                break
            for s, item in zip(done, items, strict=True):
                out[s.request.id] = item
            running = [s for s in running if not s.done]


def _check_running(running: Sequence[StepState]) -> None:
    """Refuse a running batch the step cannot take (finished rows, mixed shapes or CFG)."""
    first = running[0]
    cfg = uses_cfg(first.request.guidance_scale)
    for s in running:
        if s.done:
            raise ConfigError(f"request {s.request.id!r} has no denoising step left")
        if uses_cfg(s.request.guidance_scale) != cfg or s.latents.shape != first.latents.shape:
            raise ConfigError(
                f"request {s.request.id!r} ({s.request.key.width}x{s.request.key.height}, "
                f"guidance {s.request.guidance_scale}) cannot share a step with "
                f"{first.request.id!r} ({first.request.key.width}x{first.request.key.height}, "
                f"guidance {first.request.guidance_scale})"
            )


def _step_kwargs(state: StepState) -> dict[str, Any]:
    """``eta`` and ``generator`` where the scheduler's ``step`` takes them (as the pipelines)."""
    import inspect

    params = inspect.signature(state.scheduler.step).parameters
    kwargs: dict[str, Any] = {}
    if "eta" in params:
        kwargs["eta"] = 0.0
    if "generator" in params:
        kwargs["generator"] = state.generator
    return kwargs
