"""Miles: one launch that runs the Megatron trainer and the SGLang rollout over Ray.

Miles takes Megatron's arguments as they are, SGLang's as `--sglang-<field>` (except the
fields it owns: targets/miles.yaml `sglang_owned`), and its own for placement, sync,
corrections and LoRA. The trainer's precision stays Megatron flags and environment (from
the megatron target); the model's architecture is Megatron flags generated from its config
(pcc/lower/miles_arch.py, the bundle's miles/model_args.txt); the rollout's precision comes
from the checkpoint the converter builds (`--hf-checkpoint`), whose `quantization_config`
decides how every weight sync quantizes. The job itself (data, batch sizes, rollout lengths)
is the user's: `miles/launch.sh` passes a job file and its own arguments through after the
bundle's (docs/miles.md).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

from pcc.lower import JOB_FILE, Lowered, Unsupported, job_file_shell, lower_each, module_leaf, target, unsupported
from pcc.lower.settings import Setting, flag
from pcc.lower.checkpoint_config import rollout_layout
from pcc.lower.engine_support import check, check_flags, miles_hardware_modes, targeted
from pcc.lower.engine_table import table
from pcc.lower.miles_arch import architecture, tables
from pcc.plan import Plan
from pcc.plan.capabilities import hardware_table

BUFFER_BYTES = 512 << 20  # Miles' default --update-weight-buffer-size
TRANSFER = {"broadcast": "broadcast", "p2p": "p2p", "disk": "disk-delta"}
MODEL_ARGS = "miles/model_args.txt"
# The job file: Miles flags, one per line. PCC_MILES_JOB names it; unset, launch.sh reads
# the file `job` (JOB_FILE) in the directory that holds the bundle; set and empty, none.
JOB_VARIABLE = "PCC_MILES_JOB"


def owned_sglang_fields() -> frozenset[str]:
    """SGLang server fields a Miles launch never passes as --sglang-<field> (Miles sets them)."""
    owned = tables()["sglang_owned"]
    return frozenset(owned["refused"]) | frozenset(owned["overridden"])


def _sglang_passthrough(settings: list[Setting]) -> tuple[list[Setting], list[str]]:
    """SGLang's records as Miles' --sglang-<field> ones (same value, same rule), and the flags left to
    Miles (it sets them itself)."""
    owned = owned_sglang_fields()
    out, dropped = [], []
    for s in settings:
        if s.key[2:].replace("-", "_") in owned:
            dropped.append(s.key)
        else:
            out.append(replace(s, engine="miles", key="--sglang-" + s.key[2:]))
    return out, dropped


def miles_args(plan: Plan) -> tuple[str, list[Setting], list[str]]:
    """(entry script, Miles' own settings, notes)."""
    c = plan.contract
    args: list[Setting] = []
    notes: list[str] = []

    def put(key: str, value=True, path: str | None = "sync") -> None:
        args.append(flag("miles", key, value, path))

    script = "train.py"
    if c.sync.schedule == "colocated":
        put("--colocate", path="sync.schedule")
    else:
        script = "train_async.py"
        if c.sync.max_staleness > 1:
            put("--fully-async", path="sync.schedule")
            put("--max-weight-staleness", str(c.sync.max_staleness), "sync.max_staleness")
            notes.append(f"async with staleness bound {c.sync.max_staleness}: fully-async mode")
        else:
            notes.append("async with staleness 1: train_async.py overlaps one update")
    put("--rollout-num-gpus-per-engine", str(c.rollout.parallel.tp), "rollout.parallel.tp")
    if c.rollout.max_tokens:
        put("--rollout-max-response-len", str(c.rollout.max_tokens), "rollout.max_tokens")
        notes.append(f"--rollout-max-response-len {c.rollout.max_tokens}: the contract's rollout max_tokens")
    put("--update-weight-transfer-mode", TRANSFER[c.sync.transfer], "sync.transfer")
    put("--update-weight-buffer-size", str(BUFFER_BYTES), "sync")
    if c.sync.interval != 1:
        put("--update-weights-interval", str(c.sync.interval), "sync.interval")
    corr = c.correction
    if corr.kind == "tis":
        put("--use-tis", path="correction")
        put("--tis-clip", f"{corr.clip:g}", "correction.clip")
        if corr.low is not None:
            put("--tis-clip-low", f"{corr.low:g}", "correction.low")
    elif corr.kind != "none":
        put("--use-tis", path="correction")
        notes.append(f"correction '{corr.kind}' has no built-in Miles flag: the launch requires "
                     "PCC_TIS_FUNCTION, the --custom-tis-function-path that implements it")
    if c.routing_replay == "r3":
        put("--use-rollout-routing-replay", path="routing_replay")
        notes.append("--use-rollout-routing-replay: Miles also makes SGLang return the routed experts "
                     "(it owns enable_return_routed_experts; --sglang-enable-return-routed-experts is refused)")
    elif c.routing_replay == "r2":
        put("--use-routing-replay", path="routing_replay")
    t = c.trainable
    if t.kind == "lora":
        mods, wider = lora_modules(plan)
        put("--lora-rank", str(t.rank), "trainable.rank")
        put("--lora-alpha", f"{t.alpha:g}", "trainable.alpha")
        put("--target-modules", ",".join(mods), "trainable.targets")
        notes.append("--lora-rank/--target-modules: Miles configures SGLang's LoRA from these (enable_lora, "
                     "max_lora_rank, lora_target_modules are its own)")
        if wider:
            notes.append(f"Miles matches LoRA targets by module name: {', '.join(mods)} also names "
                         f"{wider} operator(s) outside the contract's targets")
        if t.dropout:
            put("--lora-dropout", f"{t.dropout:g}", "trainable.dropout")
    put("--check-weight-update-equal")
    if plan.quantized("rollout"):
        put("--check-weight-update-allow-quant-error", path="rollout.rules")
        notes.append("rollout is quantized: the first-update check allows 1 ULP of the quantized dtype")
    return script, args, notes


def placement(plan: Plan) -> tuple[list[Setting], list[str], list[Unsupported]]:
    """Miles' GPU counts from the contract's `gpus` and `dp`: (flags, notes, PCC616 warnings for what
    they cannot carry). Megatron derives its data-parallel size from the world it is given
    (gpus / (tp x pp)), so the trainer's world is `gpus`, else tp x pp x dp; colocated, rollout runs on
    the trainer's GPUs. Miles places the trainer as nodes x GPUs per node: the node size is the
    trainer hardware's (targets/hardware.yaml gpus_per_node), else Miles' default 8."""
    c = plan.contract
    r, t = c.rollout.parallel, c.trainer.parallel
    colocated = c.sync.schedule == "colocated"
    args: list[Setting] = []
    notes: list[str] = []
    warn: list[Unsupported] = []
    model = t.tp * t.pp * t.cp  # the ranks one model replica spans; Megatron's dp is the GPUs over that
    world = t.gpus or (r.gpus if colocated else None) or (model * t.dp if t.dp > 1 else None)
    if t.gpus and t.dp > 1 and t.gpus != model * t.dp:
        warn.append(Unsupported(
            f"Megatron derives its data-parallel size from the GPUs it is given: {t.gpus} / (tp {t.tp} x pp "
            f"{t.pp} x cp {t.cp}) = {t.gpus / model:g}, not the contract's dp {t.dp}", "PCC616",
            "trainer.parallel.dp", f"write gpus {model * t.dp}, or drop dp"))
    if world:
        node = hardware_table().get(plan.hardware("trainer") or "", {}).get("gpus_per_node", 8)
        if world <= node or world % node == 0:
            nodes, per = (1, world) if world <= node else (world // node, node)
            asked = "trainer.parallel.gpus" if t.gpus else "rollout.parallel.gpus" if not t.dp > 1 else "trainer.parallel.dp"
            args += [flag("miles", "--actor-num-nodes", str(nodes), asked),
                     flag("miles", "--actor-num-gpus-per-node", str(per), asked)]
            notes.append(f"--actor-num-nodes {nodes} --actor-num-gpus-per-node {per}: the trainer's {world} GPUs "
                         f"on nodes of {node} (targets/hardware.yaml gpus_per_node)")
        else:
            warn.append(Unsupported(
                f"the trainer's {world} GPUs do not fill nodes of {node} GPUs: Miles places the trainer as nodes x "
                "GPUs per node, and the launch sets neither", "PCC616",
                "trainer.parallel.gpus" if t.gpus else "trainer.parallel.dp",
                "use a multiple of the node size, or set --actor-num-nodes/--actor-num-gpus-per-node in the job"))
    if r.gpus and not colocated:
        args.append(flag("miles", "--rollout-num-gpus", str(r.gpus), "rollout.parallel.gpus"))
        notes.append(f"--rollout-num-gpus {r.gpus}: the contract's rollout gpus")
    elif r.gpus and r.gpus != world:
        warn.append(Unsupported(
            f"colocated, Miles runs rollout on the trainer's {world} GPUs and ignores --rollout-num-gpus; the "
            f"contract's rollout gpus {r.gpus} cannot hold", "PCC616", "rollout.parallel.gpus",
            f"write rollout gpus {world} (or drop it), or 'schedule async'"))
    return args, notes, warn


def lora_modules(plan: Plan) -> tuple[list[str], int]:
    """HF module names of the LoRA targets (Miles accepts HF naming), and how many other
    operators those names would also select."""
    ops = plan.catalog.operators
    mods = sorted({module_leaf(ops[i].tensor) for i in plan.trainable})
    chosen = set(plan.trainable)
    wider = sum(1 for i, op in enumerate(ops) if i not in chosen and op.family != "kv_cache"
                and module_leaf(op.tensor) in mods)
    return mods, wider


def _flag_lines(settings: list[Setting], bundle_files: set[str]) -> list[str]:
    """Shell-quoted flags, one with its values per line. A bundle file a flag names (the TE precision
    file) becomes an absolute path, since the launch runs in MILES_DIR."""
    return [" ".join(f'"$bundle"/{shlex.quote(w)}' if w in bundle_files else shlex.quote(w)
                     for w in (s.key, *s.words())) for s in settings if s.kind == "flag"]


def model_args_file(plan: Plan) -> tuple[str, list[Setting], str]:
    """(miles/model_args.txt, its flags as records the model asks for, why there are none). One flag with its values per
    line; launch.sh splits each line on blanks, and skips blank lines and '#' comments."""
    arch, gap = architecture(plan.catalog.config, tables())
    head = [f"# Megatron architecture flags of model {plan.catalog.name}, generated by pcc from its config",
            "# (what Miles' scripts/models/<model>.py gives its launchers). launch.sh passes them first:",
            "# a flag the job file or the command line sets again takes the later value."]
    if arch is None:
        return "\n".join(head + [f"# none: {gap}; give the architecture in the job file"]) + "\n", [], gap
    body = [" ".join(line) for line in arch.lines]
    records = [flag("megatron", key, tuple(values) if len(values) > 1 else values[0] if values else True, "model")
               for key, *values in arch.lines]
    return "\n".join(head + [f"# {n}" for n in arch.notes] + body) + "\n", records, ""


def _rule_asking(plan: Plan, side: str) -> str:
    """The first low-precision rule of a side (its weights, not the KV cache): what asked for its mode."""
    ops = plan.catalog.operators
    component = "fprop" if side == "trainer" else "rollout"
    return next((d.path for d, idx in plan.used(component) if not d.scheme.wide
                 and any(ops[i].family != "kv_cache" for i in idx)), side)


def _applied_by_miles(plan: Plan, settings: list[Setting]) -> list[Unsupported]:
    """PCC612 for each setting Miles applies itself after parsing (targets/miles.yaml `applies`, read through
    Miles' engine table) that differs from what the records of a field the contract writes ask for (a
    default the author left alone is not asked for)."""
    miles = table("miles")
    given = {s.key: list(s.words()) for s in settings if s.kind == "flag"}
    out = []
    for rule in miles.applies:
        runs, asked = miles.implied(given)[rule["set"]], given.get(rule["set"])
        if (runs is None) != (asked is None) and rule["field"] in plan.smap:
            state = "on" if runs is not None else "off"
            out.append(Unsupported(
                f"Miles turns {rule['set']} {state} itself whatever the launch says ({rule['source']}), so the "
                f"contract's {rule['field']} is not what Miles runs", "PCC612", rule["field"],
                f"write the {rule['field']} Miles runs ({rule['set']} {state}), or run the contract on the embedded "
                "runtime"))
    return out


def _hardware_support(plan: Plan, mega: Lowered) -> list[Unsupported]:
    """PCC615 warnings for low-precision modes the targeted Miles does not run on the contract's GPUs
    (targets/engines.yaml miles_hardware: engine support, not what the GPU can do)."""
    hw, out = hardware_table(), []
    recipe = mega.value("--fp8-recipe") or mega.value("--fp4-recipe") or (
        "int4_qat" if "OPEN_TRAINING_INT4_FAKE_QAT_FLAG" in mega.env else None)
    for side, mode in (("trainer", recipe), ("rollout", rollout_layout(plan))):
        name = plan.hardware(side) or ""
        arch = hw.get(name, {}).get("arch")
        runs = miles_hardware_modes(arch) if arch else None
        if runs is None or mode in (None, "wide") or mode in runs[side]:
            continue
        shown = ", ".join(m for m in runs[side] if m != "wide") or "BF16 only"
        out.append(Unsupported(
            f"Miles {targeted('miles')} runs no {mode} {side} on {name} ({arch}): it runs {shown} there "
            f"({runs['source']}; targets/engines.yaml miles_hardware). The GPU itself has the format "
            "(targets/hardware.yaml): that is another fact", "PCC615", _rule_asking(plan, side),
            "run this contract on NVIDIA hardware for Miles, or keep that side BF16"))
    return out


@target("miles", honours=("framework", "sync", "correction", "routing_replay", "trainable", "rollout.parallel.tp",
                          "rollout.parallel.gpus", "trainer.parallel.gpus", "trainer.parallel.dp", "rollout.max_tokens"))
def lower_miles(plan: Plan) -> Lowered:
    c = plan.contract
    if (c.trainer.engine, c.rollout.engine) != ("megatron", "sglang"):
        unsupported("PCC630", f"Miles runs a Megatron trainer with an SGLang rollout; the contract names "
                    f"'framework miles' with trainer {c.trainer.engine} and rollout {c.rollout.engine}", "framework",
                    hint="use 'framework verl' for this trainer and rollout, or 'trainer megatron' and 'rollout sglang'")
    mega, roll = lower_each(plan, "megatron", "sglang")
    script, own, notes = miles_args(plan)
    placed, placed_notes, placed_warn = placement(plan)
    own += placed
    notes += placed_notes
    sglang, dropped = _sglang_passthrough(roll.of("flag"))
    if dropped:
        notes.append(f"left to Miles, which sets them itself (targets/miles.yaml sglang_owned): {', '.join(dropped)}")
    settings = [Setting("miles", "entry", "script", script, "sync.schedule"), *mega.of("flag"), *own, *sglang,
                *sorted(mega.of("env") + roll.of("env"), key=lambda s: s.key)]
    custom = plan.contract.correction.kind not in ("none", "tis")
    tis = [flag("miles", "--custom-tis-function-path", "$PCC_TIS_FUNCTION", "correction")] * custom
    check("miles", own + tis + mega.of("env"), "Miles")
    check_flags("miles", settings + tis, "Miles")
    model_text, arch, gap = model_args_file(plan)
    check("megatron", arch, "Megatron (Miles' fork)")
    out = Lowered("miles", settings=settings)
    args = out.args[1:]
    env = out.env
    runtime_env = json.dumps({"env_vars": env}, indent=1, sort_keys=True) + "\n"
    quoted = " \\\n  ".join(_flag_lines(settings, set(mega.files) | set(roll.files)))
    need_tis = (f': "${{PCC_TIS_FUNCTION:?correction {plan.contract.correction.kind} needs its '
                'implementation: set PCC_TIS_FUNCTION to a --custom-tis-function-path}"\n') if custom else ""
    tis_arg = ' \\\n  --custom-tis-function-path "$PCC_TIS_FUNCTION"' if custom else ""
    launch = f"""#!/usr/bin/env bash
# Generated by pcc from contract {shlex.quote(plan.contract.name)}: the Miles launch (Megatron + SGLang over Ray).
# Usage: miles/launch.sh [MILES ARGS...]
# Miles gets, in this order: the architecture (miles/model_args.txt), the contract's flags, the
# checkpoints, the job file, then MILES ARGS. Where two set the same flag, the later wins.
# The job file holds the job (data, batch sizes, lengths...): Miles flags, one per line, '#'
# comments; ${JOB_VARIABLE} names it, else it is the file '{JOB_FILE}' beside this bundle.
set -euo pipefail
here="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
bundle="$(dirname "$here")"
: "${{PCC_ROLLOUT_CHECKPOINT:?set it to the rollout checkpoint (pcc convert builds it)}}"
: "${{PCC_REF_LOAD:?set it to the BF16 trainer weights}}"
: "${{MILES_DIR:?set it to a Miles checkout}}"
{need_tis}_words() {{  # the blank-separated words of file $1; blank lines and '#' comment lines skipped
  local line w
  _out=()
  while IFS= read -r line || [[ -n "$line" ]]; do
    read -ra w <<<"$line"
    if (( ${{#w[@]}} )) && [[ "${{w[0]}}" != \\#* ]]; then _out+=("${{w[@]}}"); fi
  done <"$1"
}}
_words "$here/model_args.txt"
model=(${{_out[@]+"${{_out[@]}}"}})
{job_file_shell(JOB_VARIABLE)}_out=()
if [[ -n "$job" && -f "$job" ]]; then _words "$job"; fi
jobargs=(${{_out[@]+"${{_out[@]}}"}})
cd "$MILES_DIR"
exec ray job submit --address "${{RAY_ADDRESS:-http://127.0.0.1:8265}}" \\
  --runtime-env-json "$(cat "$here/runtime-env.json")" \\
  -- python3 {script} \\
  ${{model[@]+"${{model[@]}}"}} \\
  {quoted} \\
  --hf-checkpoint "$PCC_ROLLOUT_CHECKPOINT" \\
  --ref-load "$PCC_REF_LOAD"{tis_arg} \\
  ${{jobargs[@]+"${{jobargs[@]}}"}} "$@"
"""
    files = {"miles/args.txt": "\n".join([script] + args) + "\n", "miles/runtime-env.json": runtime_env,
             MODEL_ARGS: model_text, "miles/launch.sh": launch}
    caveats = list(placed_warn)
    c = plan.contract
    if c.sync.activation == "eager":
        caveats.append(Unsupported(
            "Miles pauses generation, installs the whole update and then resumes, so a version activates "
            "atomically there; 'activation eager' is honoured by the embedded runtime only", "PCC612",
            "sync.activation", "write 'activation atomic', or run the contract on the embedded runtime"))
    if "experts" in c.rollout.record and c.routing_replay != "r3":
        caveats.append(Unsupported(
            "Miles makes SGLang return routed experts only with --use-rollout-routing-replay (it owns "
            "enable_return_routed_experts), so 'record experts' is honoured by the embedded runtime only",
            "PCC612", "rollout.record", "write 'routing replay rollout', or drop 'experts' from 'record'"))
    if c.rollout.parallel.dp > 1 and "--sglang-enable-dp-attention" not in sglang:
        caveats.append(Unsupported(
            f"Miles runs SGLang with dp {c.rollout.parallel.dp} only with DP attention (it asserts "
            "--sglang-enable-dp-attention when --sglang-dp-size > 1)", "PCC612", "rollout.parallel",
            "add --sglang-enable-dp-attention to the job file, or use 'dp 1'"))
    if gap:
        caveats.append(Unsupported(
            f"Miles needs the model's architecture as Megatron flags, and {gap}: miles/model_args.txt is "
            "empty and `pcc compile --verify` checks the trainer flags with stand-in dimensions", "PCC613", "model",
            "give the architecture in the Miles job file (docs/miles.md)"))
    caveats += _hardware_support(plan, mega)
    caveats += _applied_by_miles(plan, settings)
    notes.append("engine versions targeted (targets/engines.yaml): " + "; ".join(
        f"{e} {targeted(e)}" for e in ("miles", "megatron", "transformer_engine", "sglang")))
    out.files, out.notes, out.caveats = files, mega.notes + roll.notes + notes, caveats
    return out

