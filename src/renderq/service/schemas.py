"""Request and response bodies (pydantic). Field errors come back as 422 naming the field."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from renderq.core.errors import ConfigError
from renderq.core.windows import Windows

_SIZE = r"^[1-9][0-9]{0,4}x[1-9][0-9]{0,4}$"


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or only whitespace")
    return value


class GenerationRequest(BaseModel):
    """OpenAI Images API ``POST /v1/images/generations`` body, plus renderq extensions."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=4000)
    n: int = Field(1, ge=1, le=64, description="Images to return (capped by the service).")
    size: str | None = Field(None, pattern=_SIZE, description="WIDTHxHEIGHT; model default.")
    response_format: Literal["b64_json"] = "b64_json"
    model: str | None = Field(None, description="Must name the served model, if given.")
    user: str | None = Field(None, max_length=256)
    seed: int | None = Field(None, ge=0, lt=2**63, description="First image's seed.")
    steps: int | None = Field(None, ge=1, description="Denoising steps (capped by the service).")
    guidance: float | None = Field(None, ge=0.0, le=50.0)
    negative_prompt: str | None = Field(None, max_length=4000)
    lora: str | None = Field(
        None, max_length=200, description="A configured LoRA adapter: NAME or NAME@SCALE."
    )
    priority: int = Field(0, ge=0, le=9, description="Higher first; always ahead of bulk.")
    deadline_s: float | None = Field(None, gt=0, le=86_400)
    qa: bool = Field(True, description="Gate each image and regenerate failures first.")

    _prompt = field_validator("prompt")(_not_blank)


class ImageData(BaseModel):
    """One image: OpenAI's ``b64_json`` plus how it was made and judged."""

    b64_json: str
    revised_prompt: str | None = None
    seed: int
    attempts: int
    clip_score: float | None
    qa: Literal["accepted", "escalated", "skipped"]
    batch_id: int
    batch_size: int


class GenerationResponse(BaseModel):
    """OpenAI Images API response shape."""

    created: int
    data: list[ImageData]


class JobPrompt(BaseModel):
    """One prompt of a bulk job, with optional per-prompt settings."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=4000)
    seed: int | None = Field(None, ge=0, lt=2**63)
    negative_prompt: str | None = Field(None, max_length=4000)

    _prompt = field_validator("prompt")(_not_blank)


class JobCreate(BaseModel):
    """A bulk job: many prompts rendered under the quality gate at bulk priority."""

    model_config = ConfigDict(extra="forbid")

    prompts: list[str | JobPrompt] = Field(min_length=1)
    size: str | None = Field(None, pattern=_SIZE)
    steps: int | None = Field(None, ge=1)
    guidance: float | None = Field(None, ge=0.0, le=50.0)
    lora: str | None = Field(
        None, max_length=200, description="The job's LoRA adapter: NAME or NAME@SCALE."
    )
    seed: int = Field(0, ge=0, lt=2**62, description="Seed of the first prompt; +1 per prompt.")
    mode: Literal["dynamic", "window"] = "dynamic"
    windows: str | None = Field(
        None,
        description=(
            "Window mode only: when the job may run, in Unix seconds (UTC): 'always' (the "
            "default), 'every=P,length=L[,offset=O]' (e.g. every=86400,length=14400,"
            "offset=3600 is 01:00-05:00 UTC daily) or 'S-E,...'."
        ),
    )
    priority: int = Field(0, ge=0, le=9)

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, value: list[str | JobPrompt]) -> list[str | JobPrompt]:
        for i, p in enumerate(value):
            if isinstance(p, str) and not p.strip():
                raise ValueError(f"prompt {i} is empty")
        return value

    @model_validator(mode="after")
    def _windows(self) -> JobCreate:
        if self.windows is not None:
            if self.mode != "window":
                raise ValueError(f"windows {self.windows!r} needs mode 'window'")
            try:
                Windows.parse(self.windows)
            except ConfigError as exc:
                raise ValueError(f"windows: {exc}") from None
        return self


class JobStatus(BaseModel):
    """Progress and ledger of a bulk job."""

    id: str
    state: Literal["queued", "running", "done", "cancelled"]
    created: float
    total: int
    accepted: int
    escalated: int = Field(
        description="Prompts the gate escalated and no reviewer accepted (rejected and edited"
        " included): accepted + escalated + pending = total."
    )
    rejected: int = Field(0, description="Of the escalated, those a reviewer rejected.")
    edited: int = Field(0, description="Of the escalated, those a reviewer edited.")
    pending: int
    in_flight: int = Field(0, description="Prompts in a render or score batch running now.")
    mode: str
    windows: str | None = None
    ledger: dict[str, object]


class JobImage(BaseModel):
    """One accepted image of a job."""

    id: str
    file_name: str
    prompt: str
    seed: int
    attempt: int
    clip_score: float | None
    b64_json: str | None = None


class JobImages(BaseModel):
    """A page of a job's accepted images."""

    data: list[JobImage]
    offset: int
    next_offset: int | None
    total: int


class ErrorBody(BaseModel):
    """Every error: a machine-readable reason and a message."""

    error: str
    detail: str
