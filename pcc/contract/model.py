"""The canonical contract: a typed pydantic model, the same for .prec, YAML and JSON.

Every section has defaults so that a child contract (``extends``) states only
what it changes; `pcc.contract.io` merges parent and child at the dict level
using exactly the fields each one set.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pcc.contract.scheme import Scheme, _Model  # (one base: forbid extras, frozen, built on first use)


Dtype = Literal["bf16", "fp16", "fp32", "fp8"]
Component = Literal["rollout", "fprop", "dgrad", "wgrad"]
GEMM_COMPONENTS = ("fprop", "dgrad", "wgrad")


class ModelRef(_Model):
    catalog: str | None = None
    path: str | None = None

    @model_validator(mode="after")
    def _one(self) -> "ModelRef":
        if (self.catalog is None) == (self.path is None):
            raise ValueError("a model is either a catalog name or a checkpoint path")
        return self


class Rule(_Model):
    """Operators matched by `patterns` get `scheme` in `components`.

    `keep` rules beat pattern rules; among rules of one kind the later wins
    (docs/language.md, "Precedence").
    """

    components: list[Component] = Field(min_length=1)
    patterns: list[str] = Field(min_length=1)
    scheme: str
    keep: bool = False
    gemm: Literal["real", "qdq"] | None = None
    accumulate: Literal["fp32", "bf16", "fp16"] | None = None
    output: Literal["fp32", "bf16", "fp16"] | None = None


class Parallel(_Model):
    tp: int = Field(default=1, ge=1, le=4096)
    ep: int = Field(default=1, ge=1, le=4096)
    pp: int = Field(default=1, ge=1, le=4096)
    cp: int = Field(default=1, ge=1, le=4096)  # context parallelism: a sequence's tokens split over ranks
    dp: int = Field(default=1, ge=1, le=65536)
    gpus: int | None = Field(default=None, ge=1, le=1_000_000)


def _section_rules(rules: list[Rule], section: str, allowed: tuple[str, ...]) -> list[Rule]:
    """Rules state only what their section can run: rollout rules the rollout component, trainer
    rules GEMM components, and a keep rule every component of its section (as `.prec` writes it)."""
    for k, r in enumerate(rules):
        bad = [c for c in r.components if c not in allowed]
        if bad:
            raise ValueError(f"rules[{k}]: {section} rules take components {', '.join(allowed)}, not {', '.join(bad)}")
        if r.keep and (sorted(set(r.components)) != sorted(allowed) or r.gemm or r.accumulate or r.output):
            raise ValueError(f"rules[{k}]: a keep rule applies to every {section} component "
                             f"({', '.join(allowed)}) and takes no gemm, accumulate or output")
    return rules


class Rollout(_Model):
    engine: Literal["sglang", "vllm"] = "sglang"
    hardware: str | None = None
    rules: list[Rule] = Field(default_factory=list)
    parallel: Parallel = Parallel()
    deterministic: bool = False
    max_tokens: int | None = Field(default=None, ge=1)
    record: list[Literal["logprobs", "experts", "versions"]] = ["logprobs", "versions"]

    @field_validator("rules")
    @classmethod
    def _rules(cls, v: list[Rule]) -> list[Rule]:
        return _section_rules(v, "rollout", ("rollout",))


class Optimizer(_Model):
    kind: Literal["adam", "sgd"] = "adam"
    distributed: bool = False
    offload: bool = False
    precision_aware: bool = False


class Trainer(_Model):
    engine: Literal["megatron", "fsdp"] = "megatron"
    impl: Literal["transformer_engine", "local"] = "transformer_engine"
    hardware: str | None = None
    rules: list[Rule] = Field(default_factory=list)
    params: Dtype = "bf16"
    master: Dtype = "fp32"
    moments: Dtype = "fp32"
    grads: Dtype = "fp32"
    param_gather: Dtype = "bf16"
    optimizer: Optimizer = Optimizer()
    parallel: Parallel = Parallel()

    @field_validator("rules")
    @classmethod
    def _rules(cls, v: list[Rule]) -> list[Rule]:
        return _section_rules(v, "trainer", GEMM_COMPONENTS)


class Trainable(_Model):
    kind: Literal["all", "none", "lora"] = "all"
    rank: int | None = Field(default=None, ge=1, le=65536)
    alpha: float | None = Field(default=None, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    targets: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _lora(self) -> "Trainable":
        if self.kind == "lora":
            if self.rank is None or not self.targets:
                raise ValueError("a LoRA trainable set needs 'rank' and 'targets'")
        elif self.rank is not None or self.targets:
            raise ValueError(f"'rank' and 'targets' belong to 'trainable lora', not 'trainable {self.kind}'")
        return self


class Sync(_Model):
    moves: Literal["full_weights", "adapter"] = "full_weights"
    schedule: Literal["colocated", "async"] = "colocated"
    max_staleness: int = Field(default=0, ge=0, le=1000)
    bridge: Literal["bf16", "fp8", "packed"] = "bf16"
    activation: Literal["atomic", "eager"] = "atomic"
    transfer: Literal["broadcast", "p2p", "disk"] = "broadcast"
    interval: int = Field(default=1, ge=1, le=100000)


class Correction(_Model):
    kind: Literal["none", "tis", "mis", "masked", "rejection"] = "none"
    clip: float | None = Field(default=None, gt=0)
    low: float | None = Field(default=None, ge=0)
    level: Literal["token", "sequence"] = "token"
    threshold: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> "Correction":
        if self.kind == "tis" and self.clip is None:
            raise ValueError("'correction tis' needs 'clip' (e.g. clip 2.0)")
        if self.clip is not None and self.low is not None and self.low >= self.clip:
            raise ValueError("'low' must be below 'clip'")
        return self


class Expectation(_Model):
    metric: str
    stat: str | None = None
    op: Literal["<=", ">=", "<", ">", "=="]
    value: float

    @property
    def key(self) -> str:
        return f"{self.metric} {self.stat}" if self.stat else self.metric


class Contract(_Model):
    """One precision contract, canonical after `extends` is resolved."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$")
    extends: str | None = None
    model: ModelRef | None = None
    hardware: str | None = None
    # the stack that launches trainer and rollout; None: Miles for Megatron + SGLang, else none (`runs_on`)
    framework: Literal["miles", "verl", "nemo_rl"] | None = None
    schemes: dict[str, Scheme] = Field(default_factory=dict)
    rollout: Rollout = Rollout()
    trainer: Trainer = Trainer()
    trainable: Trainable = Trainable()
    sync: Sync = Sync()
    correction: Correction = Correction()
    routing_replay: Literal["none", "r2", "r3"] = "none"
    expect: list[Expectation] = Field(default_factory=list)

    @field_validator("schemes")
    @classmethod
    def _scheme_names(cls, v: dict[str, Scheme]) -> dict[str, Scheme]:
        for k in v:
            if not k.replace("_", "a").replace("-", "a").isalnum():
                raise ValueError(f"scheme name {k!r} is not a name")
        return v

    @property
    def runs_on(self) -> str | None:
        """The framework that launches this contract's trainer and rollout: the one it names, else Miles
        where it is Megatron + SGLang (what Miles runs), else none (the bundle carries the engines' files)."""
        if self.framework is not None:
            return self.framework
        return "miles" if (self.trainer.engine, self.rollout.engine) == ("megatron", "sglang") else None
