"""`pcc import miles SOURCE`: a contract from a Miles launch.

SOURCE is a pcc bundle directory (miles/args.txt, miles/runtime-env.json, rollout/
quantization_config.json, trainer/te_precision.yaml, validate/expectations.yaml), a launch
script (`ray job submit ... -- python3 train.py ARGS`, bash arrays of flags, `export` lines and
`--runtime-env-json`), or an argument file. Flags are read as argparse reads them: the later of
two wins. What each flag means is Miles' own parser (miles/utils/arguments.py) and Megatron's
(megatron/training/arguments.py); docs/import.md has the table. The rollout rules come from the
checkpoint the launch runs (`--hf-checkpoint`, or the bundle's quantization_config.json),
through `pcc import checkpoint`'s rules.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from pcc.importer import Imported, ImportFailed, bundle_file, contract_name, read_json
from pcc.importer.bounds import integer, shown
from pcc.importer.checkpoint import Decided, _define, decide_config, finish, load_model, method_of, rollout_rules
from pcc.importer.matching import module_name
from pcc.importer.rules import family_patterns, select
from pcc.importer.shell import SEP, ShellError, expand, span_at
from pcc.lang.diagnostics import Span
from pcc.importer.te import BLOCK_FP32_ENV, UNMATCHED, decide, read_precision_file, recipe_scheme
from pcc.importer.yamlsource import load, read_text
from pcc.lower.engine_table import table
from pcc.lower.miles import TRANSFER
from pcc.lower.sglang import tables as sglang_tables
from pcc.models import Catalog
from pcc.plan.patterns import LINEAR

SCRIPTS = ("train.py", "train_async.py")
# Flags of `ray job submit` (not Miles'), skipped with their values.
_RAY = {"--address", "--runtime-env-json", "--runtime-env", "--working-dir", "--submission-id", "--entrypoint-num-cpus",
        "--entrypoint-num-gpus", "--entrypoint-resources", "--metadata-json", "--headers"}
_TRUE = {"1", "true", "True", "yes"}
# SGLang's --kv-cache-dtype and Miles' --update-weight-transfer-mode back to the contract: the targets'
# own tables read the other way (auto is no KV cache format of its own).
_KV = {v: k for k, v in sglang_tables()["kv_cache_dtype"].items() if v != "auto"}
_TRANSFER = {v: k for k, v in TRANSFER.items()}
# Contract fields no Miles launch states: written as pcc's defaults, each reported once (PCC808).
NOT_IN_A_LAUNCH = (
    ("rollout.record", "what rollout records follows from the routing replay flags; the contract's list is not a flag"),
    ("sync.bridge", "Miles derives the sync representation from the rollout checkpoint; no flag states it"),
    ("sync.activation", "Miles always activates a version atomically"),
    ("trainer.rules gemm", "Transformer Engine runs a recipe's GEMMs for real: 'qdq' (fake quantization) and "
                           "'accumulate'/'output' are not flags"),
)


def _tokens(text: str, file: str) -> tuple[list[str], list[tuple[str, int]]]:
    """The script's words as bash passes them (statements end at SEP) and what stayed unexpanded."""
    try:
        out = expand(text)
    except ShellError as exc:
        raise ImportFailed(f"{file}: cannot split into shell words ({exc})", file=file) from None
    return [w for w, _ in out.words], out.unexpanded


def _command(tokens: list[str]) -> tuple[list[str], list[str]] | None:
    """(the words before the trainer, the trainer and its arguments) of the last statement that runs
    train.py or train_async.py; None when no statement does."""
    found, stmt = None, []
    for tok in [*tokens, SEP]:
        if tok != SEP:
            stmt.append(tok)
            continue
        at = next((i for i, w in enumerate(stmt) if Path(w).name in SCRIPTS), None)
        if at is not None:
            found = (stmt[:at], stmt[at:])
        stmt = []
    return found


def _is_script(text: str) -> bool:
    """A shell script rather than an argument file (all flags): a shebang, or a first word that is
    no flag."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first.startswith("#!") or not first.startswith("-")


def parse_args(tokens: list[str]) -> tuple[str | None, dict[str, list[str]], list[str]]:
    """(entry script, flag -> values of its last occurrence, `export` assignments and `ray job submit`'s
    --runtime-env-json). In a script only the command that runs the trainer passes flags to Miles (a
    `ray start --num-gpus 8` before it does not); an argument file is all flags. Flags are keyed by
    their canonical name in Miles' engine table (`--sglang-expert-parallel-size` is `--sglang-ep-size`); a
    negation (`--sglang-no-X` of a BooleanOptionalAction) turns its switch off."""
    miles = table("miles")
    exports = [tokens[k + 1] for k in range(len(tokens) - 1) if tokens[k] == "export" and "=" in tokens[k + 1]]
    command = _command(tokens)
    script = Path(command[1][0]).name if command else None
    if command:
        before, tokens = command[0], command[1][1:]
        end = next((i for i, w in enumerate(tokens) if w in ("&&", "||", "|", "&") or w[:1] in "<>"
                    or w[:2] in ("1>", "2>")), len(tokens))
        tokens = tokens[:end]
        exports += [w for w in before if w.startswith("--runtime-env-json=")]
        exports += [f"--runtime-env-json={before[i + 1]}" for i, w in enumerate(before[:-1])
                    if w == "--runtime-env-json"]
    flags: dict[str, list[str]] = {}
    k = 0
    while k < len(tokens):
        tok = tokens[k]
        if tok.startswith("--") and len(tok) > 2:
            name, eq, inline = tok.partition("=")
            values = [inline] if eq else []
            spec = miles.spec(name)
            most = {0: 0, 1: 1, "?": 1}.get(spec.nargs, spec.nargs if isinstance(spec.nargs, int) else None) \
                if spec is not None else None  # a switch takes no word after it, as argparse reads it
            j = k + 1
            while not eq and j < len(tokens) and not tokens[j].startswith("--") and tokens[j] not in (")", "\\") \
                    and Path(tokens[j]).name not in SCRIPTS and (most is None or len(values) < most):
                if tokens[j] in ("&&", "||", ";", "|", SEP):
                    break
                values.append(tokens[j])
                j += 1
            if (off := miles.negated(name)) is not None:
                flags.pop(off, None)
            elif name not in _RAY:
                flags[miles.canonical(name)] = values
            elif name == "--runtime-env-json" and values:
                exports.append("--runtime-env-json=" + values[0])
            k = j
            continue
        k += 1
    return script, flags, exports


class Flags:
    """Megatron/Miles flags (flag -> values of its last occurrence) and an environment: what the
    trainer rules read. verl jobs are translated to these (verl.py), so one reading serves both."""

    def __init__(self, flags: dict[str, list[str]], env: dict[str, str], file: str):
        self.flags, self.env, self.file = flags, env, file
        self.te_file: Path | None = None

    def has(self, flag: str) -> bool:
        return flag in self.flags

    def value(self, flag: str, default: str | None = None) -> str | None:
        v = self.flags.get(flag)
        return v[-1] if v else default

    def number(self, flag: str, kind, default=None):
        """The flag's value as a count (an int from 0 to bounds.MAX_INT: Miles' integer flags are sizes,
        lengths and steps) or a finite float; PCC801 naming the flag otherwise, never a 400-digit value
        passed on to the contract."""
        v = self.value(flag)
        if v is None:
            return default
        try:
            n = kind(v) if len(v) <= 40 else None
        except ValueError:
            n = None
        if kind is int:
            return integer(v if n is None else n, flag, self.file, flag)
        if n is None or not math.isfinite(n):
            raise ImportFailed(f"{self.file}: {flag} {shown(v, 20)} is not a finite number", path=flag, file=self.file)
        return n


class Launch(Flags):
    """A launch's flags, environment and the files it points at."""

    def __init__(self, source: str):
        self.source = source
        p = Path(source)
        self.bundle = p if p.is_dir() else None
        self.env: dict[str, str] = {}
        self.quant_config: dict | None = None
        self.quant_file: str | None = None
        self.te_file: Path | None = None
        self.expectations: Path | None = None
        self.unexpanded: list[tuple[str, Span]] = []  # words computed when the script runs
        if self.bundle is not None:
            args = bundle_file(p, "miles/args.txt")
            if args is None:
                raise ImportFailed(f"{p}: not a pcc bundle (no miles/args.txt); pass the launch script instead",
                                   file=str(p))
            self.file = str(args)
            text = read_text(self.file, "Miles argument file")
            tokens = text.split()
            env_file = bundle_file(p, "miles/runtime-env.json")
            if env_file is not None:
                self.env.update(_env_vars(read_json(env_file, "runtime-env.json"), str(env_file)))
            qc = bundle_file(p, "rollout/quantization_config.json")
            if qc is not None:
                self.quant_config, self.quant_file = read_json(qc, "quantization_config.json"), str(qc)
            self.te_file = bundle_file(p, "trainer/te_precision.yaml")
            self.expectations = bundle_file(p, "validate/expectations.yaml")
        else:
            if not os.path.lexists(p):
                raise ImportFailed(f"{source}: no such launch script, argument file or bundle", file=source)
            self.file = source
            text = read_text(source, "Miles launch")
            tokens, unexpanded = _tokens(text, source)
            self.unexpanded = [(raw, span_at(source, text, at)) for raw, at in unexpanded]
        self.script, given, exports = parse_args(tokens)
        if self.script is None and self.bundle is None and _is_script(text):
            raise ImportFailed(f"{source}: runs no Miles trainer (no `python3 train.py` or `train_async.py` command): "
                               "not a Miles RL launch", code="PCC805", file=source,
                               hint="import the launch script it runs, or its argument file")
        self.flags = table("miles").effective(given)  # what Miles sets itself (targets/miles.yaml applies)
        for e in exports:
            key, _, value = e.partition("=")
            if key == "--runtime-env-json":
                try:
                    self.env.update(_env_vars(json.loads(value), source))
                except ValueError:
                    beside = p.parent / "runtime-env.json"
                    if os.path.lexists(beside):
                        self.env.update(_env_vars(read_json(beside, "runtime-env.json"), str(beside)))
            else:
                self.env[key] = value
        if self.bundle is None and "$(cat" in text and not self.env:
            beside = p.parent / "runtime-env.json"
            if os.path.lexists(beside):
                self.env.update(_env_vars(read_json(beside, "runtime-env.json"), str(beside)))



def _env_vars(doc: dict, file: str) -> dict[str, str]:
    env = doc.get("env_vars", {})
    if not isinstance(env, dict):
        raise ImportFailed(f"{file}: env_vars is not an object", file=file)
    return {str(k): str(v) for k, v in env.items()}


def import_miles(source: str, model: str | None, hardware: str | None = None) -> Imported:
    launch = Launch(source)
    ckpt_dir = launch.value("--hf-checkpoint")
    ckpt = ckpt_dir if ckpt_dir and Path(ckpt_dir).is_dir() else None
    catalog, ref = load_model(model, ckpt, ("--hf-checkpoint", ckpt_dir))
    imp = Imported({"name": contract_name(source), "model": ref}, source=launch.file)
    _rollout(imp, launch, catalog, ckpt)
    _trainer(imp, launch, catalog)
    _sync_and_objective(imp, launch, catalog)
    read_expectations(imp, launch.expectations)
    if launch.has("--custom-config-path"):
        imp.warn("PCC808", f"--custom-config-path {launch.value('--custom-config-path')}: Miles sets the arguments "
                 "that file names; pcc does not read it, so what it sets is not in the contract", "--custom-config-path",
                 hint="pass those settings as flags of the launch to import them")
    for raw, span in launch.unexpanded:
        imp.warn("PCC808", f"{raw}: computed when the script runs (a command, or a variable the script does not "
                 "assign); read as written", raw, span=span)
    if launch.value("--sglang-device") == "cpu" and hardware is None:
        hardware = "cpu"
    for field, why in NOT_IN_A_LAUNCH:
        imp.warn("PCC808", f"{field}: not in a Miles launch ({why}); the contract states pcc's default", field)
    finish(imp, catalog, hardware)
    return imp


def _rollout(imp: Imported, launch: Launch, catalog: Catalog, ckpt: str | None) -> None:
    from pcc.importer.checkpoint import dir_quant_config

    qc, file = launch.quant_config, launch.quant_file
    if qc is None and ckpt is not None:
        qc, file, _ = dir_quant_config(Path(ckpt)) or (None, None, None)  # None: a BF16 checkpoint
    d = Decided()
    if qc is not None:
        method = method_of(qc, file)
        d = decide_config(qc, file, catalog, imp)
        said = launch.value("--sglang-quantization")
        expected = {"fp8": {"fp8", "mxfp8", "w8a8_fp8"}, "mxfp4": {"mxfp4"}, "compressed-tensors": {"compressed-tensors"},
                    "modelopt": {"modelopt", "modelopt_fp4", "modelopt_fp8"}}[method]
        if said is not None and said not in expected:
            imp.warn("PCC809", f"--sglang-quantization {said} but the rollout checkpoint's config is {method} "
                     f"({file}): SGLang refuses the mismatch", "--sglang-quantization")
    elif launch.value("--hf-checkpoint") is not None:
        imp.warn("PCC808", f"--hf-checkpoint {launch.value('--hf-checkpoint')} is not a readable directory here: which "
                 "operators the rollout quantizes is in its quantization_config, so the contract's rollout stays wide",
                 "--hf-checkpoint", hint="run the import where the checkpoint is, or import it with 'pcc import "
                 "checkpoint' and merge its rollout rules")
    elif launch.value("--sglang-quantization") not in (None, "unquant"):
        imp.warn("PCC808", f"--sglang-quantization {launch.value('--sglang-quantization')}: which operators the rollout "
                 "quantizes is in the checkpoint's quantization_config, which the launch does not reach "
                 "(--hf-checkpoint is not a readable directory); the contract's rollout stays wide",
                 "--hf-checkpoint", hint="import the checkpoint with 'pcc import checkpoint' and merge its rollout rules")
    kv = launch.value("--sglang-kv-cache-dtype")
    if kv not in (None, "auto", "bf16", "bfloat16"):
        if kv not in _KV:
            imp.warn("PCC804", f"--sglang-kv-cache-dtype {kv}: no pcc KV cache format", "--sglang-kv-cache-dtype")
        else:
            if d.kv and d.kv != _KV[kv]:
                imp.warn("PCC809", f"--sglang-kv-cache-dtype {kv} overrides the checkpoint's {d.kv} KV cache",
                         "--sglang-kv-cache-dtype")
            d.kv = _KV[kv]
    rollout_rules(imp, catalog, d)
    block = imp.contract["rollout"]
    par = {}
    for key, flag in (("tp", "--rollout-num-gpus-per-engine"), ("ep", "--sglang-ep-size"), ("dp", "--sglang-dp-size"),
                      ("pp", "--sglang-pp-size")):
        n = launch.number(flag, int)
        if n is not None and n != 1:
            par[key] = n
    if par:
        block["parallel"] = par
    n = launch.number("--rollout-max-response-len", int)
    if n is not None:
        block["max_tokens"] = n
    if launch.has("--sglang-enable-deterministic-inference"):
        block["deterministic"] = True
    dtype = launch.value("--sglang-dtype")
    if dtype not in (None, "auto", "bfloat16"):
        imp.warn("PCC804", f"--sglang-dtype {dtype}: the contract's wide operators are bf16", "--sglang-dtype")


def _trainer(imp: Imported, launch: Launch, catalog: Catalog) -> None:
    t: dict = {"engine": "megatron"}
    if launch.value("--transformer-impl", "transformer_engine") != "transformer_engine":
        t["impl"] = launch.value("--transformer-impl")
    t["rules"] = trainer_rules(imp, launch, catalog)
    # Miles sets args.bf16 = not args.fp16 (miles/backends/megatron_utils/arguments.py)
    t["params"] = "fp16" if launch.has("--fp16") else "bf16"
    for key, flag in (("master", "--main-params-dtype"), ("moments", "--exp-avg-dtype"), ("grads", "--main-grads-dtype")):
        v = launch.value(flag, "fp32")
        if v not in ("fp32", "fp16", "bf16", "fp8"):
            raise ImportFailed(f"{launch.file}: {flag} {v!r} is not a Megatron dtype", path=flag, file=launch.file)
        t[key] = v
    if launch.value("--exp-avg-sq-dtype", "fp32") != t["moments"]:
        imp.warn("PCC804", f"--exp-avg-sq-dtype {launch.value('--exp-avg-sq-dtype', 'fp32')} differs from --exp-avg-dtype "
                 f"{t['moments']}: a contract states one moments dtype; written {t['moments']}", "--exp-avg-sq-dtype")
    if launch.has("--fp8-param-gather"):
        t["param_gather"] = "fp8"
    t["optimizer"] = {"kind": launch.value("--optimizer", "adam"), "distributed": launch.has("--use-distributed-optimizer"),
                      "offload": launch.has("--optimizer-cpu-offload"),
                      "precision_aware": launch.has("--use-precision-aware-optimizer")}
    if catalog.is_moe and launch.value("--moe-router-dtype") != "fp32":
        imp.warn("PCC804", f"--moe-router-dtype {launch.value('--moe-router-dtype') or 'unset'}: this launch computes the "
                 "MoE router in the params dtype; pcc's Megatron lowering always computes it in FP32 "
                 "(--moe-router-dtype fp32, so expert choices stay stable across steps)", "--moe-router-dtype")
    if t["optimizer"]["kind"] not in ("adam", "sgd"):
        raise ImportFailed(f"{launch.file}: --optimizer {t['optimizer']['kind']!r}: pcc states adam or sgd",
                           path="--optimizer", file=launch.file)
    par = {}
    for key, flag in (("tp", "--tensor-model-parallel-size"), ("ep", "--expert-model-parallel-size"),
                      ("pp", "--pipeline-model-parallel-size"), ("cp", "--context-parallel-size")):
        n = launch.number(flag, int)
        if n is not None and n != 1:
            par[key] = n
    if par:
        t["parallel"] = par
    for flag in ("--no-fp8-wgrad", "--fp4-param-gather", "--fp8-output-proj", "--keep-fp8-transpose-cache"):
        if launch.has(flag):
            imp.warn("PCC807", f"{flag}: pcc has no field for it; the contract does not state it", flag)
    imp.contract["trainer"] = t


def _te_ops(catalog: Catalog) -> list[int]:
    return [i for i, op in enumerate(catalog.operators) if op.family in LINEAR]


def trainer_rules(imp: Imported, launch: Flags, catalog: Catalog) -> list[dict]:
    """Trainer GEMM rules from the recipe flags, the backward override, the layer exceptions or the
    TE precision file, and INT4 QAT's environment."""
    rules: list[dict] = []
    recipe = None
    if launch.value("--fp4-format"):
        recipe = launch.value("--fp4-recipe", "nvfp4")
        if recipe != "nvfp4":
            raise ImportFailed(f"{launch.file}: --fp4-recipe {recipe}: pcc imports nvfp4", path="--fp4-recipe",
                               file=launch.file)
    elif launch.value("--fp8-format"):
        recipe = launch.value("--fp8-recipe", "delayed")
        if launch.value("--fp8-format") == "hybrid":
            imp.warn("PCC804", "--fp8-format hybrid: E5M2 gradients; the imported schemes state E4M3 (write "
                     "gradients fp8_e5m2 by hand if you rely on it)", "--fp8-format")
    if recipe is not None:
        name = recipe_scheme(imp, recipe, launch.env.get(BLOCK_FP32_ENV),
                             "--fp4-recipe" if launch.value("--fp4-format") else "--fp8-recipe")
        chosen = _te_quantized(imp, launch, catalog, recipe)
        high = launch.env.get("NVTE_BACKWARD_OVERRIDE") == "high_precision"
        comps = ["fprop"] if high else ["fprop", "dgrad", "wgrad"]
        if chosen:
            scope = {i for i, op in enumerate(catalog.operators) if op.family in LINEAR}
            families = {catalog.operators[i].family for i in chosen}
            patterns = (family_patterns(catalog, families)
                        if chosen == {i for i in scope if catalog.operators[i].family in families}
                        else select(catalog, chosen, scope))
            rules.append({"components": comps, "patterns": patterns, "scheme": name})
    if launch.env.get("OPEN_TRAINING_INT4_FAKE_QAT_FLAG", "0") == "1":
        try:
            group = int(launch.env.get("OPEN_TRAINING_INT4_GROUP_SIZE", "128"))
        except ValueError:
            raise ImportFailed(f"{launch.file}: OPEN_TRAINING_INT4_GROUP_SIZE "
                               f"{launch.env['OPEN_TRAINING_INT4_GROUP_SIZE']!r} is not an integer",
                               path="OPEN_TRAINING_INT4_GROUP_SIZE", file=launch.file) from None
        name = _define(imp, {"format": "int4", "grouping": {"kind": "group", "size": group}}, f"int4_g{group}")
        experts = [p for p in ("experts",) if any(op.family.startswith("experts.") for op in catalog.operators)]
        if not experts:
            imp.warn("PCC804", "INT4 QAT fake-quantizes routed experts only (Miles' GroupedLinear hook), and the model "
                     "has none", "OPEN_TRAINING_INT4_FAKE_QAT_FLAG")
        else:
            rules.append({"components": ["fprop"], "patterns": experts, "scheme": name, "gemm": "qdq"})
            roll = {imp.contract.get("schemes", {}).get(r["scheme"], {}).get("grouping", {}).get("size")
                    or _preset_group(r["scheme"])
                    for r in imp.contract["rollout"]["rules"] if not r.get("keep") and _is_int4(imp, r["scheme"])}
            roll.discard(None)
            if roll and roll != {group}:
                imp.warn("PCC809", f"OPEN_TRAINING_INT4_GROUP_SIZE={group} but the rollout checkpoint's INT4 groups are "
                         f"{', '.join(map(str, sorted(roll)))}: trainer QAT and rollout quantize differently "
                         "(pcc check reports it as PCC403)", "OPEN_TRAINING_INT4_GROUP_SIZE")
    for var in sorted(launch.env):
        if var.startswith("NVTE_") and var not in (BLOCK_FP32_ENV, "NVTE_BACKWARD_OVERRIDE"):
            imp.warn("PCC807", f"{var}={launch.env[var]}: a Transformer Engine switch pcc has no field for", var)
    if launch.env.get("NVTE_BACKWARD_OVERRIDE") not in (None, "high_precision"):
        imp.warn("PCC807", f"NVTE_BACKWARD_OVERRIDE={launch.env['NVTE_BACKWARD_OVERRIDE']}: pcc states a wide backward "
                 "(high_precision) or a quantized one", "NVTE_BACKWARD_OVERRIDE")
    return rules


def _preset_group(name: str) -> int | None:
    from pcc.contract.scheme import preset

    s = preset(name)
    return s.weights.size if s is not None and s.weights is not None else None


def _is_int4(imp: Imported, name: str) -> bool:
    from pcc.contract.scheme import Scheme, preset

    spec = imp.contract.get("schemes", {}).get(name)
    s = Scheme.model_validate(spec) if spec else preset(name)
    return s is not None and s.format == "int4"


def _te_quantized(imp: Imported, launch: Flags, catalog: Catalog, recipe: str) -> set[int]:
    """The TE operators the recipe runs: all of them, all but the first/last layers, or what the
    precision file's first matching glob gives each Megatron module."""
    ops = catalog.operators
    te = _te_ops(catalog)
    if launch.value("--te-precision-config-file"):
        return _precision_file(imp, launch, catalog, recipe)
    if launch.has("--first-last-layers-bf16"):
        n = catalog.num_layers
        start = launch.number("--num-layers-at-start-in-bf16", int, 1)
        end = launch.number("--num-layers-at-end-in-bf16", int, 1)
        return {i for i in te if start <= ops[i].layer < n - end}
    return set(te)


def _precision_file(imp: Imported, launch: Flags, catalog: Catalog, recipe: str) -> set[int]:
    """The operators the launch's TE precision file quantizes (te.py reads it as megatron-core
    does): a module no matcher decides runs the launch's recipe too."""
    given = launch.value("--te-precision-config-file")
    path = launch.te_file
    if path is None:
        for base in (Path(launch.file).parent, Path(launch.file).parent.parent, Path.cwd()):
            cand = base / given.replace('"$bundle"/', "")
            if os.path.lexists(cand) and not cand.is_dir():  # a FIFO is found, and refused when read (PCC109)
                path = cand
                break
    if path is None:
        raise ImportFailed(f"{launch.file}: --te-precision-config-file {given}: no such file beside the launch",
                           path="--te-precision-config-file", file=launch.file)
    by_op = decide(read_precision_file(str(path), imp), imp, catalog)
    other = sorted({r for r in by_op.values() if r not in (None, UNMATCHED, recipe)})
    if other:
        imp.warn("PCC804", f"{path}: modules run {', '.join(other)} by the precision file while the launch's recipe is "
                 f"{recipe}; the contract states {recipe} for every quantized module", "--te-precision-config-file",
                 file=str(path))
    return {i for i, r in by_op.items() if r is not None}


def _sync_and_objective(imp: Imported, launch: Launch, catalog: Catalog) -> None:
    c = imp.contract
    sync: dict = {}
    lora = launch.number("--lora-rank", int, 0)
    sync["moves"] = "adapter" if lora else "full_weights"
    if launch.script == "train_async.py":
        sync["schedule"] = "async"
        if launch.has("--fully-async"):
            n = launch.number("--max-weight-staleness", int)
            if n is None:
                imp.warn("PCC804", "--fully-async without --max-weight-staleness: staleness is unbounded, which a "
                         "contract cannot state; written max_staleness 1000 (pcc's limit)", "--max-weight-staleness")
                n = 1000
            sync["max_staleness"] = n
        else:
            sync["max_staleness"] = 1
    else:
        sync["schedule"] = "colocated"
        if not launch.has("--colocate"):
            imp.warn("PCC804", "train.py without --colocate: synchronous updates on separate GPU pools; the contract's "
                     "'schedule colocated' states the same staleness 0", "--colocate")
    mode = launch.value("--update-weight-transfer-mode")
    if mode is not None:
        if mode not in _TRANSFER:
            raise ImportFailed(f"{launch.file}: --update-weight-transfer-mode {mode!r}", path="--update-weight-transfer-mode",
                               file=launch.file)
        sync["transfer"] = _TRANSFER[mode]
    interval = launch.number("--update-weights-interval", int, 1)
    if interval != 1:
        sync["interval"] = interval
    c["sync"] = sync
    if launch.has("--use-tis"):
        corr: dict = {"kind": "tis", "clip": launch.number("--tis-clip", float, 2.0)}
        low = launch.number("--tis-clip-low", float, 0.0)
        if low:
            corr["low"] = low
        if launch.has("--custom-tis-function-path"):
            imp.warn("PCC804", "--custom-tis-function-path: the correction is that function's; the contract states "
                     "'tis' (write mis, masked or rejection if that is what it implements)", "--custom-tis-function-path")
        c["correction"] = corr
    if launch.has("--use-rollout-routing-replay"):
        c["routing_replay"] = "r3"
    elif launch.has("--use-routing-replay"):
        c["routing_replay"] = "r2"
    if lora:
        mods = launch.value("--target-modules")
        if not mods:
            raise ImportFailed(f"{launch.file}: --lora-rank {lora} without --target-modules (Miles requires it)",
                               path="--target-modules", file=launch.file)
        t = {"kind": "lora", "rank": lora, "alpha": launch.number("--lora-alpha", float, 16.0)}
        drop = launch.number("--lora-dropout", float, 0.0)
        if drop:
            t["dropout"] = drop
        t["targets"] = lora_targets(imp, catalog, mods)
        c["trainable"] = t
    else:
        c["trainable"] = {"kind": "all"}


def lora_targets(imp: Imported, catalog: Catalog, mods: str) -> list[str]:
    """Miles matches LoRA targets by module name (the last dotted part): those operators as patterns."""
    if mods == "all-linear":
        return ["linear"]
    leaves = list(dict.fromkeys(m.strip() for m in mods.split(",") if m.strip()))
    ops = catalog.operators
    named = {i: module_name(op).rsplit(".", 1)[-1] for i, op in enumerate(ops)}
    wanted = set(leaves)
    chosen = {i for i, op in enumerate(ops) if op.family != "kv_cache" and named[i] in wanted}
    present = set(named.values())
    for leaf in leaves:
        if leaf not in present:
            imp.warn("PCC802", f"--target-modules {shown(leaf)}: no module of {catalog.name} has that name",
                     "--target-modules")
    if not chosen:
        raise ImportFailed(f"--target-modules {shown(mods)}: selects no module of {catalog.name}", path="--target-modules")
    families = {ops[i].family for i in chosen}
    scope = {i for i, op in enumerate(ops) if op.family in families}
    return select(catalog, chosen, scope)


def read_expectations(imp: Imported, path: Path | None) -> None:
    """A bundle's validate/expectations.yaml: the thresholds whose source is the contract."""
    from pydantic import ValidationError

    from pcc.contract.model import Expectation

    if path is None:
        return
    file = str(path)
    doc, spans = load(read_text(file, "expectations file"), file, "expectations file")

    def shape(value, kind: type, at: str):
        if not isinstance(value, kind):
            raise ImportFailed(f"{file}: {at or 'the document'} is not a {'list' if kind is list else 'mapping'} "
                               "(pcc writes levels, each with a list of thresholds)", file=file, span=spans.get(at))
        return value

    out = []
    for i, level in enumerate(shape(shape(doc or {}, dict, "").get("levels") or [], list, "levels")):
        at = f"levels[{i}]"
        for j, th in enumerate(shape(shape(level, dict, at).get("thresholds") or [], list, f"{at}.thresholds")):
            if shape(th, dict, f"{at}.thresholds[{j}]").get("source") != "contract":
                continue
            gone = [k for k in ("metric", "op", "value") if k not in th]
            if gone:
                raise ImportFailed(f"{file}: {at}.thresholds[{j}] has no {gone[0]}", file=file,
                                   span=spans.get(f"{at}.thresholds[{j}]"))
            metric, *stat = str(th["metric"]).split()
            e = {"metric": metric, "op": th["op"], "value": th["value"]}
            if stat:
                e["stat"] = " ".join(stat)
            try:
                Expectation.model_validate(e)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ImportFailed(f"{file}: {at}.thresholds[{j}].{'.'.join(map(str, err['loc']))}: {err['msg']}",
                                   file=file, span=spans.get(f"{at}.thresholds[{j}]")) from None
            out.append(e)
    if out:
        imp.contract["expect"] = out
