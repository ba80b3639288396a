"""Miles: one launch that runs the Megatron trainer and the SGLang rollout over Ray.

Miles takes Megatron's arguments as they are, SGLang's as `--sglang-<field>`,
and its own for placement, sync, corrections and LoRA. The trainer's precision
stays Megatron flags and environment (from the megatron target); the rollout's
comes from the checkpoint the converter builds (`--hf-checkpoint`), whose
`quantization_config` decides how every weight sync quantizes.
"""

from __future__ import annotations

import json
import shlex

from pcc.lower import Lowered, Unsupported, lower, module_leaf, target
from pcc.plan import Plan

BUFFER_BYTES = 512 << 20  # Miles' default --update-weight-buffer-size
TRANSFER = {"broadcast": "broadcast", "p2p": "p2p", "disk": "disk-delta"}
# SGLang arguments Miles sets itself (placement and the model path).
NOT_PASSED_THROUGH = {"--model-path", "--tp-size", "--ep-size", "--dp-size"}


def _sglang_passthrough(args: list[str]) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in NOT_PASSED_THROUGH:
            skip = i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append("--sglang-" + a[2:] if a.startswith("--") else a)
    return out


def miles_args(plan: Plan) -> tuple[str, list[str], list[str]]:
    """(entry script, Miles' own arguments, notes)."""
    c = plan.contract
    args: list[str] = []
    notes: list[str] = []
    script = "train.py"
    if c.sync.schedule == "colocated":
        args.append("--colocate")
    else:
        script = "train_async.py"
        if c.sync.max_staleness > 1:
            args += ["--fully-async", "--max-weight-staleness", str(c.sync.max_staleness)]
            notes.append(f"async with staleness bound {c.sync.max_staleness}: fully-async mode")
        else:
            notes.append("async with staleness 1: train_async.py overlaps one update")
    args += ["--rollout-num-gpus-per-engine", str(c.rollout.parallel.tp)]
    args += ["--update-weight-transfer-mode", TRANSFER[c.sync.transfer],
             "--update-weight-buffer-size", str(BUFFER_BYTES)]
    if c.sync.interval != 1:
        args += ["--update-weights-interval", str(c.sync.interval)]
    corr = c.correction
    if corr.kind == "tis":
        args += ["--use-tis", "--tis-clip", f"{corr.clip:g}"]
        if corr.low is not None:
            args += ["--tis-clip-low", f"{corr.low:g}"]
    elif corr.kind != "none":
        args.append("--use-tis")
        notes.append(f"correction '{corr.kind}' has no built-in Miles flag: the launch requires "
                     "PCC_TIS_FUNCTION, the --custom-tis-function-path that implements it")
    if c.routing_replay == "r3":
        args.append("--use-rollout-routing-replay")
    elif c.routing_replay == "r2":
        args.append("--use-routing-replay")
    t = c.trainable
    if t.kind == "lora":
        mods, wider = lora_modules(plan)
        args += ["--lora-rank", str(t.rank), "--lora-alpha", f"{t.alpha:g}", "--target-modules", ",".join(mods)]
        if wider:
            notes.append(f"Miles matches LoRA targets by module name: {', '.join(mods)} also names "
                         f"{wider} operator(s) outside the contract's targets")
        if t.dropout:
            args += ["--lora-dropout", f"{t.dropout:g}"]
    args.append("--check-weight-update-equal")
    if plan.quantized("rollout"):
        args.append("--check-weight-update-allow-quant-error")
        notes.append("rollout is quantized: the first-update check allows 1 ULP of the quantized dtype")
    return script, args, notes


def lora_modules(plan: Plan) -> tuple[list[str], int]:
    """HF module names of the LoRA targets (Miles accepts HF naming), and how many other
    operators those names would also select."""
    ops = plan.catalog.operators
    mods = sorted({module_leaf(ops[i].tensor) for i in plan.trainable})
    chosen = set(plan.trainable)
    wider = sum(1 for i, op in enumerate(ops) if i not in chosen and op.family != "kv_cache"
                and module_leaf(op.tensor) in mods)
    return mods, wider


def _flag_lines(args: list[str], bundle_files: set[str]) -> list[str]:
    """Shell-quoted arguments, one flag with its values per line. A bundle file named by an
    argument (the TE precision file) becomes an absolute path, since the launch runs in MILES_DIR."""
    out: list[str] = []
    for a in args:
        text = f'"$bundle"/{shlex.quote(a)}' if a in bundle_files else shlex.quote(a)
        if a.startswith("--") or not out:
            out.append(text)
        else:
            out[-1] += " " + text
    return out


@target("miles", honours=("sync", "correction", "routing_replay", "trainable", "rollout.parallel", "trainer.parallel"))
def lower_miles(plan: Plan) -> Lowered:
    mega = lower(plan, "megatron")
    roll = lower(plan, "sglang")
    script, own, notes = miles_args(plan)
    args = mega.args + own + _sglang_passthrough(roll.args)
    env = dict(sorted({**mega.env, **roll.env}.items()))
    runtime_env = json.dumps({"env_vars": env}, indent=1, sort_keys=True) + "\n"
    quoted = " \\\n  ".join(_flag_lines(args, set(mega.files) | set(roll.files)))
    custom = plan.contract.correction.kind not in ("none", "tis")
    need_tis = (f': "${{PCC_TIS_FUNCTION:?correction {plan.contract.correction.kind} needs its '
                'implementation: set PCC_TIS_FUNCTION to a --custom-tis-function-path}"\n') if custom else ""
    tis_arg = ' \\\n  --custom-tis-function-path "$PCC_TIS_FUNCTION"' if custom else ""
    launch = f"""#!/usr/bin/env bash
# Generated by pcc from contract {shlex.quote(plan.contract.name)}: the Miles launch (Megatron + SGLang over Ray).
set -euo pipefail
here="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
bundle="$(dirname "$here")"
: "${{PCC_ROLLOUT_CHECKPOINT:?set it to the rollout checkpoint (pcc convert builds it)}}"
: "${{PCC_REF_LOAD:?set it to the BF16 trainer weights}}"
: "${{MILES_DIR:?set it to a Miles checkout}}"
{need_tis}cd "$MILES_DIR"
exec ray job submit --address "${{RAY_ADDRESS:-http://127.0.0.1:8265}}" \\
  --runtime-env-json "$(cat "$here/runtime-env.json")" \\
  -- python3 {script} \\
  {quoted} \\
  --hf-checkpoint "$PCC_ROLLOUT_CHECKPOINT" \\
  --ref-load "$PCC_REF_LOAD"{tis_arg}
"""
    files = {"miles/args.txt": "\n".join([script] + args) + "\n", "miles/runtime-env.json": runtime_env,
             "miles/launch.sh": launch}
    caveats = []
    if plan.contract.sync.activation == "eager":
        caveats.append(Unsupported(
            "Miles pauses generation, installs the whole update and then resumes, so a version activates "
            "atomically there; 'activation eager' is honoured by the embedded runtime only", "PCC612",
            "sync.activation", "write 'activation atomic', or run the contract on the embedded runtime"))
    return Lowered("miles", args=[script] + args, env=env, files=files, notes=mega.notes + roll.notes + notes,
                   caveats=caveats)
