"""NVFP4 static `input_scale`s for the rollout checkpoint: carried from the source, calibrated, or flagged.

SGLang's ModelOpt NVFP4 path quantizes every GEMM input with the checkpoint's static
per-tensor `input_scale`, so a weight converter cannot make it up. Per tensor, in order:
the source's own `input_scale` (a ModelOpt-calibrated source), unchanged; else the
embedded runtime's calibration (`pcc.runtime.calibrate.input_scales`, ModelOpt's
amax / (6 * 448)) over the source weights, for the architectures the runtime model builds;
else 1.0, counted as uncalibrated so the caller warns. docs/convert.md "Input scales".
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field

from pcc.convert import ConvertError

# `auto` calibrates on the CPU up to this many source parameters: the calibration holds them
# as BF16 plus a float32 copy (6 bytes each) and runs every expert on every calibration token.
CPU_CALIBRATION_MAX_PARAMS = 10**9
UNCALIBRATED = 1.0  # what SGLang would apply with no calibration: a global encode factor of 1
# config.json features the runtime model does not compute; calibrating through it would measure another model.
# key -> the values it may take (absent is fine).
_PLAIN = {"rope_scaling": (None, {}, {"rope_type": "default"}, {"type": "default"}), "attention_bias": (False,),
          "mlp_bias": (False,), "tie_word_embeddings": (False,), "hidden_act": ("silu",)}


class CalibrationUnsupported(ConvertError):
    """The source is not a model the embedded runtime's calibration can run."""


@dataclass
class InputScales:
    """Checkpoint name -> float32 scalar, and where each value came from."""

    values: dict = field(default_factory=dict)
    carried: int = 0
    calibrated: int = 0
    uncalibrated: list[str] = field(default_factory=list)
    reason: str | None = None  # why some scales stayed uncalibrated
    batch: str | None = None  # the calibration batch, when one ran
    seconds: float = 0.0

    def summary(self) -> dict:
        return {"input_scales": len(self.values), "carried_input_scales": self.carried,
                "calibrated_input_scales": self.calibrated, "uncalibrated_input_scales": len(self.uncalibrated),
                "uncalibrated_reason": self.reason, "calibration_batch": self.batch,
                "calibration_seconds": round(self.seconds, 3)}

    def identity(self) -> str:
        """For the resume job id: a different calibration is a different conversion."""
        return hashlib.sha256(repr(sorted((n, float(v)) for n, v in self.values.items())).encode()).hexdigest()


def resolve(plan, src, calibrate: bool | None, tokens_file: str | None = None) -> InputScales:
    """The input scales `pcc convert` writes. calibrate: True (required: refuse what cannot be
    calibrated), None (auto: calibrate when supported and at most CPU_CALIBRATION_MAX_PARAMS),
    False (never)."""
    from pcc.plan.encode import static_targets

    targets = static_targets(plan)
    names = sorted(targets.values())
    out = InputScales()
    if not names:  # (no torch imported: a conversion may need none, pcc.convert.fast)
        return out
    import torch

    for name in names:
        if name in src.where:
            out.values[name] = _carried(src, name)
    out.carried = len(out.values)
    missing = [n for n in names if n not in out.values]
    if missing:
        out.reason = _why_not(plan, src, calibrate)
        if out.reason is None:
            t0 = time.perf_counter()
            tokens = _tokens(tokens_file, plan) if tokens_file else None
            got = _calibrate(plan, src, tokens)
            out.batch = f"{tokens_file} {list(tokens.shape)}" if tokens_file else _runtime_batch()
            out.seconds = time.perf_counter() - t0
            out.values.update({n: got[n] for n in missing})
            out.calibrated = len(missing)
        else:
            out.values.update({n: torch.full((), UNCALIBRATED, dtype=torch.float32) for n in missing})
    out.values = shared(plan, targets, {n: out.values[n] for n in names})
    out.uncalibrated = [n for n in names if float(out.values[n]) == UNCALIBRATED]
    if out.uncalibrated and out.reason is None:
        out.reason = "1.0 carried from the source, or an operator no calibration token reached (amax 0)"
    return out


def shared(plan, targets: dict[str, str], values: dict) -> dict:
    """`values` (input_scale name -> scale) with every NVFP4 scale group's members set to the group's
    largest: a fused linear quantizes its one input with one scale (ModelOpt's export takes the max
    amax over linears sharing an input; SGLang's and vLLM's loaders the max of the members').
    `targets`: operator tensor -> its input_scale name; a group with a member missing from `values`
    is left as it is."""
    out = dict(values)
    for t in plan.rollout_tensors:
        group = (t or {}).get("scale_group")
        if group and all(targets.get(m) in values for m in group):  # W4A16 NVFP4 members have no input_scale
            top = max((values[targets[m]] for m in group), key=float)
            out.update({targets[m]: top for m in group})
    return out


def _runtime_batch() -> str:
    from pcc.runtime.calibrate import CALIBRATION_ROWS, CALIBRATION_SEED

    return f"pcc.runtime.calibrate's {CALIBRATION_ROWS} reverse-task sequences (seed {CALIBRATION_SEED})"


def _carried(src, name: str):
    """The source's input_scale as float32 []: a one-element finite positive float, value unchanged."""
    import torch

    file = src.root / src.where[name]
    t = src.load(name)
    if not t.is_floating_point() or t.numel() != 1:
        raise ConvertError(f"{file}: {name} is {src.entries[name]['dtype']} {list(t.shape)}; an input_scale is "
                           "one floating-point value")
    v = t.reshape(()).to(torch.float32)
    if not (math.isfinite(float(v)) and float(v) > 0):
        raise ConvertError(f"{file}: {name} = {float(v)}; an input_scale must be finite and positive")
    return v


def _why_not(plan, src, calibrate: bool | None) -> str | None:
    """None when calibration runs; else why not (raised instead when it was required)."""
    if calibrate is False:
        return "--no-calibrate"
    try:
        check_supported(plan, src)
    except CalibrationUnsupported as err:
        if calibrate:
            raise
        return str(err)
    params = sum(math.prod(op.shape) for op in plan.catalog.operators if op.family != "kv_cache")
    if calibrate is None and params > CPU_CALIBRATION_MAX_PARAMS:
        return (f"{params / 1e9:.2f}B parameters, over the {CPU_CALIBRATION_MAX_PARAMS / 1e9:g}B that are "
                "calibrated on the CPU by default; pass --calibrate to run it anyway")
    return None


def check_supported(plan, src) -> None:
    """Refuse a source the runtime model would compute differently from the real architecture."""
    from pcc.runtime.model import SUPPORTED, Arch, ArchError

    cfg = plan.catalog.config.get("text_config", plan.catalog.config)
    mt = cfg.get("model_type")
    where = src.root / "config.json"
    if mt not in SUPPORTED:
        raise CalibrationUnsupported(f"{where}: model_type {mt!r} is not an architecture pcc.runtime's model builds "
                                     f"({', '.join(sorted(SUPPORTED))}), so pcc cannot calibrate its NVFP4 "
                                     "input_scale; calibrate with ModelOpt and convert that checkpoint "
                                     "(its input_scale tensors are carried over)")
    for key, plain in _PLAIN.items():
        if key in cfg and cfg[key] not in plain:
            raise CalibrationUnsupported(f"{where}: {key} = {cfg[key]!r}, which pcc.runtime's {mt} model does not "
                                         "compute; its calibration would measure a different model")
    try:
        arch = Arch.from_catalog(plan.catalog)
        arch.check_catalog(plan.catalog)
    except ArchError as err:
        raise CalibrationUnsupported(f"{src.root}: {err}") from None
    for name in arch.buffers():  # held at zero by the runtime model (DeepSeek's score-correction bias)
        if name in src.where and bool(src.load(name).float().abs().max() > 0):
            raise CalibrationUnsupported(f"{src.root / src.where[name]}: {name} is nonzero; pcc.runtime's "
                                         f"{mt} router holds it at zero, so its routing would differ")


def _calibrate(plan, src, tokens):
    """Every operator's source weight (a quantized source's dequantized), rounded to BF16 as the live
    sync's bridge does, through the runtime's calibration."""
    import torch

    from pcc.runtime.calibrate import input_scales

    weights = {op.tensor: src.weight(op.tensor).to(torch.bfloat16) for op in plan.catalog.operators
               if op.family != "kv_cache"}
    return input_scales(plan, weights, tokens)


def _tokens(path: str, plan):
    """Calibration token ids [rows, seq] from a safetensors file holding one integer tensor."""
    import torch
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as f:
            keys = list(f.keys())
            if len(keys) != 1:
                raise ConvertError(f"{path}: calibration tokens are one integer tensor [rows, seq], found {keys}")
            t = f.get_tensor(keys[0])
    except (SafetensorError, OSError) as err:
        raise ConvertError(f"{path}: unreadable calibration tokens ({err})") from None
    vocab = plan.catalog.config.get("text_config", plan.catalog.config).get("vocab_size")
    if t.dim() != 2 or t.is_floating_point() or t.dtype == torch.bool or t.numel() == 0:
        raise ConvertError(f"{path}: {keys[0]} is {t.dtype} {list(t.shape)}; calibration tokens are integer ids "
                           "[rows, seq]")
    if int(t.min()) < 0 or (vocab and int(t.max()) >= vocab):
        raise ConvertError(f"{path}: {keys[0]} holds ids outside [0, {vocab})")
    return t.long()

