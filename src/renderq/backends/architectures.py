"""What each diffusers pipeline family needs from a batcher, read from the pipeline itself.

A batch is one pipeline call, so everything a family treats specially has to be known
before requests are mixed:

- **sizes**: Stable Diffusion 1.x/2.x and SDXL check ``height % 8``; SD3 needs multiples
  of ``vae_scale_factor * patch_size``; Flux packs 2x2 latent patches, so multiples of
  ``vae_scale_factor * 2`` (it silently shrinks any other size).
- **"no negative prompt"**: SD 1.x and SD3 encode ``""`` for a request without one, so a
  list with ``""`` in some rows is what each row gets alone. SDXL with
  ``force_zeros_for_empty_prompt`` uses *zero* embeddings when no negative prompt is
  given at all, and ``""`` encodes to something else: a mixed batch gets its negative
  embeddings computed once and the rows without a negative prompt zeroed. Flux has no
  classifier-free guidance (its guidance is an embedding); it only reads a negative
  prompt with ``true_cfg_scale``, which renderq does not drive, so a negative prompt is
  refused rather than dropped.
- **text encoders**: CLIP towers pad to 77 tokens whatever the prompt (one length
  bucket; longer prompts are truncated). SD3's and Flux's T5 pads to
  ``max_sequence_length``; renderq buckets prompts by T5 token count and renders each
  bucket at its upper bound, so a short prompt does not pay for 256 or 512 tokens.

A pipeline class renderq does not know gets the generic rules (multiples of 8 and of the
VAE factor, negative prompts as a list, CLIP only) and a warning.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from renderq.core.errors import ConfigError

T5_EDGES: tuple[int, ...] = (64, 128, 256, 512)
"""Upper bounds (tokens) of the T5 prompt-length buckets, cut at the pipeline's limit."""


@dataclass(frozen=True, slots=True)
class Architecture:
    """One pipeline family's rules (see the module docstring)."""

    name: str
    #: Pipeline class names of this family (a subclass of one of them counts too).
    classes: tuple[str, ...]
    #: ``"vae"``: multiples of lcm(8, vae factor); ``"patch"``: vae factor x patch size;
    #: ``"pack2"``: vae factor x 2.
    sizes: str = "vae"
    #: ``"list"``: ``""`` means none; ``"zeros"``: SDXL's zero embeddings for none;
    #: ``"refuse"``: the family takes no negative prompt here.
    negatives: str = "list"
    #: Attribute of the T5 tokenizer, for families with a T5 encoder.
    t5_tokenizer: str | None = None
    known: bool = True


FAMILIES: tuple[Architecture, ...] = (
    Architecture("sdxl", ("StableDiffusionXLPipeline",), negatives="zeros"),
    Architecture("sd3", ("StableDiffusion3Pipeline",), sizes="patch", t5_tokenizer="tokenizer_3"),
    Architecture(
        "flux", ("FluxPipeline",), sizes="pack2", negatives="refuse", t5_tokenizer="tokenizer_2"
    ),
    Architecture("sd", ("StableDiffusionPipeline",)),
)
GENERIC = Architecture("generic", (), known=False)


def _names(pipe: Any) -> list[str]:
    """Class names of the pipeline and, through ``inner``, of the pipeline a wrapper wraps."""
    names = [c.__name__ for c in type(pipe).__mro__]
    try:  # the wrapper's own attribute, not one it forwards
        inner = object.__getattribute__(pipe, "inner")
    except AttributeError:
        inner = None
    return names if inner is None else [*names, *_names(inner)]


def architecture_of(pipe: Any) -> Architecture:
    """The family of a loaded pipeline, or of a wrapper's ``inner`` pipeline."""
    names = _names(pipe)
    for family in FAMILIES:
        if any(n in family.classes for n in names):
            return family
    warnings.warn(
        f"renderq has no rules for {names[0]}; it uses the generic ones (sizes in multiples "
        "of 8 and of the VAE factor, negative prompts as a list, no prompt-length buckets)",
        UserWarning,
        stacklevel=2,
    )
    return GENERIC


@dataclass(frozen=True, slots=True)
class PromptLength:
    """How a prompt fits the pipeline's text encoders.

    ``bucket`` is the T5 ``max_sequence_length`` it renders at (0: no T5, one bucket);
    ``truncated`` names each encoder that cuts it, with its token count and limit.
    """

    bucket: int
    truncated: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Rules:
    """An architecture bound to one loaded pipeline."""

    arch: Architecture
    pipe: Any

    @property
    def size_multiple(self) -> int:
        """Width and height must be multiples of this."""
        vae = int(getattr(self.pipe, "vae_scale_factor", 8) or 8)
        if self.arch.sizes == "patch":
            return vae * int(getattr(self.pipe, "patch_size", 2) or 2)
        if self.arch.sizes == "pack2":
            return vae * 2
        return math.lcm(8, vae)

    def check_size(self, model: str, width: int, height: int) -> None:
        """Raise ConfigError unless the pipeline renders exactly ``width`` x ``height``."""
        m = self.size_multiple
        if width <= 0 or height <= 0 or width % m or height % m or max(width, height) > 8192:
            raise ConfigError(
                f"size {width}x{height} is not possible for model {model!r} ({self.arch.name}): "
                f"width and height must be positive multiples of {m} (at most 8192)"
            )

    def check_negative_prompt(self, model: str, negative_prompt: str) -> None:
        """Raise ConfigError where the family would ignore a negative prompt."""
        if negative_prompt and self.arch.negatives == "refuse":
            raise ConfigError(
                f"model {model!r} ({self.arch.name}) has no classifier-free guidance and would "
                f"ignore negative_prompt {negative_prompt!r}; remove it"
            )

    def t5_limit(self) -> int:
        """The pipeline's own ``max_sequence_length`` default (0 without a T5 encoder)."""
        if self.arch.t5_tokenizer is None:
            return 0
        param = inspect.signature(self.pipe.__call__).parameters.get("max_sequence_length")
        default = None if param is None else param.default
        return int(default) if isinstance(default, int) else 256

    def prompt_length(self, prompt: str) -> PromptLength:
        """The prompt's T5 bucket and the encoders that would truncate it."""
        truncated: list[str] = []
        for attr in ("tokenizer", "tokenizer_2"):
            tok = getattr(self.pipe, attr, None)
            if tok is None or attr == self.arch.t5_tokenizer:
                continue
            limit = int(getattr(tok, "model_max_length", 77))
            n = _count(tok, prompt)
            if n > limit:
                truncated.append(f"{attr}: {n} tokens, limit {limit}")
        limit = self.t5_limit()
        if not limit:
            return PromptLength(0, tuple(dict.fromkeys(truncated)))
        tok = getattr(self.pipe, str(self.arch.t5_tokenizer), None)
        n = _count(tok, prompt) if tok is not None else 0
        if n > limit:
            truncated.append(f"{self.arch.t5_tokenizer}: {n} tokens, limit {limit}")
        return PromptLength(bucket_for(n, limit), tuple(truncated))

    def call_kwargs(self, reqs: Sequence[Any], bucket: int) -> dict[str, Any]:
        """Pipeline arguments this family needs for a batch: negatives, sequence length."""
        kwargs: dict[str, Any] = {}
        if bucket and self.arch.t5_tokenizer is not None:
            kwargs["max_sequence_length"] = bucket
        negatives = [r.negative_prompt for r in reqs]
        if not any(negatives) or self.arch.negatives == "refuse":
            return kwargs
        if self.arch.negatives == "zeros" and _forces_zeros(self.pipe):
            kwargs.update(self._sdxl_embeddings(reqs, negatives))
        else:
            kwargs["negative_prompt"] = negatives
        return kwargs

    def _sdxl_embeddings(self, reqs: Sequence[Any], negatives: list[str]) -> dict[str, Any]:
        """SDXL's embeddings for a mixed batch: rows without a negative prompt get zeros."""
        prompts = [r.prompt for r in reqs]
        pos, neg, pooled, neg_pooled = self.pipe.encode_prompt(
            prompt=prompts,
            device=getattr(self.pipe, "device", None),
            num_images_per_prompt=1,
            do_classifier_free_guidance=True,
            negative_prompt=[n or "" for n in negatives],
        )
        for i, n in enumerate(negatives):
            if not n:
                neg[i] = 0.0
                neg_pooled[i] = 0.0
        return {
            "prompt": None,
            "prompt_embeds": pos,
            "negative_prompt_embeds": neg,
            "pooled_prompt_embeds": pooled,
            "negative_pooled_prompt_embeds": neg_pooled,
        }


def _forces_zeros(pipe: Any) -> bool:
    config: Any = getattr(pipe, "config", None) or {}
    return bool(config.get("force_zeros_for_empty_prompt", False))


def _count(tokenizer: Any, prompt: str) -> int:
    """Tokens of ``prompt`` with the encoder's special tokens, before any truncation."""
    ids = tokenizer(prompt, truncation=False, add_special_tokens=True, verbose=False).input_ids
    return len(ids)


def bucket_for(n_tokens: int, limit: int) -> int:
    """The smallest T5 bucket edge (cut at ``limit``) that holds ``n_tokens``."""
    for edge in (e for e in T5_EDGES if e < limit):
        if n_tokens <= edge:
            return edge
    return limit


def rules_for(pipe: Any) -> Rules:
    """The rules of a loaded pipeline."""
    return Rules(architecture_of(pipe), pipe)
