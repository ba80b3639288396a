"""Everything the levels share: the plan, the warm-started weights, the trainer, the engine,
the fixed prefixes and tokens, and the run directory.

Both sides start from the same weights: the trainer holds them at the plan's parameter
dtype; the rollout engine loads version 0 from the rollout checkpoint that `pcc convert`
wrote from exactly those weights (level 2 checks that checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from pcc.lang.inputs import read_json
from pcc.lang.outputs import atomic_path, write_atomic
from pcc.runtime.model import Arch
from pcc.runtime.sync import convert_adapter, manifest
from pcc.runtime.task import ReverseTask
from pcc.runtime.trainer import Trainer
from pcc.runtime.warmstart import RECIPE, warm_start

from .engine import Engine, Version
from .local import LocalTrainer


@dataclass
class ValidateConfig:
    seed: int = 0
    prompts: int = 32  # fixed prefixes for levels 4-6
    group: int = 2  # sampled continuations per prefix
    episodes: int = 6  # level 5: task episodes concatenated into one long context
    steps: int = 6  # level 8: RL steps
    lr: float = 3e-4
    perturbation: float = 0.02  # level 6: relative size of the synthetic change
    warm: dict = field(default_factory=lambda: dict(RECIPE))


@dataclass
class Context:
    compiled: object  # pcc.runtime.contract.Compiled
    cfg: ValidateConfig
    out: Path
    engine_spec: str = "local"
    faults: tuple = ()
    expectations: dict = field(default_factory=dict)
    shared: dict = field(default_factory=dict)  # what one level hands the next (tokens, baseline)

    def __post_init__(self):
        self.plan = self.compiled.plan
        self.arch = Arch.from_catalog(self.plan.catalog)
        self.arch.check_catalog(self.plan.catalog)
        self.task = ReverseTask()
        torch.manual_seed(self.cfg.seed)
        self.warm, self.warm_cached = warm_start(self.arch, self.task, self.cfg.seed, self.cfg.warm)
        self.runtime_trainer = self.new_trainer()
        self.trainer = LocalTrainer(self.runtime_trainer)
        self.adapter = self.plan.contract.sync.moves == "adapter"
        self._engine: Engine | None = None
        self._checkpoint: Path | None = None
        self.calibration: dict = {}
        self.verified: dict = {}  # pcc verify-checkpoint of the file exactly as pcc convert wrote it

    def new_trainer(self, variant: str | None = None) -> Trainer:
        return Trainer(self.arch, self.plan, self.warm, self.cfg.lr, variant, self.cfg.seed)

    # -- the rollout checkpoint (written by pcc convert) ------------------------------------
    def contract_file(self) -> str:
        """The contract as the converter reads it: the file itself, or, with --model, the
        re-resolved contract exported next to the run (the converter compiles files)."""
        if self.compiled.model_override is None:
            return self.compiled.path
        from pcc.contract.io import export

        path = self.out / "contract.yaml"
        write_atomic(path, export(self.plan.contract, "yaml"))
        return str(path)

    def checkpoint(self) -> Path:
        """Source checkpoint (the trainer's weights, BF16) and the rollout checkpoint built from it:
        verified as `pcc convert` wrote it, then given calibrated static input scales (level 2 reports)."""
        if self._checkpoint is None:
            from pcc.convert.run import convert
            from pcc.convert.verify import verify
            from pcc.runtime.checkpoint import save_model

            from .faults import after_convert

            src, dst = self.out / "source", self.out / "rollout"
            save_model(src, self.runtime_trainer.weights() | self.arch.buffers(), self.plan.catalog.config)
            convert(self.contract_file(), str(src), str(dst), force=True)
            after_convert(self, dst)
            self.verified = verify(self.contract_file(), str(dst), source=str(src), full=True)
            self.calibration = calibrate_checkpoint(self.plan, self.runtime_trainer.weights(), dst)
            self._checkpoint = dst
        return self._checkpoint

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        from pcc.convert.source import open_source

        src = open_source(self.checkpoint())
        try:
            return {name: src.load(name).clone() for name in src.where}
        finally:
            src.close()

    # -- versions ------------------------------------------------------------------------------
    def adapter_version(self, version: int, adapters: dict[str, torch.Tensor]) -> Version:
        tensors = convert_adapter(adapters)
        return Version(version, "adapter", tensors, manifest(version, "adapter", tensors))

    def full_version(self, version: int, tensors: dict[str, torch.Tensor]) -> Version:
        return Version(version, "full_weights", tensors, manifest(version, "full_weights", tensors))

    @property
    def engine(self) -> Engine:
        """The rollout engine, serving version 0: the checkpoint (and, for LoRA, the initial adapter)."""
        if self._engine is None:
            eng = self._make_engine()
            base = self.full_version(0, self.checkpoint_tensors())
            eng.install(base)
            eng.activate(0)
            if self.adapter:
                ad = self.adapter_version(0, self.runtime_trainer.adapters)
                eng.install(ad)
                eng.activate(0)
            self._engine = eng
        return self._engine

    def _make_engine(self) -> Engine:
        from .faults import engine_class

        if self.engine_spec == "local":
            return engine_class(self)(self.plan, self.arch, self.runtime_trainer.scaling)
        from .sglang_http import HttpEngine
        from .vllm_http import VllmEngine

        kind = VllmEngine if self.plan.contract.rollout.engine == "vllm" else HttpEngine  # the contract's engine
        return kind(self.engine_spec, self.out / "versions", self.plan, self.arch)

    # -- fixed prefixes and tokens ----------------------------------------------------------
    def fixed(self) -> tuple[torch.Tensor, int]:
        """Task prompts and continuations sampled once by the rollout engine at version 0,
        then held fixed: every later comparison scores exactly these tokens."""
        if "tokens" not in self.shared:
            gen = torch.Generator().manual_seed(self.cfg.seed * 7919 + 1)
            prompts = self.task.prompts(self.cfg.prompts, gen).repeat_interleave(self.cfg.group, 0)
            g = self.engine.generate(prompts, self.task.answer_len, self.cfg.seed)
            self.shared["tokens"], self.shared["behaviour"] = g.tokens, g.logp
        return self.shared["tokens"], self.task.prompt_len

    def write_json(self, name: str, doc) -> Path:
        from pcc.runtime.checkpoint import write_json

        path = self.out / name
        write_json(path, doc)
        return path

    def read_json(self, name: str):
        path = self.out / name
        return read_json(path, what=name) if path.is_file() else None


def calibrate_checkpoint(plan, weights: dict[str, torch.Tensor], directory: Path) -> dict:
    """The calibration step ModelOpt runs before export: write each NVFP4 operator's calibrated static
    `input_scale` (pcc.runtime.calibrate, the values the live sync's converter step computes) into the
    rollout checkpoint when `pcc convert` left others there. Returns what it replaced, for level 2."""
    from safetensors.torch import save_file

    from pcc.convert.source import open_source
    from pcc.runtime.calibrate import input_scales

    want = input_scales(plan, {k: v.to(torch.bfloat16) for k, v in weights.items()})
    if not want:
        return {}
    src = open_source(directory)
    try:
        tensors = {n: src.load(n).clone() for n in src.where}
        files = sorted(set(src.where.values()))
    finally:
        src.close()
    wrote = {n: float(tensors[n]) for n in want if not torch.equal(tensors[n], want[n])}
    if wrote:
        if len(files) != 1:
            raise RuntimeError(f"{directory}: calibrating input scales needs a single-file checkpoint, got {files}")
        path = directory / files[0]
        with atomic_path(path) as tmp:
            save_file({**tensors, **want}, str(tmp), metadata={"format": "pt"})
    return {"operators": len(want), "replaced": wrote,
            "calibrated": {n: float(t) for n, t in list(want.items())[:4]}}

