"""The diffusers executor: any text-to-image pipeline, one generator per request.

Each request gets its own ``torch.Generator`` seeded with the attempt's seed, so its
image depends only on its prompt and seed, not on its batch-mates. One bad item never
fails its batch: a NaN or blank image fails that item only; an exception from a batch
is retried item by item so that only the item that raises fails; a batch that runs out
of memory is split in half and both halves retried, down to one, and the largest size
that fitted is reported (``BatchResult.fitted_cap``) so the scheduler lowers the key's
cap for the rest of the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import inspect
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from renderq.backends.adapters import AdapterSet
from renderq.backends.architectures import PromptLength, Rules, rules_for
from renderq.backends.device import on_device
from renderq.core.errors import ConfigError
from renderq.core.types import Batch, BatchResult, ItemResult, Request

PRECISIONS: dict[str, str] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
"""Precision names accepted on the command line and the torch dtype each one means."""

_INSTALL = "the diffusers executor needs torch and diffusers: pip install 'renderq[diffusers]'"


def import_torch() -> Any:
    """Import torch, or raise a ConfigError that says what to install."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(_INSTALL) from exc
    return torch


def torch_dtype(precision: str) -> Any:
    """The torch dtype of a precision name (``fp32``, ``fp16``, ``bf16``)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    return getattr(import_torch(), PRECISIONS[precision])


def check_device(device: str) -> str:
    """Validate a device string (``cpu``, ``cuda``, ``cuda:1``); returns it."""
    torch = import_torch()
    if device == "cpu":
        return device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device {device!r} asked for, but torch sees no CUDA device")
        return device
    raise ConfigError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")


def quiet_libraries() -> None:
    """Silence diffusers' and transformers' loading bars and warnings (the CLI draws its own)."""
    for module in ("diffusers.utils.logging", "transformers.utils.logging"):
        try:
            lib_logging = importlib.import_module(module)
        except ImportError:
            continue
        lib_logging.set_verbosity_error()
        lib_logging.disable_progress_bar()


def is_oom(exc: BaseException) -> bool:
    """Whether an exception is an out-of-memory error (CUDA, MPS or CPU allocator)."""
    torch = import_torch()
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def looks_local(model: str) -> bool:
    """Whether a model id names a local folder rather than a hub id (``org/name``)."""
    return (
        model.startswith((".", "/", "~"))
        or model.endswith("/")
        or model.count("/") > 1
        or Path(model).exists()
    )


def load_pipeline(model: str, *, device: str = "cpu", precision: str = "fp32") -> Any:
    """Load a diffusers text-to-image pipeline from a local folder or a hub id."""
    dtype = torch_dtype(precision)
    check_device(device)
    if looks_local(model) and not (Path(model).expanduser() / "model_index.json").is_file():
        raise ConfigError(
            f"model {model!r} is not a diffusers pipeline folder (no model_index.json)"
        )
    try:
        from diffusers import DiffusionPipeline
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(_INSTALL) from exc
    try:
        with warnings.catch_warnings():
            # Newer diffusers renamed torch_dtype to dtype; the old name works everywhere.
            warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
            pipe = DiffusionPipeline.from_pretrained(
                str(Path(model).expanduser()), torch_dtype=dtype
            )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load model {model!r}: {exc}") from exc
    if "prompt" not in inspect.signature(pipe.__call__).parameters:
        raise ConfigError(
            f"model {model!r} ({type(pipe).__name__}) is not a text-to-image pipeline"
        )
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


T = TypeVar("T")


@dataclass(slots=True)
class DeviceTimer:
    """Times work on a device: wall-clock seconds, synchronised on CUDA before reading.

    On a CPU device the work runs (and is timed) on the device's own thread
    (:mod:`renderq.backends.device`). On CUDA each timer owns a stream, so a render
    worker and a scorer worker (each with its own timer) queue their kernels on separate
    streams and each synchronises only its own work before reading the clock: neither
    books the other's kernels.
    """

    device: str
    clock: Callable[[], float] = time.perf_counter
    _stream: Any = None
    #: On CPU: wall seconds measured, and the process's CPU seconds over the same spans
    #: divided by torch's thread count. Their ratio (:meth:`cpu_share`) falls well below 1
    #: when other processes take the cores, i.e. when booked seconds are inflated.
    wall_s: float = 0.0
    core_s: float = 0.0

    def measure(self, fn: Callable[[], T]) -> tuple[T, float]:
        """Run ``fn`` and return its result with the seconds it took on the device."""
        if not self.device.startswith("cuda"):

            def timed() -> tuple[T, float]:
                threads = max(1, int(import_torch().get_num_threads()))
                start, cpu = self.clock(), time.process_time()
                out = fn()
                wall = self.clock() - start
                self.wall_s += wall
                self.core_s += (time.process_time() - cpu) / threads
                return out, wall

            return on_device(self.device, timed)
        torch = import_torch()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        # CUDA events on the timer's own stream: the span between the two records on the
        # device's timeline, not the host's, and none of another stream's kernels.
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        with torch.cuda.stream(self._stream):
            start.record(self._stream)
            out = fn()
            end.record(self._stream)
        end.synchronize()
        return out, float(start.elapsed_time(end)) / 1000.0

    def cpu_share(self) -> float | None:
        """The share of the measured wall time torch's CPU threads really ran (None: none)."""
        return self.core_s / self.wall_s if self.wall_s > 0 else None


def free_cores() -> int:
    """Cores this process may use that other work is not already using (at least 1).

    The cores in the process's affinity set less the one-minute load average: on a
    shared machine, torch's default (one thread per core) oversubscribes the cores, its
    thread team waits on the others' time slices, and every booked second is inflated.
    """
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, int((cores or 1) - busy + 0.5))


def set_cpu_threads(threads: int) -> int:
    """Set torch's CPU threads: ``threads``, or with 0 the cores other work leaves free.

    torch's default, a thread per core, oversubscribes a shared machine: its thread team
    waits on the others' time slices and every booked second is inflated.
    """
    n = threads if threads > 0 else free_cores()
    import_torch().set_num_threads(n)
    return n


@dataclass(slots=True)
class _Split:
    """What one run learned about memory: the smallest size that failed, sizes that fitted."""

    oom_min: int | None = None
    fitted: set[int] = field(default_factory=set)

    def cap(self) -> int | None:
        """The largest size that fitted below the smallest that did not (None: no OOM)."""
        if self.oom_min is None:
            return None
        ok = [n for n in self.fitted if n < self.oom_min]
        return max(ok, default=1)


@dataclass(slots=True)
class DiffusersExecutor:
    """Renders batches on a loaded diffusers pipeline.

    ``pipeline`` is anything called like a diffusers text-to-image pipeline (a real one,
    or a wrapper such as ``renderq.backends.faults.FaultyPipeline``). ``device_class``
    names the worker pool in the scheduler; by default it is the device string.
    """

    pipeline: Any
    model: str
    device: str = "cpu"
    precision: str = "fp32"
    device_class: str = ""
    clock: Callable[[], float] = time.perf_counter
    #: The denoiser under ``torch.compile``: the first batch of each shape is compiled
    #: and run once untimed (its seconds go to ``warmup_s``, not the ledger).
    compile: bool = False
    #: Denoiser and VAE in channels-last memory format (faster convolutions on GPUs).
    channels_last: bool = False
    #: LoRA adapters by name (folder or hub id), loaded once; a batch key picks one.
    adapters: Mapping[str, str] = field(default_factory=dict)
    lora: AdapterSet = field(init=False)
    timer: DeviceTimer = field(init=False)
    rules: Rules = field(init=False)
    #: Seconds spent compiling and warming new shapes, and the shapes warmed.
    warmup_s: float = field(init=False, default=0.0)
    warmed: set[tuple[int, ...]] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        if not self.device_class:
            self.device_class = self.device
        self.timer = DeviceTimer(self.device, self.clock)
        self.rules = rules_for(self.pipeline)
        self.lora = AdapterSet(self.adapters)
        self.lora.load(self.pipeline)
        if self.channels_last or self.compile:
            prepare_denoiser(self.pipeline, self.compile, self.channels_last)

    @classmethod
    def load(
        cls,
        model: str,
        *,
        device: str = "cpu",
        precision: str = "fp32",
        name: str | None = None,
        compile: bool = False,
        channels_last: bool = False,
        adapters: Mapping[str, str] | None = None,
    ) -> DiffusersExecutor:
        """Load ``model`` (folder or hub id) and wrap it; ``name`` is the model's label."""
        pipe = on_device(device, lambda: load_pipeline(model, device=device, precision=precision))
        return cls(
            pipe, name or model, device=device, precision=precision, compile=compile,
            channels_last=channels_last, adapters=dict(adapters or {}),
        )  # fmt: skip

    # -- what the model can do ------------------------------------------------------------

    @property
    def sampler(self) -> str:
        """The pipeline's scheduler class name (part of the batch key)."""
        return type(getattr(self.pipeline, "scheduler", None)).__name__

    @property
    def size_multiple(self) -> int:
        """Width and height must be multiples of this (the architecture's rule)."""
        return self.rules.size_multiple

    def default_size(self) -> tuple[int, int]:
        """The resolution the model was built for (its sample size times the VAE factor)."""
        vae = int(getattr(self.pipeline, "vae_scale_factor", 8) or 8)
        unet = getattr(self.pipeline, "unet", None)
        sample = getattr(getattr(unet, "config", None), "sample_size", None)
        if isinstance(sample, int):
            return (sample * vae, sample * vae)
        default = getattr(self.pipeline, "default_sample_size", None)
        if isinstance(default, int):
            return (default * vae, default * vae)
        return (512, 512)

    def check_size(self, width: int, height: int) -> None:
        """Raise ConfigError unless the model can render exactly ``width`` x ``height``."""
        self.rules.check_size(self.model, width, height)

    def check_negative_prompt(self, negative_prompt: str) -> None:
        """Raise ConfigError where the model would ignore ``negative_prompt``."""
        self.rules.check_negative_prompt(self.model, negative_prompt)

    def check_adapter(self, label: str) -> None:
        """Raise ConfigError unless ``label`` (``NAME`` or ``NAME@SCALE``) is configured."""
        self.lora.check(label)

    def prompt_length(self, prompt: str, *, buckets: bool = True) -> PromptLength:
        """The prompt's length bucket (part of its batch key) and what truncates it.

        ``buckets=False``: every prompt of a T5 pipeline in one bucket, the pipeline's own
        full padding (``max_sequence_length``'s default), as it renders when called bare.
        """
        length = self.rules.prompt_length(prompt)
        if buckets or not length.bucket:
            return length
        return dataclasses.replace(length, bucket=self.rules.t5_limit())

    # -- rendering --------------------------------------------------------------------

    def run(self, batch: Batch) -> BatchResult:
        """Render every request of ``batch``; never raises for one bad item."""
        out: dict[str, ItemResult] = {}
        split = _Split()

        groups = _by_guidance(batch.requests)
        if self.compile:
            self._warm(groups)

        def render_all() -> None:
            self.lora.activate(self.pipeline, batch.key.adapter)
            for group in groups:
                self._render(group, out, split)

        _, seconds = self.timer.measure(render_all)
        items = tuple(out[r.id] for r in batch.requests)
        return BatchResult(batch.id, items, seconds, self.device_class, fitted_cap=split.cap())

    def _render(self, reqs: Sequence[Request], out: dict[str, ItemResult], split: _Split) -> None:
        try:
            images = self._call(reqs)
        except Exception as exc:
            if is_oom(exc):
                self._free_memory()
                n = len(reqs)
                split.oom_min = n if split.oom_min is None else min(split.oom_min, n)
                if n == 1:
                    out[reqs[0].id] = ItemResult(reqs[0].id, error=f"out of memory: {exc}")
                    return
                half = n // 2
                self._render(reqs[:half], out, split)
                self._render(reqs[half:], out, split)
            elif len(reqs) > 1:
                # Find the item that raises: alone, each request fails only itself.
                for r in reqs:
                    self._render([r], out, split)
            else:
                out[reqs[0].id] = ItemResult(reqs[0].id, error=f"{type(exc).__name__}: {exc}")
            return
        split.fitted.add(len(reqs))
        for r, image in zip(reqs, images, strict=True):
            out[r.id] = _check_image(r.id, image)

    def _call(self, reqs: Sequence[Request]) -> Any:
        torch = import_torch()
        key = reqs[0].key
        # One generator per request, on the device: the image depends on its seed alone.
        generators = [torch.Generator(device=self.device).manual_seed(r.seed) for r in reqs]
        kwargs: dict[str, Any] = {
            "prompt": [r.prompt for r in reqs],
            "height": key.height,
            "width": key.width,
            "num_inference_steps": key.steps,
            "guidance_scale": reqs[0].guidance_scale,
            "generator": generators,
            "output_type": "np",
        }
        with torch.inference_mode():
            kwargs.update(self.rules.call_kwargs(reqs, key.prompt_bucket))
            result = self.pipeline(**kwargs)
        images = result.images if hasattr(result, "images") else result[0]
        if len(images) != len(reqs):
            raise RuntimeError(f"pipeline returned {len(images)} images for {len(reqs)} prompts")
        return images

    def _warm(self, groups: Sequence[Sequence[Request]]) -> None:
        """Compile and run each new shape once, untimed: compiling is not rendering."""
        for group in groups:
            key = group[0].key
            shape = (len(group), key.width, key.height, key.steps, key.prompt_bucket)
            if shape in self.warmed:
                continue
            self.warmed.add(shape)
            start = time.perf_counter()
            with contextlib.suppress(Exception):  # the timed call meets (and handles) it again
                on_device(self.device, lambda g=group: self._call(g))  # type: ignore[misc]
            if self.device.startswith("cuda"):
                import_torch().cuda.synchronize(self.device)
            self.warmup_s += time.perf_counter() - start

    def _free_memory(self) -> None:
        gc.collect()
        if self.device.startswith("cuda"):
            import_torch().cuda.empty_cache()


def prepare_denoiser(pipeline: Any, compile: bool, channels_last: bool) -> None:
    """Put the pipeline's denoiser (UNet or transformer) and VAE in the asked-for form."""
    torch = import_torch()
    name = "unet" if getattr(pipeline, "unet", None) is not None else "transformer"
    denoiser = getattr(pipeline, name, None)
    if denoiser is None:
        raise ConfigError(f"{type(pipeline).__name__} has no unet or transformer to prepare")
    if channels_last:
        for part in (denoiser, getattr(pipeline, "vae", None)):
            if part is not None:
                part.to(memory_format=torch.channels_last)
    if compile:
        # One graph per shape (dynamic=False): renderq warms each batch shape once.
        setattr(pipeline, name, torch.compile(denoiser, dynamic=False))


def _by_guidance(reqs: Sequence[Request]) -> list[list[Request]]:
    """Requests grouped by guidance scale: one pipeline call takes one scale."""
    groups: dict[float, list[Request]] = {}
    for r in reqs:
        groups.setdefault(r.guidance_scale, []).append(r)
    return list(groups.values())


def _check_image(request_id: str, image: Any) -> ItemResult:
    """An item result for one float image in [0, 1]: uint8 HWC, or an error if unusable."""
    import numpy as np

    array = np.asarray(image, dtype=np.float32)
    if not np.isfinite(array).all():
        return ItemResult(request_id, error="image has NaN or infinite values")
    pixels = (np.clip(array, 0.0, 1.0) * 255.0).round().astype(np.uint8)
    if pixels.ndim != 3 or int(pixels.max()) == int(pixels.min()):
        return ItemResult(request_id, error="blank image (every pixel the same)")
    return ItemResult(request_id, image=pixels)
