"""What the ladder needs from a rollout engine, and the values that cross it.

Three implementations: `LocalEngine` (the embedded runtime's rollout engine), `HttpEngine`
(a real SGLang server) and `VllmEngine` (a real `vllm serve`). Tokens are always given, never re-tokenized:
fixed-prefix scoring compares the same token ids on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import torch

from pcc.lang.diagnostics import PccError


class EngineError(PccError, RuntimeError):
    """The engine did not do what was asked; the message names the request and the reply."""

    code = "PCC704"


class ActivationRefused(EngineError):
    """The engine refused to activate a version (a partial or damaged one): the right answer."""


class NotServed(EngineError):
    """The engine's API has no way to do this (e.g. vLLM returns no parameter values over HTTP): the
    level records the figure as not measured, with this message, instead of guessing it."""


@dataclass
class Scores:
    """Log-probs of tokens[:, prompt_len:] given their prefixes, and what served them."""

    logp: torch.Tensor  # [N, G] float64
    routes: list[torch.Tensor] | None  # per MoE layer, expert ids [N, T - 1, k]; None when not reported
    version: int  # the version the engine says served the request


@dataclass
class Generated:
    tokens: torch.Tensor  # [N, P + G]
    logp: torch.Tensor  # behaviour log-probs [N, G]
    versions: torch.Tensor | None  # per generated token, as the engine reports it [N, G]; None if it does not


@dataclass
class Version:
    """One weight version in the rollout layout, with the manifest that describes it."""

    version: int
    moves: str  # "full_weights" | "adapter"
    tensors: dict[str, torch.Tensor]
    manifest: dict = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    name: str

    def score(self, tokens: torch.Tensor, prompt_len: int, routes: bool = False,
              cached_prefix: bool = False) -> Scores:
        """Score fixed tokens. `cached_prefix`: reuse request state built from the prompt first
        (decode with a KV cache, or a radix-cache hit) instead of one prefill."""

    def generate(self, prompts: torch.Tensor, new_tokens: int, seed: int,
                 between: Callable[[int], None] | None = None) -> Generated:
        """Sample at temperature 1. `between(t)` runs after token t of the batch (an activation
        arriving mid-batch); the engine must not switch versions inside one trajectory."""

    def read_tensor(self, name: str) -> torch.Tensor:
        """The values an installed operator weight (HF name) holds as the engine serves it."""

    def install(self, version: Version) -> None:
        """Transfer a version to the engine without activating it."""

    def activate(self, version: int) -> None:
        """Make an installed version the one that serves; raises ActivationRefused if incomplete."""

    def active(self) -> tuple[int, dict]:
        """(version, manifest) the engine serves now."""
