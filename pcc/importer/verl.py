"""`pcc import verl SOURCE`: a contract from a verl job (verl 0.9.1, `python -m verl.trainer.main_ppo`).

SOURCE is a Hydra YAML config, a launch script, an argument file of overrides, or the folder
pcc.lower.verl writes (verl_source.py reads them). What each key means is verl's own config
(trainer/config/*.yaml, workers/config/*.py; docs/import.md has the table): the actor strategy and
its Megatron precision (override_transformer_config fp8/fp8_recipe/fp4/fp4_recipe/fp8_param, read
through the Miles importer's trainer rules), the rollout engine, its online quantization and KV
cache dtype, parallelism, LoRA, algorithm.rollout_correction, router replay, the v1 trainer's
async mode, and the Ray runtime_env. Every key is checked against verl's composed config, its engine
table (pcc.lower.engine_table; a key the job leaves unset reads verl's default from it) (PCC810);
a key that carries precision and that pcc does not map is PCC807.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from pathlib import Path

from pcc.importer import Imported, ImportFailed, bundle_file, contract_name
from pcc.importer.bounds import MAX_INT, integer, said
from pcc.importer.checkpoint import Decided, _define, finish, load_model, rollout_rules
from pcc.importer.miles import Flags, lora_targets, read_expectations, trainer_rules
from pcc.importer.rules import family_patterns
from pcc.importer.te import BLOCK_FP32_ENV
from pcc.importer.verl_source import Entry, Job, read_job
from pcc.lower.engine_table import table
from pcc.lower.verl import tables
from pcc.models import Catalog
from pcc.plan.patterns import LINEAR
from pcc.resources import target_table

A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
MEGA = f"{A}.megatron"
TC = f"{MEGA}.override_transformer_config"
CORR = "algorithm.rollout_correction"
ENV = "ray_kwargs.ray_init.runtime_env.env_vars"
# verl's dtype spellings (PrecisionType) -> pcc's.
_DTYPE = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "float32": "fp32", "fp32": "fp32"}
# A key carries precision when a dotted part names a format, a dtype or quantization.
PRECISION = re.compile(r"fp8|fp4|fp16|bf16|fp32|int4|int8|dtype|precision|quant|qat|amax|kv_cache")
# Free-form maps of verl's config (any key is passed on): override_* dicts, *kwargs, env vars.
_FREE = re.compile(r"(^|\.)(override_\w+|\w*kwargs|env_vars|runtime_env|mbridge_config|override_config)$")
NOT_IN_A_JOB = (
    ("expect", "a verl job states no validation expectations (a pcc bundle's validate/expectations.yaml does); the "
               "contract states none"),
    ("rollout.record", "verl records log-probabilities (calculate_log_probs) and replays routes; 'versions' is pcc's"),
    ("sync.activation", "verl activates a synced version atomically (its weight update is a barrier)"),
    ("trainer.rules gemm", "Transformer Engine runs a recipe's GEMMs for real: 'qdq' and 'accumulate'/'output' are not "
                           "keys"),
)


class _View:
    """The job's value for a key, else the default of verl's config (its engine table) once the import
    knows which config the job composes; which keys the import has read."""

    def __init__(self, job: Job):
        self.job, self.read, self.config = job, set(), None

    def entry(self, key: str) -> Entry | None:
        self.read.add(key)
        e = self.job.entries.get(key)
        return None if e is None or e.op == "delete" else e

    def get(self, key: str):
        e = self.entry(key)
        return e.value if e is not None else table("verl").default(key, self.config) if self.config else None

    def span(self, key: str):
        e = self.job.entries.get(key)
        return e.span if e is not None else None

    def under(self, prefix: str) -> dict[str, Entry]:
        out = {k[len(prefix) + 1:]: e for k, e in self.job.entries.items() if k.startswith(prefix + ".")
               and e.op != "delete"}
        e = self.job.entries.get(prefix)
        if e is not None and isinstance(e.value, dict):  # `+a.b={k: v}` or a YAML `b: {}` given whole
            out = {str(k): Entry(v, e.span, e.op) for k, v in e.value.items()} | out
        self.read.update(f"{prefix}.{k}" for k in out)
        self.read.add(prefix)
        return out


def _parallel(imp, v, prefix: str, keys) -> dict:
    """{pcc key: size} for each verl size under `prefix` that is set and not 1 (pcc's default)."""
    sizes = {key: _typed(imp, v, f"{prefix}.{k}", int) for key, k in keys}
    return {key: n for key, n in sizes.items() if n is not None and n != 1}


def _typed(imp: Imported, v: _View, key: str, kind):
    """The key's value as `kind`; a string OmegaConf would convert for a typed field ("4", "true")
    is converted, anything else is PCC801 at its position."""
    value = v.get(key)
    if isinstance(value, str) and kind is int and re.fullmatch(r"[+-]?\d+", value.strip()):
        return int(value)
    if isinstance(value, str) and kind is bool and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):
        try:
            value, ok = float(value), True
        except ValueError:
            pass
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        ok = False  # NaN or infinity: no contract states it
    if value is not None and not ok:
        raise ImportFailed(f"{imp.source}: {key} is {said(value)}; verl takes "
                           f"{'a finite number' if kind is float else kind.__name__}",
                           path=key, file=imp.source, span=v.span(key))
    if kind is int and value is not None:  # a size or a length: no 400-digit number reaches the contract
        integer(value, key, imp.source, key, low=-MAX_INT - 1, span=v.span(key))
    return value


def import_verl(source: str, model: str | None, hardware: str | None = None) -> Imported:
    job = read_job(source)
    v = _View(job)
    imp = Imported({"name": contract_name(source), "framework": "verl"}, source=job.file)
    megatron = _strategy(imp, v)
    v.config = tables()["config_name"]["megatron" if megatron else "fsdp"]
    named = v.get(f"{M}.path")
    catalog, ref = load_model(model, _model_dir(v), (f"{M}.path", named if isinstance(named, str) else None))
    imp.contract["model"] = ref
    env = _env(imp, v)
    _rollout(imp, v, catalog)
    _trainer(imp, v, catalog, megatron, env)
    _objective(imp, v, catalog, megatron)
    _check_keys(imp, v)
    critic = sorted(k for k in job.entries if k.startswith("critic."))
    if critic:
        imp.warn("PCC807", f"{', '.join(critic[:4])}{' ...' if len(critic) > 4 else ''}: the PPO critic's settings "
                 f"({len(critic)}); a contract states the policy's rollout and trainer, not a critic's", "critic",
                 span=job.entries[critic[0]].span)
    # a pcc bundle's, as the Miles import reads it
    read_expectations(imp, bundle_file(Path(source), "validate/expectations.yaml") if Path(source).is_dir() else None)
    for path, why in NOT_IN_A_JOB:
        if path == "expect" and "expect" in imp.contract:
            continue
        imp.warn("PCC808", f"{path}: not in a verl job ({why}); the contract states pcc's default", path)
    finish(imp, catalog, hardware)
    return imp


def _model_dir(v: _View) -> str | None:
    path = v.get(f"{M}.path")
    return path if isinstance(path, str) and path and Path(path).is_dir() else None  # "" is no directory


def _strategy(imp: Imported, v: _View) -> bool:
    """True for the Megatron actor: --config-name ppo_megatron_trainer (with or without .yaml),
    model_engine=megatron, or actor.strategy megatron; a Megatron key under the FSDP config is refused by
    Hydra too."""
    job = v.job
    engine = v.get("model_engine")
    strategy = v.get(f"{A}.strategy")
    megatron = (table("verl").config(job.config) == tables()["config_name"]["megatron"] or engine == "megatron"
                or strategy == "megatron")
    if job.config is None and engine is None and strategy is None:
        megatron = any(k.startswith(MEGA + ".") for k in job.entries)
        imp.warn("PCC808", f"the job does not name its config (--config-name); read as "
                 f"{'ppo_megatron_trainer (it sets actor.megatron keys)' if megatron else 'ppo_trainer (FSDP actor)'}",
                 "trainer.engine")
    if strategy not in (None, "megatron", "fsdp", "fsdp2") or (megatron and strategy in ("fsdp", "fsdp2")):
        raise ImportFailed(f"{job.file}: actor strategy {strategy!r} with config {job.config or 'ppo_trainer'}: pcc "
                           "imports the megatron and fsdp/fsdp2 actors", path=f"{A}.strategy", file=job.file,
                           span=v.span(f"{A}.strategy"))
    for word, span in job.unread:
        imp.warn("PCC808", f"{word}: computed when the script runs (`$@`, a command, a variable the script does not "
                 "assign), read as written; the contract states what the script itself sets", "overrides", span=span)
    for text, span in job.defaults:
        imp.warn("PCC810", f"defaults entry {text!r}: pcc reads the trainer config and model_engine of a defaults "
                 "list; the keys this entry brings are not checked", "defaults", span=span)
    return megatron


def _env(imp: Imported, v: _View) -> dict[str, str]:
    """Ray's runtime_env env_vars (every worker's environment) over the script's exports (the
    driver's, which a local Ray cluster's workers inherit)."""
    env = {k: val for k, (val, _) in v.job.exports.items()}
    for k, e in v.under(ENV).items():
        env[k] = "" if e.value is None else str(e.value).lower() if isinstance(e.value, bool) else str(e.value)
    return env


def _rollout(imp: Imported, v: _View, catalog: Catalog) -> None:
    name = v.get(f"{R}.name")
    if name not in ("vllm", "sglang"):
        raise ImportFailed(f"{imp.source}: rollout name {name!r}: pcc's rollout engines are vllm and sglang"
                           + (" (verl requires actor_rollout_ref.rollout.name)" if name is None else ""),
                           path=f"{R}.name", file=imp.source, span=v.span(f"{R}.name"))
    d = Decided()
    quant = v.get(f"{R}.quantization")
    if quant == "fp8":
        # verl's online FP8 (vllm_async_server.py _apply_quantization): block 128x128, dynamic
        # activations, every Linear but the routers (`ignored_layers` model.layers.N.mlp.gate);
        # vLLM never quantizes the embedding and the LM head.
        if name == "sglang":
            imp.warn("PCC804", "rollout.quantization fp8 on SGLang: verl takes the exclusions from the model's own "
                     "quantization_config (verl/utils/sglang/sglang_fp8_utils.py), which the job does not carry; the "
                     "contract states verl's vLLM scope (every linear, routers BF16)", f"{R}.quantization",
                     span=v.span(f"{R}.quantization"))
        scheme = _define(imp, {"format": "fp8_e4m3", "weights": {"kind": "block", "rows": 128, "cols": 128},
                               "activations": {"kind": "tile", "rows": 1, "cols": 128}}, "fp8_block")
        d.scheme = {i: scheme for i, op in enumerate(catalog.operators) if op.family in LINEAR}
    elif quant is None and _model_dir(v) is not None:
        # a quantized checkpoint at model.path: vLLM and SGLang load it as its own config says
        from pcc.importer.checkpoint import decide_config, dir_quant_config

        qc, file, _ = dir_quant_config(Path(_model_dir(v))) or (None, None, None)  # None: a BF16 checkpoint
        if qc is not None:
            d = decide_config(qc, file, catalog, imp)
    elif quant is not None:
        imp.warn("PCC804", f"rollout.quantization {quant}: no pcc scheme states it (verl supports fp8, torchao, ascend); "
                 "the contract's rollout stays wide", f"{R}.quantization", span=v.span(f"{R}.quantization"))
    qfile = v.get(f"{R}.quantization_config_file")
    if qfile is not None:
        imp.warn("PCC807", f"rollout.quantization_config_file {qfile}: vLLM reads it beside the online quantization; pcc "
                 "does not import it here (import it with 'pcc import checkpoint')", f"{R}.quantization_config_file",
                 span=v.span(f"{R}.quantization_config_file"))
    kwargs = v.under(f"{R}.engine_kwargs.{name}")
    _engine_kwargs(imp, name, kwargs)
    kv = kwargs.get("kv_cache_dtype")
    if kv is not None and kv.value not in (None, "auto", "bfloat16", "bf16"):
        kinds = _kv_formats(name)
        if not isinstance(kv.value, str) or kv.value not in kinds:
            imp.warn("PCC804", f"engine_kwargs.{name}.kv_cache_dtype {kv.value}: no pcc KV cache format",
                     f"{R}.engine_kwargs.{name}.kv_cache_dtype", span=kv.span)
        else:
            d.kv = kinds[kv.value]
    other = "sglang" if name == "vllm" else "vllm"
    for k, e in v.under(f"{R}.engine_kwargs.{other}").items():
        if PRECISION.search(k):
            imp.warn("PCC806", f"engine_kwargs.{other}.{k}: the rollout is {name}, which does not read it",
                     f"{R}.engine_kwargs.{other}.{k}", span=e.span)
    rollout_rules(imp, catalog, d)
    block = imp.contract["rollout"]
    block["engine"] = name
    par = _parallel(imp, v, R, (("tp", "tensor_model_parallel_size"), ("dp", "data_parallel_size"),
                                ("ep", "expert_parallel_size"), ("pp", "pipeline_model_parallel_size")))
    spans = par.get("tp", 1) * par.get("dp", 1)
    if name == "vllm" and par.get("ep", 1) > 1 and par["ep"] != spans:
        # verl passes vLLM enable_expert_parallel = expert_parallel_size > 1 (vllm_async_server.py), and vLLM's
        # expert group is every tensor- and data-parallel rank: that is what runs
        imp.warn("PCC804", f"rollout.expert_parallel_size {par['ep']}: verl only turns vLLM's expert parallelism on, "
                 f"and vLLM spans it over tp x dp = {spans} ranks; written ep {spans}", f"{R}.expert_parallel_size",
                 span=v.span(f"{R}.expert_parallel_size"))
        par["ep"] = spans
    if par:
        block["parallel"] = par
    if _typed(imp, v, f"{R}.full_determinism", bool):
        block["deterministic"] = True
    length = v.get(f"{R}.response_length")
    if length is None or (isinstance(length, str) and length.startswith("${")):
        length = _typed(imp, v, "data.max_response_length", int)  # verl: ${oc.select:data.max_response_length,512}
    else:
        integer(length, "rollout.response_length", imp.source, f"{R}.response_length", low=1,
                span=v.span(f"{R}.response_length"))
    block["max_tokens"] = length
    block["record"] = ["logprobs", "versions"] if _typed(imp, v, f"{R}.calculate_log_probs", bool) else ["versions"]
    if v.get(f"{R}.dtype") not in ("bfloat16", "bf16"):
        imp.warn("PCC804", f"rollout.dtype {v.get(f'{R}.dtype')}: the contract's wide operators are bf16", f"{R}.dtype",
                 span=v.span(f"{R}.dtype"))


def _engine_kwargs(imp: Imported, engine: str, kwargs: dict[str, Entry]) -> None:
    """verl passes engine_kwargs.<engine> to the engine's own parser (vLLM's CLI arguments, SGLang's
    ServerArgs): each name is checked against the engine's table (PCC810), as the engine refuses it."""
    flags = table(engine)
    options = sorted(o[2:].replace("-", "_") for o in flags.flags)
    for k, e in kwargs.items():
        if e.value is not None and flags.spec("--" + k.replace("_", "-")) is None:
            near = difflib.get_close_matches(k, options, 1)
            imp.warn("PCC810", f"engine_kwargs.{engine}.{k}: {engine} has no such argument (verl passes engine_kwargs "
                     f"to {engine}'s own arguments, which refuse it)", f"{R}.engine_kwargs.{engine}.{k}", span=e.span,
                     hint=f"did you mean {near[0]}?" if near else None)


def _kv_formats(engine: str) -> dict[str, str]:
    """The rollout engine's --kv-cache-dtype values -> pcc's KV cache formats: the engine target's table
    read backwards ('auto' is the model's dtype, no KV format), and 'fp8', which both engines read as E4M3."""
    return {v: k for k, v in target_table(engine)["kv_cache_dtype"].items() if v != "auto"} | {"fp8": "fp8_e4m3"}


def _tc_flags() -> dict[str, str]:
    """override_transformer_config key -> the Megatron flag the trainer rules read: targets/verl.yaml
    megatron_args read backwards."""
    return {w["transformer"]: flag for flag, w in tables()["megatron_args"].items() if "transformer" in w}


def _trainer(imp: Imported, v: _View, catalog: Catalog, megatron: bool, env: dict[str, str]) -> None:
    t: dict = {"engine": "megatron" if megatron else "fsdp"}
    optim = f"{A}.optim"
    if megatron:
        flags: dict[str, list[str]] = {}
        where: dict[str, str] = {}
        tc = v.under(TC)
        tc_flags = _tc_flags()
        for k, flag in tc_flags.items():
            e = tc.get(k)
            if e is None or e.value is None or e.value is False:
                continue
            flags[flag] = [] if e.value is True else [str(e.value)]
            where[flag] = f"{TC}.{k}"
        before = len(imp.diagnostics)
        t["rules"] = trainer_rules(imp, Flags(flags, env, imp.source), catalog)
        _repoint(imp, v, before, where)
        if tc.get("fp8_param") is not None and tc["fp8_param"].value is True:
            t["param_gather"] = "fp8"
        router = tc.get("moe_router_dtype")
        if catalog.is_moe and (router is None or router.value != "fp32"):
            imp.warn("PCC804", f"override_transformer_config.moe_router_dtype {router.value if router else 'unset'}: "
                     "pcc's Megatron trainer computes router logits in FP32; the contract cannot state otherwise",
                     f"{TC}.moe_router_dtype", span=router.span if router else None)
        for k, e in tc.items():
            if k not in tc_flags and PRECISION.search(k):
                imp.warn("PCC807", f"override_transformer_config.{k} {e.value}: a TransformerConfig precision switch "
                         "pcc has no field for; the contract does not state it", f"{TC}.{k}", span=e.span)
        t["params"] = _dtype(imp, v, f"{MEGA}.dtype")
        t["optimizer"] = {"distributed": bool(_typed(imp, v, f"{MEGA}.use_distributed_optimizer", bool))}
        _state_offload(imp, v, f"{MEGA}.optimizer_offload")
        par = _parallel(imp, v, MEGA, (("tp", "tensor_model_parallel_size"), ("pp", "pipeline_model_parallel_size"),
                                       ("ep", "expert_model_parallel_size"), ("cp", "context_parallel_size")))
        if par:
            t["parallel"] = par
        qat = f"{MEGA}.qat.enable"
    else:
        t["rules"] = []
        t["params"] = _dtype(imp, v, f"{A}.fsdp_config.dtype")
        master = _dtype(imp, v, f"{A}.fsdp_config.model_dtype")
        if master != "fp32":  # pcc's FSDP lowerings keep the sharded parameters fp32 (PCC641)
            imp.warn("PCC804", f"fsdp_config.model_dtype {v.get(f'{A}.fsdp_config.model_dtype')}: verl's FSDP actor "
                     f"holds its parameters and AdamW's moments in {master}; pcc keeps FSDP master weights and moments "
                     "fp32 (written master fp32)", f"{A}.fsdp_config.model_dtype",
                     span=v.span(f"{A}.fsdp_config.model_dtype"))
        t["master"] = "fp32"
        t["optimizer"] = {}
        _state_offload(imp, v, f"{A}.fsdp_config.optimizer_offload")
        qat = f"{A}.fsdp_config.qat.enable"
        for var in sorted(env):
            if var.startswith("NVTE_"):
                imp.warn("PCC807", f"{var}={env[var]}: verl's FSDP actor runs BF16 (no Transformer Engine recipe)", var)
    if _typed(imp, v, qat, bool):
        imp.warn("PCC807", f"{qat}: verl's QAT (NVFP4/W4A16 fake quantization through ModelOpt, its own quantization "
                 "config for the rollout) is not imported; the contract's trainer and rollout do not state it", qat,
                 span=v.span(qat))
    kind = str(v.get(f"{optim}.optimizer")).lower()
    if kind not in ("adam", "adamw", "sgd"):
        imp.warn("PCC804", f"optim.optimizer {kind}: pcc states adam or sgd; written adam", f"{optim}.optimizer",
                 span=v.span(f"{optim}.optimizer"))
        kind = "adam"
    t["optimizer"]["kind"] = "sgd" if kind == "sgd" else "adam"
    if megatron:
        # verl builds Megatron's OptimizerConfig from optim, then sets override_optimizer_config's keys on it
        aware = f"{optim}.override_optimizer_config.use_precision_aware_optimizer"
        if v.entry(aware) is None:
            aware = f"{optim}.use_precision_aware_optimizer"
        t["optimizer"]["precision_aware"] = bool(_typed(imp, v, aware, bool))
        t["grads"] = _dtype(imp, v, f"{optim}.main_grads_dtype")
        t["moments"] = _dtype(imp, v, f"{optim}.exp_avg_dtype")
        if _dtype(imp, v, f"{optim}.exp_avg_sq_dtype") != t["moments"]:
            imp.warn("PCC804", f"optim.exp_avg_sq_dtype differs from exp_avg_dtype {t['moments']}: a contract states one "
                     "moments dtype", f"{optim}.exp_avg_sq_dtype", span=v.span(f"{optim}.exp_avg_sq_dtype"))
    imp.contract["trainer"] = t


def _state_offload(imp: Imported, v: _View, key: str) -> None:
    """verl's optimizer_offload moves the optimizer state to the CPU between training phases and back
    to step on the GPU; the contract's `offload` is Megatron's CPU optimizer (it steps on the CPU, and
    needs the precision-aware optimizer: PCC309), a different thing, so it is not imported as that."""
    if _typed(imp, v, key, bool):
        imp.warn("PCC807", f"{key}: verl moves the optimizer state to the CPU between training phases (it still "
                 "steps on the GPU); a contract has no field for it ('offload' is Megatron's CPU optimizer)", key,
                 span=v.span(key))


def _dtype(imp: Imported, v: _View, key: str) -> str:
    value = v.get(key)
    if not isinstance(value, str) or (value not in _DTYPE and value != "fp8"):
        raise ImportFailed(f"{imp.source}: {key} {value!r} is not a dtype pcc states (bf16, fp16, fp32)", path=key,
                           file=imp.source, span=v.span(key))
    return _DTYPE.get(value, value)


def _repoint(imp: Imported, v: _View, start: int, where: dict[str, str]) -> None:
    """Diagnostics the shared trainer rules wrote about a Megatron flag, or an NVTE_* variable,
    point at the verl key (with its position) that it came from."""
    for n in range(start, len(imp.diagnostics)):
        d = imp.diagnostics[n]
        key = where.get(d.path) or (f"{ENV}.{d.path}" if d.path and f"{ENV}.{d.path}" in v.job.entries else None)
        if d.path == "env" and f"{ENV}.{BLOCK_FP32_ENV}" not in v.job.entries:
            key = None
        msg = d.message
        for flag, k in where.items():  # the message names the verl key, not the Megatron flag
            msg = re.sub(rf"{re.escape(flag)}(?![\w-])", k.removeprefix(TC + "."), msg)
        imp.diagnostics[n] = dataclasses.replace(d, message=msg, path=key or d.path,
                                                 span=v.span(key) if key else d.span)


def _objective(imp: Imported, v: _View, catalog: Catalog, megatron: bool) -> None:
    c = imp.contract
    _correction(imp, v)
    mode = v.get(f"{MEGA}.router_replay.mode") if megatron else "disabled"
    record = _typed(imp, v, f"{R}.enable_rollout_routing_replay", bool)
    if mode not in ("disabled", "R2", "R3"):
        raise ImportFailed(f"{imp.source}: router_replay.mode {mode!r}: verl's modes are disabled, R2, R3",
                           path=f"{MEGA}.router_replay.mode", file=imp.source, span=v.span(f"{MEGA}.router_replay.mode"))
    if mode != "disabled":
        c["routing_replay"] = mode.lower()
    if (mode == "R3") != bool(record):
        imp.warn("PCC804", f"router_replay.mode {mode} with rollout.enable_rollout_routing_replay {record}: R3 replays "
                 "the routes rollout records, and only R3 uses them", f"{R}.enable_rollout_routing_replay",
                 span=v.span(f"{R}.enable_rollout_routing_replay") or v.span(f"{MEGA}.router_replay.mode"))
    sync: dict = {}
    mode_key = "trainer.v1.trainer_mode"
    tmode = v.get(mode_key) if v.get("trainer.use_v1") else "sync"
    if tmode == "sync":
        sync["schedule"] = "colocated"
    elif tmode in ("separate_async", "colocate_async"):
        sync["schedule"] = "async"
        limit = _typed(imp, v, "trainer.v1.sampler.max_off_policy_threshold", int)
        if limit is None:
            imp.warn("PCC804", "trainer.v1.sampler.max_off_policy_threshold null: staleness is unbounded, which a "
                     "contract cannot state; written max_staleness 1000 (pcc's limit)",
                     "trainer.v1.sampler.max_off_policy_threshold")
            sync["max_staleness"] = 1000
        else:  # verl drops a trajectory when global_steps - its steps + 1 > threshold
            sync["max_staleness"] = max(0, limit - 1)
        if tmode == "separate_async":
            step = _typed(imp, v, "trainer.v1.separate_async.parameter_sync_step", int)
            if step != 1:
                sync["interval"] = step
        else:
            imp.warn("PCC804", "trainer_mode colocate_async: rollout and training share GPUs and overlap by warm-up "
                     "batches; the contract states an async schedule with verl's staleness bound", mode_key,
                     span=v.span(mode_key))
    else:
        raise ImportFailed(f"{imp.source}: trainer.v1.trainer_mode {tmode!r}: verl's modes are sync, colocate_async, "
                           "separate_async", path=mode_key, file=imp.source, span=v.span(mode_key))
    lora = _lora(imp, v, catalog, megatron)
    if lora:
        merged = megatron and _typed(imp, v, f"{M}.lora.merge", bool)
        sync["moves"] = "full_weights" if merged else "adapter"
        c["trainable"] = lora
    c["sync"] = sync


def _correction(imp: Imported, v: _View) -> None:
    """algorithm.rollout_correction: rollout_is token/sequence with a float threshold is TIS, with
    'lower_upper' IcePop (weights outside zeroed: pcc's mis); rejection sampling, bypass mode and
    batch normalization have no contract field (PCC804)."""
    level = v.get(f"{CORR}.rollout_is")
    # each with the keys that only mean something with it (its threshold; bypass mode's loss)
    for key, off, companion in (("rollout_rs", None, "rollout_rs_threshold"), ("bypass_mode", False, "loss_type"),
                                ("rollout_is_batch_normalize", False, None)):
        value = v.get(f"{CORR}.{key}")
        if value != off:
            with_ = f" ({companion} {v.get(f'{CORR}.{companion}')})" if companion else ""
            imp.warn("PCC804", f"rollout_correction.{key} {value}{with_}: pcc's correction states truncated or masked "
                     "importance weights only; the contract does not state it", f"{CORR}.{key}",
                     span=v.span(f"{CORR}.{key}"))
    if level is None:
        return
    if level not in ("token", "sequence"):
        raise ImportFailed(f"{imp.source}: rollout_correction.rollout_is {level!r}: verl's levels are token and "
                           "sequence", path=f"{CORR}.rollout_is", file=imp.source, span=v.span(f"{CORR}.rollout_is"))
    key = f"{CORR}.rollout_is_threshold"
    th = v.get(key)
    try:
        if isinstance(th, str) and "_" in th.strip("_"):
            lo, hi = (float(x) for x in th.split("_"))
            corr = {"kind": "mis", "clip": hi, "low": lo}
        else:
            corr = {"kind": "tis", "clip": float(th)}
        if not all(math.isfinite(x) for x in (corr["clip"], corr.get("low", 0.0))):
            raise ValueError(th)
    except (TypeError, ValueError):
        raise ImportFailed(f"{imp.source}: rollout_is_threshold {th!r} is neither a finite number (TIS) nor 'lower_upper' "
                           "(IcePop)", path=key, file=imp.source, span=v.span(key)) from None
    if level != "token":
        corr["level"] = level
    imp.contract["correction"] = corr


def _lora(imp: Imported, v: _View, catalog: Catalog, megatron: bool) -> dict | None:
    ops = catalog.operators
    if megatron:
        rank = _typed(imp, v, f"{M}.lora.rank", int)
        if not rank:
            return None
        names = v.get(f"{M}.lora.target_modules")
        names = [names] if isinstance(names, str) else [str(n) for n in names] if isinstance(names, list) else []
        inverse: dict[str, list[str]] = {}
        for fam, mod in tables()["megatron_lora_modules"].items():
            inverse.setdefault(mod, []).append(fam)
        present = {op.family for op in ops}
        families = set()
        for n in names:
            fams = [f for f in inverse.get(n, []) if f in present]
            if not fams:
                imp.warn("PCC802", f"lora.target_modules {n}: no module of {catalog.name} has that Megatron name",
                         f"{M}.lora.target_modules", span=v.span(f"{M}.lora.target_modules"))
            families |= set(fams)
        if not families:
            raise ImportFailed(f"{imp.source}: lora.target_modules selects no module of {catalog.name}",
                               path=f"{M}.lora.target_modules", file=imp.source, span=v.span(f"{M}.lora.target_modules"))
        excl = v.get(f"{M}.lora.exclude_modules")
        if excl:
            imp.warn("PCC804", f"lora.exclude_modules {excl}: not imported; the contract adapts every listed module",
                     f"{M}.lora.exclude_modules", span=v.span(f"{M}.lora.exclude_modules"))
        t = {"kind": "lora", "rank": rank, "alpha": _typed(imp, v, f"{M}.lora.alpha", float),
             "targets": family_patterns(catalog, families)}
        drop = _typed(imp, v, f"{M}.lora.dropout", float)
        if drop:
            t["dropout"] = drop
        return t
    rank = _typed(imp, v, f"{M}.lora_rank", int)
    if not rank:
        return None
    mods = v.get(f"{M}.target_modules")
    if not isinstance(mods, (str, list)) or not mods:
        raise ImportFailed(f"{imp.source}: model.target_modules {mods!r}: verl takes module names or all-linear",
                           path=f"{M}.target_modules", file=imp.source, span=v.span(f"{M}.target_modules"))
    before = len(imp.diagnostics)
    targets = lora_targets(imp, catalog, mods if isinstance(mods, str) else ",".join(map(str, mods)))
    for n in range(before, len(imp.diagnostics)):
        imp.diagnostics[n] = dataclasses.replace(imp.diagnostics[n], path=f"{M}.target_modules",
                                                 span=v.span(f"{M}.target_modules"))
    if v.get(f"{M}.exclude_modules"):
        imp.warn("PCC804", f"model.exclude_modules {v.get(f'{M}.exclude_modules')}: not imported", f"{M}.exclude_modules",
                 span=v.span(f"{M}.exclude_modules"))
    return {"kind": "lora", "rank": rank, "alpha": _typed(imp, v, f"{M}.lora_alpha", float), "targets": targets}


def _check_keys(imp: Imported, v: _View) -> None:
    """Every key against verl's composed config, its engine table (PCC810, with the nearest key verl
    has), Hydra's rules for `key=` (must exist) and `+key=` (must not), override_transformer_config
    against megatron-core's TransformerConfig; then keys that carry precision and that the import did
    not read (PCC807, when they differ from verl's default)."""
    from pcc.importer.verl_config import transformer_fields

    tree = table("verl").tree(v.config)
    te_fields = transformer_fields()
    added = {k for k in v.job.own if _lookup(tree, k)[0] is False}
    if added:
        imp.warn("PCC808", f"entrypoint {v.job.entrypoint}: its config adds keys verl's trainer config does not have "
                 f"({', '.join(sorted(added)[:4])}{f' and {len(added) - 4} more' if len(added) > 4 else ''}); pcc does not read them, so the contract "
                 "states what verl's trainer runs with the rest (its sync and correction included)", "entrypoint")
    for key, e in v.job.entries.items():
        if key == "model_engine" or table("verl").canonical(key) in added:
            continue
        found, default = _lookup(tree, key)
        _report(imp, key, e, found, default, te_fields)
        if key in v.read or not PRECISION.search(key) or key.startswith(ENV) or found is False:
            continue  # read, not precision, an environment variable, or already reported unknown
        if found is True and default == e.value:
            continue
        imp.warn("PCC807", f"{key} {e.value}: a verl key that carries precision and that pcc has no field for; the "
                 "contract does not state it", key, span=e.span)
    unknown = {d.path for d in imp.diagnostics if d.code == "PCC810"}
    imp.diagnostics[:] = [d for d in imp.diagnostics if not (d.code == "PCC807" and d.path in unknown)]


def _lookup(tree: dict, key: str):
    """(True, default) when verl's config has the key; (False, (parent path, siblings)) when it has
    not; (None, None) under a free-form map."""
    node, parts = tree, key.split(".")
    for n, part in enumerate(parts):
        path = ".".join(parts[:n])
        if not isinstance(node, dict) or (_FREE.search(path) if path else False):
            return (None, None) if isinstance(node, dict) or node is None else (False, (path, []))
        if part not in node:
            return False, (path, list(node))
        node = node[part]
    return True, node


def _report(imp: Imported, key: str, e: Entry, found, info, te_fields: set[str]) -> None:
    if found is None:
        if key.startswith(TC + ".") and te_fields and key.split(".")[-1] not in te_fields:
            near = difflib.get_close_matches(key.split(".")[-1], te_fields, 1)
            imp.warn("PCC810", f"{key}: no TransformerConfig field of that name (verl builds a TransformerConfig from "
                     "override_transformer_config and megatron-core refuses it)", key, span=e.span,
                     hint=f"did you mean {near[0]}?" if near else None)
        return
    if found is True:
        if e.op == "add":
            imp.warn("PCC810", f"+{key}: verl's config already has {key}; Hydra refuses to add it (write {key}=...)",
                     key, span=e.span)
        return
    parent, siblings = info
    near = difflib.get_close_matches(key.split(".")[len(parent.split(".")) if parent else 0], siblings, 1)
    if e.op in ("add", "force") and parent == key.rsplit(".", 1)[0]:
        return  # `+key=v` adds a key under an existing section, as Hydra allows
    imp.warn("PCC810", f"{key}: verl's config has no such key" + (f" (under {parent})" if parent else "")
             + ("; Hydra refuses the override" if e.op == "set" else "; verl ignores it or refuses it when it builds "
                "its config classes"), key, span=e.span, hint=f"did you mean {parent + '.' if parent else ''}{near[0]}?"
             if near else None)
