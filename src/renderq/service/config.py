"""Service settings: a TOML file, environment tokens and command-line overrides.

A config file looks like::

    host = "127.0.0.1"
    port = 8000
    data_dir = "renderq-data"

    [model]
    model = "embedded:mini-sd"
    scorer = "embedded:clip"
    device = "cpu"
    steps = 20           # unset: the pipeline's own
    threads = 0          # torch CPU threads; 0: the cores other work leaves free
    devices = ""         # a render pool, one worker per device: "cuda" or "cpu:1,cpu:1"
    backend = "local"    # where the pool's workers run: local processes or ray actors

    [batching]
    mode = "dynamic"     # or "step": requests join and leave the running batch every step
    max_batch_size = 8
    max_queue_delay_s = 0.05
    max_queue_per_key = 256

    [auth]
    tokens = { "secret-token-a" = "team-a", "secret-token-b" = "team-b", "ops-token" = "ops" }
    admin_tenants = ["ops"]
    tenant_max_queued = 64

    [limits]
    max_body_bytes = 8388608
    deadline_reserve_s = 0.0  # seconds kept back from each deadline for the answer

    [lora]               # adapters a request or a job may name ("lora": "ink@0.8")
    ink = "/loras/ink"   # a folder or hub id, loaded once at start

The model, batching and QA keys (also ``precision``, ``guidance``, ``threshold``,
``max_attempts``, ``score_batch_size``) fill the settings every command shares
(``renderq.core.settings``), checked there; the batching defaults are the interactive ones.

``RENDERQ_API_TOKENS`` adds tokens, comma-separated, each ``token`` or ``tenant:token``.
A token of a tenant named in ``admin_tenants`` is an admin token: ``/v1/stats`` shows it
every tenant's counts; every other token sees its own tenant's only.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from renderq.core.errors import ConfigError, not_a_file
from renderq.core.settings import INTERACTIVE, Batching, ModelSpec, QASettings

TOKENS_ENV = "RENDERQ_API_TOKENS"


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """Everything ``renderq serve`` needs; see the module docstring for the file format.

    ``spec``, ``batching`` and ``qa`` are the settings every command shares; the service
    batches dynamically with its own, interactive, defaults (:data:`INTERACTIVE`).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Path("renderq-data")
    spec: ModelSpec = field(default_factory=ModelSpec)
    batching: Batching = INTERACTIVE
    qa: QASettings = field(default_factory=QASettings)
    max_queue_per_key: int = 256
    max_n: int = 8
    max_steps: int = 100
    max_job_prompts: int = 10_000
    tokens: Mapping[str, str] = field(default_factory=dict)
    tenant_max_queued: int | None = None
    admin_tenants: tuple[str, ...] = ()
    max_body_bytes: int = 8 * 1024 * 1024
    deadline_reserve_s: float = 0.0
    threads: int = 0
    devices: str = ""
    backend: str = "local"
    address: str | None = None
    profile: str | None = None

    def __post_init__(self) -> None:
        if self.batching.mode not in ("dynamic", "step"):
            raise ConfigError(
                f"mode must be 'dynamic' or 'step' (the service answers callers as they "
                f"come), got {self.batching.mode!r}"
            )
        if self.batching.max_batch_size is None:
            raise ConfigError("the service needs a max_batch_size (its warm-up measures it)")
        if self.batching.mode == "step" and self.devices and self.backend != "local":
            raise ConfigError(
                f"mode 'step' runs a step loop per device in the service's process; backend "
                f"{self.backend!r} is not supported with it (use backend 'local')"
            )
        for name in ("max_queue_per_key", "max_n", "max_steps", "max_job_prompts"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if self.tenant_max_queued is not None and self.tenant_max_queued < 1:
            raise ConfigError(f"tenant_max_queued must be >= 1, got {self.tenant_max_queued}")
        if self.threads < 0:
            raise ConfigError(f"threads must be >= 0 (0: the free cores), got {self.threads}")
        if self.backend not in ("local", "ray"):
            raise ConfigError(f"backend must be 'local' or 'ray', got {self.backend!r}")
        if self.backend == "ray" and not self.devices:
            raise ConfigError("backend 'ray' needs devices for its render actors")
        if self.devices:
            from renderq.backends.pool import AUTO, parse_devices

            # The form only: how many GPUs "cuda" means is read when the workers start.
            specs = parse_devices(self.devices, cuda_count=lambda: 1)
            if specs[0].device == AUTO and self.backend != "ray":
                raise ConfigError("devices 'auto' reads a Ray cluster's devices: backend 'ray'")
        if self.max_body_bytes < 1:
            raise ConfigError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if not 0 <= self.deadline_reserve_s < 3600:
            raise ConfigError(
                f"deadline_reserve_s must be in [0, 3600) seconds, got {self.deadline_reserve_s}"
            )
        if self.profile is not None:
            # Admission prices requests from the warm-up's own measured curve, corrected by
            # the latency it observes; a profile file is not read, so taking one would lie.
            raise ConfigError(
                f"profile {self.profile!r}: the service does not read a profile; admission "
                "prices from the cost curve it measures at start-up (remove the setting)"
            )
        unknown = sorted(set(self.admin_tenants) - set(self.tokens.values()))
        if unknown:
            raise ConfigError(
                f"admin_tenants {', '.join(map(repr, unknown))} have no token in [auth] tokens "
                f"or {TOKENS_ENV}"
            )

    @property
    def render_cap(self) -> int:
        """The largest render batch (always set here: the warm-up measures it)."""
        assert self.batching.max_batch_size is not None  # checked in __post_init__
        return self.batching.max_batch_size

    @property
    def auth_enabled(self) -> bool:
        """Whether bearer tokens are required."""
        return bool(self.tokens)

    def is_admin(self, tenant: str) -> bool:
        """Whether a tenant may see every tenant's numbers (everyone, without auth)."""
        return not self.auth_enabled or tenant in self.admin_tenants

    def safe_host(self) -> tuple[str, str | None]:
        """The host to bind, and a warning when a public bind was refused for lack of tokens."""
        if self.auth_enabled or is_loopback(self.host):
            return self.host, None
        return "127.0.0.1", (
            f"no API tokens configured: binding 127.0.0.1 instead of {self.host!r}; set "
            f"{TOKENS_ENV} or [auth] tokens to serve other hosts"
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_env_tokens(text: str) -> dict[str, str]:
    """``"tokA,team-b:tokB"`` -> ``{token: tenant}``; a bare token's tenant is a hash of it."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        tenant, sep, token = part.rpartition(":")
        if not sep:
            tenant = "tenant-" + hashlib.sha256(token.encode()).hexdigest()[:8]
        if not token:
            raise ConfigError(f"empty token in {TOKENS_ENV} entry {part!r}")
        out[token] = tenant
    return out


_SECTIONS = ("model", "batching", "auth", "limits")
#: The shared settings' keys, flat in the file as on the command line.
_SPEC = tuple(f.name for f in fields(ModelSpec))
_BATCHING = ("mode", "max_batch_size", "max_queue_delay_s", "score_batch_size")
_QA = ("threshold", "max_attempts")
_SHARED = ("spec", "batching", "qa")


def load_config(
    path: Path | None, *, env: Mapping[str, str] | None = None, **overrides: Any
) -> ServiceConfig:
    """Read the file (if any), add environment tokens, apply non-None overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            raise ConfigError(not_a_file("config file", path, path.is_dir()))
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
        for key, value in raw.items():
            if key == "lora" and isinstance(value, dict):
                data["adapters"] = tuple((str(k), str(v)) for k, v in value.items())
            elif key in _SECTIONS and isinstance(value, dict):
                data.update(value)
            else:
                data[key] = value
    known = {f.name for f in fields(ServiceConfig)} - set(_SHARED) | {*_SPEC, *_BATCHING, *_QA}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown config setting(s) {', '.join(map(repr, unknown))}")
    data.update({k: v for k, v in overrides.items() if v is not None})
    tokens = {str(k): str(v) for k, v in dict(data.pop("tokens", {})).items()}
    environ = os.environ if env is None else env
    tokens.update(parse_env_tokens(environ.get(TOKENS_ENV, "")))
    if "data_dir" in data:
        data["data_dir"] = Path(data["data_dir"])
    if "admin_tenants" in data:
        admins = data["admin_tenants"]
        if not isinstance(admins, list) or not all(isinstance(a, str) for a in admins):
            raise ConfigError(f"admin_tenants must be a list of tenant names, got {admins!r}")
        data["admin_tenants"] = tuple(admins)
    shared = [{k: data.pop(k) for k in keys if k in data} for keys in (_SPEC, _BATCHING, _QA)]
    try:
        return ServiceConfig(
            spec=ModelSpec(**shared[0]), batching=replace(INTERACTIVE, **shared[1]),
            qa=QASettings(**shared[2]), tokens=tokens, **data,
        )  # fmt: skip
    except TypeError as exc:
        raise ConfigError(f"bad config: {exc}") from None
