"""`pcc import nemo_rl RECIPE`: a contract from a NeMo RL GRPO recipe (NeMo RL 0.7.0, examples/run_grpo.py).

RECIPE is a recipe YAML (OmegaConf, `defaults:` inheritance, as nemo_rl/utils/config.py load_config
reads it), or the folder pcc.lower.nemo_rl writes (its nemo_rl/config.yaml, which launch.sh puts under
the base recipe of its policy backend). The recipe is read BACKWARDS through the lowering's own tables
(targets/nemo_rl.yaml): `megatron_args` (policy.megatron_cfg keys -> the Megatron arguments the
Miles/verl importers' trainer rules read), `fp8_generation` (vllm_cfg.precision fp8 is block FP8
128x128 with 1x128 activations over every linear module but quantization_ignored_layer_kws and the
never-quantized embedding and LM head) and `base_config`; the base recipes' own values come from
targets/nemo_rl_keys.json (the pinned recipes' keys and defaults), a `defaults:` chain of other files
from the recipe's folder or the installed NeMo RL checkout (pcc.lower.verify_nemo_rl.engine_dir()).
A base that resolves nowhere is PCC808 and the recipe's own keys are read alone. A key NeMo RL does not
have is PCC810; a key that carries precision and that pcc does not map is PCC807; a value the contract
states differently is PCC804.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import re
from pathlib import Path

from pcc.importer import Imported, ImportFailed, contract_name
from pcc.importer.checkpoint import Decided, _define, finish, load_model, rollout_rules
from pcc.importer.miles import Flags, trainer_rules
from pcc.importer.verl import PRECISION, _kv_formats
from pcc.importer.yamlsource import load, read_text
from pcc.lang.diagnostics import Span
from pcc.lower.nemo_rl import (
    CONFIG_FILE,
    DTENSOR,
    LOSS,
    MEGATRON,
    POLICY,
    VLLM,
    flatten,
    tables,
)
from pcc.plan.patterns import LINEAR
from pcc.resources import data_dir

WHAT = "NeMo RL recipe"
NOT_IN_A_RECIPE = (
    ("expect", "a NeMo RL recipe states no validation expectations; the contract states none"),
    ("trainer.rules gemm", ("Transformer Engine runs a recipe's GEMMs for real: 'qdq' and 'accumulate'/'output' "
                            "are not keys")),
)
# Free-form maps (any key is passed on):
# env.<name>, data.<split>, policy.hf_config_overrides (the Hugging Face config's own keys): free-form
_FREE = re.compile(r"(^|\.)(env_vars|\w*kwargs|hf_config_overrides)(\.|$)|^(env|data)(\.|$)")


@functools.lru_cache(maxsize=1)
def _keys_table() -> dict:
    return json.loads((data_dir("targets") / "nemo_rl_keys.json").read_text(encoding="utf-8"))


class _Recipe:
    """The merged recipe: dotted key -> value (the base recipes' under the file's own), where each
    of the file's own keys is written, and which keys the import read."""

    def __init__(self, values: dict, spans: dict[str, Span], own: set[str], base: str | None):
        self.values, self.spans, self.own, self.base, self.read = values, spans, own, base, set()
        self.sections = {k.split(".", 1)[0] for k in values}  # top-level sections: the job NeMo RL runs

    def get(self, key: str, default=None):
        self.read.add(key)
        value = self.values.get(key, default)
        return self._resolve(value, 0)

    def _resolve(self, value, depth: int):
        if isinstance(value, str) and depth < 8:
            m = re.fullmatch(r"\$\{([\w.]+)\}", value.strip())
            if m and m.group(1) in self.values:
                return self._resolve(self.values[m.group(1)], depth + 1)
        return value

    def span(self, key: str) -> Span | None:
        return self.spans.get(key)

    def under(self, prefix: str) -> dict:
        out = {k[len(prefix) + 1:]: v for k, v in self.values.items() if k.startswith(prefix + ".")}
        self.read.update(f"{prefix}.{k}" for k in out)
        return out


def _merge(base: dict, own: dict) -> dict:
    """OmegaConf's merge of flattened trees: the own value of a key replaces the base's, and a leaf
    (null, a scalar, a list) written where the base has a section replaces the whole section."""
    out = dict(base)
    for k, v in own.items():
        for b in [b for b in out if b.startswith(k + ".")]:
            del out[b]
        for n in range(1, k.count(".") + 1):  # a section written where the base has a leaf
            out.pop(k.rsplit(".", n)[0], None)
        out[k] = v
    return out


def _read(path: Path, imp: Imported, inherited: dict[str, Span], depth: int = 0
          ) -> tuple[dict, dict[str, Span], str | None]:
    """(merged values, the file's own spans, the base it names) of one recipe file and its defaults; the
    spans of the keys its bases write (files of the chain, not the pinned values) go to `inherited`."""
    text = read_text(str(path), WHAT)
    doc, spans = load(text, str(path), WHAT)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ImportFailed(f"{path}: a NeMo RL recipe is a YAML mapping", file=str(path))
    defaults = doc.pop("defaults", None)
    own = flatten(doc)
    own_spans = {k: s for k, s in spans.items() if not k.endswith("@key")}
    if defaults is None:
        return own, own_spans, None
    if isinstance(defaults, list) and len(defaults) == 1:
        defaults = defaults[0]
    if not isinstance(defaults, str) or depth > 8:
        imp.warn("PCC808", f"defaults {defaults!r}: pcc resolves one base recipe by path; the recipe's own keys are "
                 "read alone", "defaults", span=spans.get("defaults"))
        return own, own_spans, str(defaults)
    base = _base(path, defaults, imp, inherited, depth, spans.get("defaults"))
    if base is None:
        return own, own_spans, defaults
    return _merge(base, own), own_spans, defaults


def _base(path: Path, name: str, imp: Imported, inherited: dict[str, Span], depth: int, span: Span | None
          ) -> dict | None:
    """The base recipe's merged values: a pinned base recipe (targets/nemo_rl_keys.json), else the
    file beside the recipe, else in the installed NeMo RL checkout; None (PCC808) where none."""
    recipes = _keys_table()["recipes"]
    if Path(name).name in recipes and not (path.parent / name).is_file():
        return dict(recipes[Path(name).name])
    candidates = [path.parent / name]
    from pcc.lower.verify_nemo_rl import engine_dir

    configs = engine_dir() / "examples" / "configs"  # the side folder; absent in CI
    candidates += [configs / "recipes" / "llm" / name, configs / name, configs / Path(name).name]
    for c in candidates:
        if c.is_file():
            if c.name in recipes and c.resolve().parent.name == "configs":
                return dict(recipes[c.name])
            values, spans, _ = _read(c, imp, inherited, depth + 1)
            inherited.update(spans)  # after its own bases': the nearer file's span wins
            return values
    imp.warn("PCC808", f"defaults {name}: the base recipe is neither a pinned NeMo RL {tables()['version']} recipe "
             "(targets/nemo_rl_keys.json) nor beside the recipe nor in the installed NeMo RL checkout; only the "
             "recipe's own keys are read (the base's settings, precision included, are not in the contract)",
             "defaults", span=span)
    return None


def read_recipe(source: str, imp: Imported) -> _Recipe:
    p = Path(source)
    if p.is_dir():
        p = p / CONFIG_FILE if (p / CONFIG_FILE).is_file() else p / "config.yaml"
    imp.source = str(p)
    inherited: dict[str, Span] = {}
    values, spans, base = _read(p, imp, inherited)
    own = set(spans)
    sections = {k.split(".", 1)[0] for k in values}  # the recipe's job, before a base is assumed for it
    if base is None:  # a pcc bundle's config.yaml: launch.sh puts it under the base of its policy backend
        engine = "megatron" if values.get(f"{MEGATRON}.enabled") else "fsdp"
        name = tables()["base_config"][engine]
        imp.warn("PCC808", f"the recipe names no defaults: read over NeMo RL's examples/configs/{name} (what pcc's "
                 f"launch.sh puts under it for the {engine} policy)", "defaults")
        values, base = _merge(dict(_keys_table()["recipes"][name]), values), name
    r = _Recipe(values, {**inherited, **spans}, own, base)
    r.sections = sections
    return r


# NeMo RL's jobs that train on a dataset with no rollout: the recipe's section -> what it runs.
NOT_RL = {
    "sft": "supervised fine-tuning (examples/run_sft.py)",
    "dpo": "direct preference optimization (examples/run_dpo.py)",
    "rm": "reward-model training (examples/run_rm.py)",
    "distillation": ("distillation (examples/run_distillation.py or run_off_policy_distillation.py; the student's loss "
                     "is its divergence from a teacher's logits, with no reward and no importance ratio)"),
}


def _job(imp: Imported, r: _Recipe) -> None:
    """A recipe whose sections (its own or its bases') make it a job that is no RL is PCC805; PPO, which
    NeMo RL runs with examples/run_ppo.py and a value model, is named (PCC807): pcc's job is GRPO."""
    sections = r.sections
    if "grpo" in sections:
        return
    for name, what in NOT_RL.items():
        if name in sections:
            raise ImportFailed(f"{imp.source}: its `{name}` section makes it a NeMo RL {what} job, which is no RL "
                               "job: a contract states a rollout, a trainer and the sync between them", code="PCC805",
                               path=name, file=imp.source, span=r.span(name),
                               hint="import a GRPO recipe (examples/run_grpo.py)")
    if "ppo" in sections:
        imp.warn("PCC807", "ppo: NeMo RL runs this recipe with examples/run_ppo.py, which also trains a value model "
                 "(value.*, its own precision and parallelism); pcc's NeMo RL job is GRPO (examples/run_grpo.py) "
                 "and the contract states the policy only", "value", span=r.span("value") or r.span("ppo"))


def import_nemo_rl(source: str, model: str | None, hardware: str | None = None) -> Imported:
    imp = Imported({"name": contract_name(source), "framework": "nemo_rl"}, source=source)
    r = read_recipe(source, imp)
    _job(imp, r)
    named = r.get(f"{POLICY}.model_name")
    path = named if isinstance(named, str) and Path(named).is_dir() else None
    catalog, ref = load_model(model, path, (f"{POLICY}.model_name", named if isinstance(named, str) else None))
    imp.contract["model"] = ref
    _rollout(imp, r, catalog)
    _trainer(imp, r, catalog)
    _objective(imp, r)
    _check_keys(imp, r)
    for p, why in NOT_IN_A_RECIPE:
        imp.warn("PCC808", f"{p}: not in a NeMo RL recipe ({why}); the contract states pcc's default", p)
    finish(imp, catalog, hardware)
    return imp


def _int(imp: Imported, r: _Recipe, key: str, default: int = 1) -> int:
    value = r.get(key, default)
    if value is None:
        return default
    if isinstance(value, str) and re.fullmatch(r"\d+", value.strip()):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 1 << 31:
        raise ImportFailed(f"{imp.source}: {key} is {value!r}; NeMo RL takes a positive integer", path=key,
                           file=imp.source, span=r.span(key))
    return value


def _rollout(imp: Imported, r: _Recipe, catalog) -> None:
    fp8 = tables()["fp8_generation"]
    backend = r.get("policy.generation.backend", "vllm")
    if backend != "vllm":
        raise ImportFailed(f"{imp.source}: generation backend {backend!r}: pcc imports NeMo RL's vLLM generation",
                           path="policy.generation.backend", file=imp.source, span=r.span("policy.generation.backend"))
    d = Decided()
    precision = r.get(f"{VLLM}.precision")
    kws = r.get(f"{VLLM}.quantization_ignored_layer_kws") or []
    kws = [kws] if isinstance(kws, str) else [str(k) for k in kws]
    if precision == fp8["precision"]:
        spec = {"format": "fp8_e4m3", "weights": {"kind": "block", "rows": fp8["block"][0], "cols": fp8["block"][1]},
                "activations": {"kind": "tile", "rows": fp8["activation_tile"][0], "cols": fp8["activation_tile"][1]}}
        pow2 = r.get(f"{VLLM}.pow2_weight_scaling_factors") or r.get(f"{VLLM}.pow2_activation_scaling_factors")
        if pow2:
            spec["scale"] = "pow2"
        scheme = _define(imp, spec, "fp8_block")
        matched: set[str] = set()
        for i, op in enumerate(catalog.operators):
            name = op.tensor.removesuffix(".weight")
            hit = [k for k in kws if k in name]  # NeMo RL's substring match
            matched.update(hit)
            if op.family in LINEAR and name not in fp8["never_quantized"] and not hit:
                d.scheme[i] = scheme
        for k in sorted(set(kws) - matched):
            imp.warn("PCC802", f"quantization_ignored_layer_kws {k}: matches no module of {catalog.name}",
                     f"{VLLM}.quantization_ignored_layer_kws", span=r.span(f"{VLLM}.quantization_ignored_layer_kws"))
        for n in ("num_first_layers_in_bf16", "num_last_layers_in_bf16"):
            if r.get(f"{VLLM}.{n}"):
                imp.warn("PCC807", f"vllm_cfg.{n} {r.get(f'{VLLM}.{n}')}: not imported; the contract quantizes those "
                         "layers", f"{VLLM}.{n}", span=r.span(f"{VLLM}.{n}"))
    elif precision not in ("bfloat16", "bf16", None):
        imp.warn("PCC804", f"vllm_cfg.precision {precision}: NeMo RL's generation precisions pcc states are bfloat16 "
                 "and fp8 (block 128x128); the contract's rollout stays bf16", f"{VLLM}.precision",
                 span=r.span(f"{VLLM}.precision"))
    elif kws:
        imp.warn("PCC806", "vllm_cfg.quantization_ignored_layer_kws without precision fp8: NeMo RL does not read it",
                 f"{VLLM}.quantization_ignored_layer_kws", span=r.span(f"{VLLM}.quantization_ignored_layer_kws"))
    kv = r.get(f"{VLLM}.kv_cache_dtype")
    if kv not in (None, "auto"):
        kinds = _kv_formats("vllm")
        if kv not in kinds:
            imp.warn("PCC804", f"vllm_cfg.kv_cache_dtype {kv}: no pcc KV cache format", f"{VLLM}.kv_cache_dtype",
                     span=r.span(f"{VLLM}.kv_cache_dtype"))
        else:
            d.kv = kinds[kv]
    rollout_rules(imp, catalog, d)
    block = imp.contract["rollout"]
    block["engine"] = "vllm"
    par = {k: _int(imp, r, f"{VLLM}.{key}") for k, key in (("tp", "tensor_parallel_size"),
                                                            ("pp", "pipeline_parallel_size"),
                                                            ("ep", "expert_parallel_size"))}
    if par["ep"] > par["tp"] and par["ep"] % par["tp"] == 0:
        # NeMo RL runs vLLM's own data parallelism for experts: vllm_dp_size = ep / tp (vllm_generation.py)
        par["dp"] = par["ep"] // par["tp"]
    par = {k: n for k, n in par.items() if n != 1}
    if par:
        block["parallel"] = par
    tokens = r.get("policy.generation.max_new_tokens")
    if tokens is not None:
        block["max_tokens"] = _int(imp, r, "policy.generation.max_new_tokens")


def _trainer(imp: Imported, r: _Recipe, catalog) -> None:
    megatron = bool(r.get(f"{MEGATRON}.enabled"))
    if megatron and r.get(f"{DTENSOR}.enabled"):
        raise ImportFailed(f"{imp.source}: both policy.megatron_cfg.enabled and policy.dtensor_cfg.enabled: NeMo RL "
                           "refuses two policy backends", path=f"{MEGATRON}.enabled", file=imp.source,
                           span=r.span(f"{MEGATRON}.enabled"))
    precision = r.get(f"{POLICY}.precision")
    if precision not in ("bfloat16", "bf16"):
        imp.warn("PCC804", f"policy.precision {precision}: pcc's trainers hold BF16 parameters; written params bf16",
                 f"{POLICY}.precision", span=r.span(f"{POLICY}.precision"))
    t: dict = {"engine": "megatron" if megatron else "fsdp", "params": "bf16"}
    if megatron:
        flags: dict[str, list[str]] = {}
        where: dict[str, str] = {}
        fp8_on = bool(r.get(f"{MEGATRON}.fp8_cfg.enabled"))
        for flag, w in tables()["megatron_args"].items():  # the lowering's table, read backwards
            if "key" not in w or (w["key"] == "moe_router_dtype" and not catalog.is_moe):  # no router: not read
                continue
            key = f"{MEGATRON}.{w['key']}"
            value = r.get(key)
            if w["key"].startswith("fp8_cfg.") and not fp8_on:
                continue
            if value is None or value is False:
                continue
            flags[flag] = [] if value is True else [str(value)]
            where[flag] = key
        env = {k: str(v).lower() if isinstance(v, bool) else str(v)
               for k, v in r.under(f"{MEGATRON}.env_vars").items() if v is not None}
        before = len(imp.diagnostics)
        t["rules"] = trainer_rules(imp, Flags(flags, env, imp.source), catalog)
        for n in range(before, len(imp.diagnostics)):  # point at the recipe's key
            d = imp.diagnostics[n]
            key = where.get(d.path) or (f"{MEGATRON}.env_vars.{d.path}" if d.path in env else None)
            if key:
                imp.diagnostics[n] = dataclasses.replace(d, path=key, span=r.span(key) or d.span)
        if "--fp8-param-gather" in flags:
            t["param_gather"] = "fp8"
        # A model with no router: its router dtype is nothing the contract states, and left unread, the key
        # check below names it where it differs from the launch base's.
        router = r.get(f"{MEGATRON}.moe_router_dtype") if catalog.is_moe else "fp32"
        if router != "fp32":
            imp.warn("PCC804", f"megatron_cfg.moe_router_dtype {router}: pcc's Megatron trainer computes router logits "
                     "in FP32; the contract cannot state otherwise", f"{MEGATRON}.moe_router_dtype",
                     span=r.span(f"{MEGATRON}.moe_router_dtype"))
        kind = str(r.get(f"{MEGATRON}.optimizer.optimizer", "adam")).lower()
        if kind not in ("adam", "sgd"):
            imp.warn("PCC804", f"megatron_cfg.optimizer.optimizer {kind}: pcc states adam or sgd; written adam",
                     f"{MEGATRON}.optimizer.optimizer", span=r.span(f"{MEGATRON}.optimizer.optimizer"))
            kind = "adam"
        t["optimizer"] = {"kind": kind,
                          "distributed": bool(r.get(f"{MEGATRON}.optimizer.use_distributed_optimizer")),
                          "precision_aware": bool(r.get(f"{MEGATRON}.optimizer.use_precision_aware_optimizer"))}
        par = {k: _int(imp, r, f"{MEGATRON}.{key}") for k, key in (("tp", "tensor_model_parallel_size"),
                                                                  ("pp", "pipeline_model_parallel_size"),
                                                                  ("ep", "expert_model_parallel_size"),
                                                                  ("cp", "context_parallel_size"))}
        etp = _int(imp, r, f"{MEGATRON}.expert_tensor_parallel_size")
        if etp != 1:
            imp.warn("PCC804", f"megatron_cfg.expert_tensor_parallel_size {etp}: pcc's Megatron trainer splits routed "
                     "experts across EP ranks only (expert tensor parallel 1)", f"{MEGATRON}.expert_tensor_parallel_size",
                     span=r.span(f"{MEGATRON}.expert_tensor_parallel_size"))
        if r.get(f"{MEGATRON}.peft.enabled"):
            _megatron_lora(imp, r, catalog)
    else:
        t["rules"] = []
        t["master"] = "fp32"
        t["optimizer"] = {}
        par = {k: _int(imp, r, f"{DTENSOR}.{key}") for k, key in (("tp", "tensor_parallel_size"),
                                                                 ("cp", "context_parallel_size"))}
        if r.get(f"{DTENSOR}.lora_cfg.enabled"):
            imp.warn("PCC807", "dtensor_cfg.lora_cfg: NeMo RL's DTensor LoRA is not imported; the contract trains every "
                     "weight", f"{DTENSOR}.lora_cfg.enabled", span=r.span(f"{DTENSOR}.lora_cfg.enabled"))
    par = {k: n for k, n in par.items() if n != 1}
    if par:
        t["parallel"] = par
    imp.contract["trainer"] = t


# Megatron-Bridge's LoRA with no target_modules adapts every linear layer of the block: these (NeMo RL's
# docs/guides/lora.md, megatron_cfg.peft.target_modules).
MEGATRON_ALL_LINEAR = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def _megatron_lora(imp: Imported, r: _Recipe, catalog) -> None:
    """megatron_cfg.peft: LoRA over the frozen base, read backwards through the lowering's table
    (megatron_lora_modules: contract family -> the Megatron module it is in)."""
    at = f"{MEGATRON}.peft.target_modules"
    names = r.get(at) or list(MEGATRON_ALL_LINEAR)
    names = [names] if isinstance(names, str) else [str(n) for n in names]
    modules: dict[str, list[str]] = {}
    for family, name in tables()["megatron_lora_modules"].items():
        modules.setdefault(name, []).append(family)
    present = {op.family for op in catalog.operators}
    families: list[str] = []
    for name in names:
        if name not in modules:
            imp.warn("PCC807", f"megatron_cfg.peft.target_modules {name}: not a Megatron module pcc maps to contract "
                     "families (targets/nemo_rl.yaml megatron_lora_modules); not imported", at, span=r.span(at))
            continue
        families += [f for f in modules[name] if f in present and f not in families]
    if not families:
        imp.warn("PCC807", "megatron_cfg.peft: adapts no module pcc states; the contract trains every weight",
                 f"{MEGATRON}.peft.enabled", span=r.span(f"{MEGATRON}.peft.enabled"))
        return
    for key in ("exclude_modules",):
        if r.get(f"{MEGATRON}.peft.{key}"):
            imp.warn("PCC807", f"megatron_cfg.peft.{key} {r.get(f'{MEGATRON}.peft.{key}')}: not imported; the "
                     "contract adapts those modules", f"{MEGATRON}.peft.{key}", span=r.span(f"{MEGATRON}.peft.{key}"))
    t = {"kind": "lora", "rank": _int(imp, r, f"{MEGATRON}.peft.dim"),
         "alpha": float(r.get(f"{MEGATRON}.peft.alpha")), "targets": families}
    drop = r.get(f"{MEGATRON}.peft.dropout")
    if drop:
        t["dropout"] = float(drop)
    imp.contract["trainable"] = t
    imp.warn("PCC804", "megatron_cfg.peft.enabled: NeMo RL refits the policy's weights with the adapter merged in "
             "(docs/guides/lora.md); pcc states a LoRA job's sync as 'adapter' (a full-weight sync of a frozen base is "
             "PCC401)", "sync", span=r.span(f"{MEGATRON}.peft.enabled"), file=_file(r, f"{MEGATRON}.peft.enabled"))


def _objective(imp: Imported, r: _Recipe) -> None:
    c = imp.contract
    if r.get(f"{LOSS}.use_importance_sampling_correction"):
        kind = r.get(f"{LOSS}.truncated_importance_sampling_type")
        hi = r.get(f"{LOSS}.truncated_importance_sampling_ratio")
        lo = r.get(f"{LOSS}.truncated_importance_sampling_ratio_min")
        at = f"{LOSS}.truncated_importance_sampling_type"
        if kind is None or hi is None:
            imp.warn("PCC804", "loss_fn.use_importance_sampling_correction without truncated_importance_sampling_type "
                     "and ratio: NeMo RL weights by the untruncated importance ratio, which pcc's correction cannot "
                     "state (tis and mis are truncated); the contract states no correction",
                     f"{LOSS}.use_importance_sampling_correction",
                     span=r.span(f"{LOSS}.use_importance_sampling_correction"))
        elif kind == "tis":
            c["correction"] = {"kind": "tis", "clip": float(hi)}
        elif kind == "icepop" and lo is not None:
            c["correction"] = {"kind": "mis", "clip": float(hi), "low": float(lo)}
        else:
            imp.warn("PCC804", f"loss_fn.truncated_importance_sampling_type {kind}: pcc's correction states NeMo RL's "
                     "token-level tis and icepop (with a ratio_min) only; the contract states no correction", at,
                     span=r.span(at))
    if r.get(f"{LOSS}.sequence_level_importance_ratios"):
        imp.warn("PCC804", "loss_fn.sequence_level_importance_ratios: pcc's correction is token-level here",
                 f"{LOSS}.sequence_level_importance_ratios", span=r.span(f"{LOSS}.sequence_level_importance_ratios"))
    if r.get("policy.router_replay.enabled"):
        c["routing_replay"] = "r3"
    if r.get("grpo.async_grpo.enabled"):
        age = r.get("grpo.async_grpo.max_trajectory_age_steps")
        inflight = bool(r.get("grpo.async_grpo.in_flight_weight_updates"))
        imp.warn("PCC804", f"grpo.async_grpo.enabled: NeMo RL's async GRPO trains on trajectories up to {age} "
                 f"step(s) old (async_grpo.max_trajectory_age_steps {age}, async_grpo.in_flight_weight_updates "
                 f"{str(inflight).lower()}); pcc lowers NeMo RL's synchronous GRPO only "
                 "(sync schedule async is PCC634 there); written schedule colocated", "grpo.async_grpo.enabled",
                 span=r.span("grpo.async_grpo.enabled"), file=_file(r, "grpo.async_grpo.enabled"))
    if r.get("policy.generation.colocated.enabled") is False:
        imp.warn("PCC804", "policy.generation.colocated.enabled false: pcc states NeMo RL's colocated GRPO only; "
                 "written schedule colocated", "policy.generation.colocated.enabled",
                 span=r.span("policy.generation.colocated.enabled"))
    c["sync"] = {"schedule": "colocated"}
    if c.get("trainable", {}).get("kind") == "lora":
        c["sync"]["moves"] = "adapter"


def _file(r: _Recipe, key: str) -> str | None:
    """The file that writes `key` (the recipe, or a base of it), None where no file of the chain does."""
    span = r.span(key)
    return span.file if span else None


def _check_keys(imp: Imported, r: _Recipe) -> None:
    """The recipe's own keys against NeMo RL's (the pinned base recipes' keys, the config classes'
    fields, read_keys): PCC810 for one it does not have. Then every key of the merged recipe (its own,
    its bases') that carries precision, that the import did not read and whose value differs from the
    base recipe pcc's launch.sh puts under the contract's recipe: PCC807, at the file that writes it."""
    tab = _keys_table()
    known = set().union(*(set(v) for v in tab["recipes"].values())) | set(tables().get("read_keys", {}))
    fields = set().union(*(set(v) for v in tab["classes"].values()))
    sections = {k.rsplit(".", n)[0] for k in known for n in range(1, k.count(".") + 1)}
    unknown = set()
    for key in sorted(r.own):
        if "[" in key or key in ("", "defaults") or _FREE.search(key):
            continue
        if key in sections and key not in known:
            continue
        leaf = key.rsplit(".", 1)[-1]
        if key not in known and leaf not in fields and key not in sections:
            near = difflib.get_close_matches(leaf, fields, 1)
            imp.warn("PCC810", f"{key}: NeMo RL {tables()['version']}'s recipes and config classes have no such key",
                     key, span=r.span(key), hint=f"did you mean {near[0]}?" if near else None)
            unknown.add(key)
    engine = "megatron" if r.values.get(f"{MEGATRON}.enabled") else "fsdp"
    launched = tab["recipes"][tables()["base_config"][engine]]
    for key in sorted(r.values):
        if key in unknown or key in r.read or "[" in key or _FREE.search(key) or not PRECISION.search(key):
            continue
        if key in launched and launched[key] == r.values.get(key):
            continue
        switch = key.rsplit(".", 1)[0] + ".enabled"  # a section NeMo RL does not read (peft, lora_cfg off)
        if key != switch and r.values.get(switch) is False and launched.get(switch) is False:
            continue
        span = r.span(key)
        imp.warn("PCC807", f"{key} {r.values.get(key)}: a NeMo RL key that carries precision and that pcc has no "
                 "field for; the contract does not state it" + ("" if key in r.own else
                 f" (the recipe inherits it from {Path(span.file).name if span else r.base})"), key, span=span,
                 file=_file(r, key))
    # A precision key the recipe's chain does not set and the launch base does: the round trip runs the base's.
    for key in sorted(set(launched) - set(r.values)):
        if key in r.read or "[" in key or _FREE.search(key) or not PRECISION.search(key):
            continue
        if launched[key] in (None, False, "", []):  # NeMo RL reads an absent key as unset
            continue
        switch = key.rsplit(".", 1)[0] + ".enabled"
        if key != switch and launched.get(switch) is False and not r.values.get(switch):
            continue
        imp.warn("PCC807", f"{key}: the recipe does not set this NeMo RL key that carries precision; the base recipe "
                 f"pcc's launch.sh puts under the contract ({tables()['base_config'][engine]}) sets it to "
                 f"{launched[key]!r}, and the contract does not state it", key)
