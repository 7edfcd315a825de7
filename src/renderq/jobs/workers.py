"""Where a job renders and scores: in this process, on a local pool, or on Ray actors.

``renderq run`` renders in its own process unless ``--devices`` names a pool; the pool is
local worker processes (:mod:`renderq.backends.pool`) or, with ``--backend ray``, Ray
actors (:mod:`renderq.backends.ray_backend`), where a scorer on ``--scorer-devices`` is
an actor too. Each device class the run uses may be priced (``--price``).

``--devices auto`` takes what the Ray cluster offers (:mod:`renderq.backends.ray_cluster`);
its device class is known only once the cluster is read, so with ``--price`` it must be
named (``auto=CLASS``) to be checked before anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from renderq.backends.clip import ClipScorer
from renderq.backends.pool import AUTO, DevicePool, Loader, LoadSpec, WorkerSpec, parse_devices
from renderq.backends.ray_backend import RayPool, ScorerLoad
from renderq.backends.registry import resolve
from renderq.backends.writing import WriteLoad
from renderq.core.errors import ConfigError
from renderq.core.settings import ModelSpec
from renderq.output.images import ImageStore

BACKENDS = ("local", "ray")
"""Where a pool's workers run: processes on this machine, or Ray actors."""


def check_backend(backend: str) -> None:
    """Raise ConfigError unless ``backend`` is one of :data:`BACKENDS`."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be 'local' or 'ray', got {backend!r}")


def load_scorer(model: str, device: str, scale100: bool, where: WorkerSpec | None) -> ClipScorer:
    """The CLIP scorer in this process: on ``where``'s device and class, else on ``device``."""
    scorer = ClipScorer.load(
        resolve(model),
        device=device if where is None else where.device,
        scale100=scale100,
        name=model,
    )
    if where is not None:
        scorer.device_class = where.device_class
    return scorer


def scorer_load(model: str, scale100: bool) -> ScorerLoad:
    """What a scorer actor loads."""
    return ScorerLoad(resolve(model), model, scale100)


def device_specs(text: str, backend: str, address: str | None) -> list[WorkerSpec]:
    """The workers ``--devices`` names; on Ray the cluster is joined first, so that
    ``cuda`` counts its GPUs rather than this machine's."""
    gpus = None
    if backend == "ray":
        from renderq.backends.ray_backend import cluster_gpus, connect

        connect(address)
        gpus = cluster_gpus
    return parse_devices(text, cuda_count=gpus)


def check_prices(prices: Mapping[str, float] | None, classes: set[str]) -> None:
    """With prices given, every device class the run uses must have one (``--devices
    auto`` must then name its class: ``auto=CLASS``)."""
    if prices and AUTO in classes:
        raise ConfigError(
            "--price needs the class of --devices auto to check it before the run: "
            f"--devices auto=CLASS, CLASS one of {sorted(prices)}"
        )
    missing = sorted(classes - set(prices or {}))
    if prices and missing:
        raise ConfigError(
            f"--price has no price for device class {missing[0]!r}; this run uses {sorted(classes)}"
        )


def start_pool(
    spec: ModelSpec,
    devices: Sequence[WorkerSpec],
    *,
    backend: str = "local",
    address: str | None = None,
    scoring: tuple[WorkerSpec, ScorerLoad] | None = None,
    write_to: tuple[ImageStore, ScorerLoad] | None = None,
    depth: int = 1,
) -> DevicePool | RayPool:
    """Start the render workers of ``devices`` (one device class) and, on Ray, the scorer
    actor of ``scoring``; returns once every one has loaded. ``write_to``: each worker
    also loads that scorer, scores its renders and writes them to that store itself
    (:mod:`renderq.backends.writing`). ``depth``: batches handed to each Ray actor at
    once (:class:`RayPool`)."""
    classes = sorted({d.device_class for d in devices})
    if len(classes) > 1:
        raise ConfigError(
            f"--devices names the device classes {classes}: the render stage runs on one class"
        )
    if any(d.device == AUTO for d in devices) and backend != "ray":
        raise ConfigError("--devices auto reads a Ray cluster's devices: add --backend ray")
    render = LoadSpec(
        resolve(spec.model), spec.model, spec.precision, spec.adapters, spec.compile,
        spec.channels_last,
    )  # fmt: skip
    load: Loader = render if write_to is None else WriteLoad(render, write_to[1], write_to[0])
    if backend == "ray":
        return RayPool.start(devices, load, address=address, scorer=scoring, depth=depth)
    return DevicePool.start(devices, load)
