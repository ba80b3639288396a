"""`pcc import checkpoint SOURCE`: a checkpoint's own quantization config as rollout rules.

SOURCE is a checkpoint directory (config.json's `quantization_config`, else
hf_quant_config.json), a config.json, an hf_quant_config.json, or a bare
`quantization_config` object. The method decides whose matching rules apply (matching.py);
the operators they quantize become `rollout sglang { <families> : S  keep bf16 : <exceptions> }`
(`rollout vllm` for a ModelOpt MIXED_PRECISION export, which vLLM serves: modelopt_mixed.py),
proved exact against pcc's own resolver before anything is written.
"""

from __future__ import annotations

import os
import re
from bisect import bisect_left, bisect_right
from contextlib import nullcontext
from functools import cached_property
from itertools import accumulate
from pathlib import Path

from pcc.importer import Imported, ImportFailed, contract_name, read_json
from pcc.importer.bounds import MAX_INT, Budget, count, kind_of, names, pattern, said
from pcc.importer.matching import (_MLA_FUSED_PARTS, FusedDisagreement, SglangModule, _modelopt_regex, ct_classes,
                                   ct_match_name, ct_matched_targets, modelopt_excluded, modelopt_exclusions,
                                   module_name, normalized_fp8_ignores, sglang_module, sglang_skipped, uncataloged)
from pcc.importer.rules import component_rules, scheme_name
from pcc.models import Catalog
from pcc.models.base import inside
from pcc.plan.patterns import LINEAR

# Families SGLang's fp8/modelopt/mxfp4 loaders can quantize (LinearBase and FusedMoE modules;
# ModelOpt also ParallelLMHead). Routers are built without a quant config, embeddings and norms
# are never quantized by these methods.
_SGLANG_LINEAR = set(LINEAR)
# A ModelOpt entry without regex syntax (`.` is escaped, so it is literal): it fullmatches only itself.
_LITERAL = re.compile(r"[^\\^$*+?{}\[\]|()]*")
SUPPORTED = "fp8 / mxfp8 (block or per-tensor), compressed-tensors, modelopt (NVFP4, FP8, MIXED_PRECISION), mxfp4 (gpt-oss)"


def read_quant_config(source: str) -> tuple[dict, str, str | None]:
    """(quantization config, the file it came from, the checkpoint directory if SOURCE is one). A
    FIFO or a device is PCC109 (pcc.lang.inputs), never "no such file"."""
    p = Path(source)
    if p.is_dir():
        found = dir_quant_config(p)
        if found is None:
            raise ImportFailed(f"{p}: no quantization_config in config.json and no hf_quant_config.json: "
                               "the checkpoint is not quantized", file=str(p))
        return found
    if not os.path.lexists(p):
        raise ImportFailed(f"{source}: no such file or checkpoint directory", file=source)
    data = read_json(p, "quantization config")
    for key in ("quantization_config", "compression_config"):
        if isinstance(data.get(key), dict):
            return data[key], str(p), None
    return data, str(p), None


def dir_quant_config(p: Path) -> tuple[dict, str, str] | None:
    """A checkpoint directory's quantization config (config.json's, else hf_quant_config.json), as
    read_quant_config gives it; None when the checkpoint is not quantized. Its files are read inside
    it only (a link out of it is PCC211, as the models stage refuses it)."""
    cfg_file = p / "config.json"
    if os.path.lexists(cfg_file):
        config = read_json(inside(p, cfg_file.name), "config.json")
        for c in (config, config.get("text_config")):
            for key in ("quantization_config", "compression_config"):
                if isinstance(c, dict) and isinstance(c.get(key), dict):
                    return c[key], str(cfg_file), str(p)
    hf = p / "hf_quant_config.json"
    if os.path.lexists(hf):
        return read_json(inside(p, hf.name), "hf_quant_config.json"), str(hf), str(p)
    return None


def load_model(model: str | None, checkpoint_dir: str | None, named: tuple[str, str] | None = None
               ) -> tuple[Catalog, dict]:
    """The catalog to resolve against and the contract's `model` statement; `named`: (the source's
    field, its value) where the source names a checkpoint that is not a directory here."""
    from pcc.diff.load import model_catalog

    spec = model or checkpoint_dir
    if spec is None:
        said = (f"the source's {named[0]} {named[1]} is no checkpoint directory here" if named and named[1]
                else "the source names no model")
        raise ImportFailed(f"{said}: pass --model with a checkpoint directory or a catalog name",
                           hint="e.g. --model qwen3_30b_a3b, or --model path/to/checkpoint")
    catalog = model_catalog(spec)
    ref = {"path": str(Path(spec).resolve())} if Path(spec).is_dir() else {"catalog": spec}
    return catalog, ref


def method_of(qc: dict, file: str) -> str:
    qm = str(qc.get("quant_method", "")).lower()
    if qm in ("fp8", "mxfp8"):
        return "fp8"
    if qm == "mxfp4":
        return "mxfp4"
    if qm == "compressed-tensors":
        return "compressed-tensors"
    if qm == "modelopt" or "quant_algo" in qc or isinstance(qc.get("quantization"), dict):
        return "modelopt"
    raise ImportFailed(f"{file}: quant_method {qc.get('quant_method')!r} is not one pcc imports ({SUPPORTED})",
                       path="quant_method", file=file)


class Decided:
    """What a method decides: operator index -> scheme name, the schemes it defines, KV cache."""

    def __init__(self):
        self.scheme: dict[int, str] = {}
        self.defs: dict[str, dict] = {}
        self.kv: str | None = None
        self.engine = "sglang"  # the rollout engine whose loader decided it (vLLM for ModelOpt MIXED_PRECISION)


def import_checkpoint(source: str, model: str | None, hardware: str | None = None) -> Imported:
    qc, file, ckpt = read_quant_config(source)
    catalog, ref = load_model(model, ckpt)
    imp = Imported({"name": contract_name(source), "model": ref}, source=file)
    rollout_rules(imp, catalog, decide_config(qc, file, catalog, imp))
    finish(imp, catalog, hardware)
    return imp


def decide_config(qc: dict, file: str, catalog: Catalog, imp: Imported) -> Decided:
    """What the config decides per operator, by its method's own rules (launch imports call this
    for the checkpoint their rollout loads), its patterns within the import's budget (bounds.py)."""
    return {"fp8": _fp8, "mxfp4": _mxfp4, "compressed-tensors": _compressed_tensors,
            "modelopt": _modelopt}[method_of(qc, file)](qc, catalog, imp, file, Budget(file))


# -- the methods ----------------------------------------------------------------------------------

def _sglang_modules(catalog: Catalog, families: set[str]) -> dict[str, tuple[SglangModule, list[int]]]:
    """SGLang module prefix -> (module, the operators it runs), for operators of `families`."""
    out: dict[str, tuple[SglangModule, list[int]]] = {}
    for i, op in enumerate(catalog.operators):
        if op.family in families:
            m = sglang_module(op)
            out.setdefault(m.prefix, (m, []))[1].append(i)
    return out


def _all_paths(catalog: Catalog) -> list[str]:
    """Every module path of the model and the SGLang prefixes, for 'matches nothing' checks."""
    names = {module_name(op) for op in catalog.operators if op.family != "kv_cache"}
    names |= {sglang_module(op).prefix for op in catalog.operators if op.family != "kv_cache"}
    return sorted(names)


def _fp8(qc: dict, catalog: Catalog, imp: Imported, file: str, budget: Budget) -> Decided:
    """SGLang `Fp8Config.from_config` + `get_quant_method` (fp8.py)."""
    mx = "mxfp8" in str(qc.get("quant_method"))
    if "activation_scheme" not in qc:
        raise ImportFailed(f"{file}: quant_method fp8 without activation_scheme (SGLang requires it)",
                           path="activation_scheme", file=file)
    act = qc["activation_scheme"]
    block = qc.get("weight_block_size")
    if mx:
        if block not in (None, [1, 32]):
            imp.warn("PCC806", f"weight_block_size {said(block)}: SGLang's mxfp8 method always uses [1, 32]",
                     "weight_block_size")
        spec, stem = {"format": "mxfp8"}, "mxfp8"
    elif block is not None:
        if not (isinstance(block, list) and len(block) == 2 and all(map(_positive, block))):
            raise ImportFailed(f"{file}: weight_block_size {said(block)} is not [rows, cols] of positive integers "
                               "(true and false are no numbers)", path="weight_block_size", file=file)
        if act != "dynamic":
            raise ImportFailed(f"{file}: block FP8 with activation_scheme {said(act)}: SGLang runs block scales with "
                               "dynamic activations only", path="activation_scheme", file=file)
        r, c = block
        spec = {"format": "fp8_e4m3", "weights": {"kind": "block", "rows": r, "cols": c},
                "activations": {"kind": "tile", "rows": 1, "cols": c}}
        stem = f"fp8_block{r}x{c}"
        if qc.get("scale_fmt") == "ue8m0":
            spec["scale"], stem = "pow2", stem + "_pow2"
    else:
        spec, stem = {"format": "fp8_e4m3", "grouping": {"kind": "tensor"}}, "fp8_tensor"
        if act == "static":
            imp.warn("PCC804", "activation_scheme static: the checkpoint's calibrated input_scale is used; pcc's "
                     "per-tensor FP8 scheme states the grouping, not where the activation scale comes from",
                     "activation_scheme")
    if qc.get("fmt") not in (None, "e4m3"):
        imp.warn("PCC804", f"fmt {said(qc['fmt'])}: SGLang ignores fmt and reads E4M3 weights", "fmt")
    name = _define(imp, spec, stem)
    key = "ignored_layers" if qc.get("ignored_layers") else "modules_to_not_convert"
    entries = names(qc.get(key), key, file, "an exclusion list")
    if qc.get("ignored_layers") and qc.get("modules_to_not_convert"):
        imp.warn("PCC806", "both ignored_layers and modules_to_not_convert: SGLang reads ignored_layers only",
                 "modules_to_not_convert")
    d = Decided()
    _unmatched_sglang(imp, _Paths(catalog), catalog, entries, key)
    listed = _Listed(normalized_fp8_ignores(entries))
    for prefix, (module, idx) in _sglang_modules(catalog, _SGLANG_LINEAR).items():
        try:
            skipped = sglang_skipped(module, listed.naming(module))
        except FusedDisagreement as exc:
            raise ImportFailed(f"{file}: {exc}", path=key, file=file) from None
        if not skipped:
            d.scheme.update(dict.fromkeys(idx, name))
    _expert_entries(imp, catalog, listed, _Listed(entries), key)
    d.kv = _kv_algo(qc.get("kv_cache_quant_algo"))
    return d


def _mxfp4(qc: dict, catalog: Catalog, imp: Imported, file: str, budget: Budget) -> Decided:
    """SGLang `Mxfp4Config` (mxfp4.py): every FusedMoE layer is MXFP4, every Linear stays wide;
    `from_config` never passes `modules_to_not_convert` on."""
    name = _define(imp, {"format": "mxfp4"}, "mxfp4")
    d = Decided()
    for i, op in enumerate(catalog.operators):
        if op.family.startswith("experts."):
            d.scheme[i] = name
    if not d.scheme:
        raise ImportFailed(f"{file}: quant_method mxfp4 quantizes routed experts only, and {catalog.name} has none",
                           path="quant_method", file=file)
    key = "modules_to_not_convert"
    entries = names(qc.get(key), key, file, "an exclusion list")
    if entries:
        imp.warn("PCC806", "modules_to_not_convert: SGLang's mxfp4 method ignores it (it quantizes every routed "
                 "expert and nothing else); the imported rules say what SGLang runs", "modules_to_not_convert")
    paths = _Paths(catalog)
    _globs(entries, key, file, paths, parts=False)
    moe = sorted({sglang_module(op).prefix for op in catalog.operators if op.family.startswith("experts.")})
    for k, e in enumerate(entries):
        with _timed(budget, f"{key}[{k}]", e):
            hit = paths.glob_match(e)
            experts = hit and any(_glob_prefix(e, p) for p in moe)
        if not hit:
            imp.warn("PCC802", f"modules_to_not_convert[{k}] {e!r} matches no module of {catalog.name}",
                     f"modules_to_not_convert[{k}]")
        elif experts:
            imp.warn("PCC803", f"modules_to_not_convert[{k}] {e!r} names routed experts, which SGLang's mxfp4 "
                     "method quantizes anyway", f"modules_to_not_convert[{k}]")
    return d


def _modelopt(qc: dict, catalog: Catalog, imp: Imported, file: str, budget: Budget) -> Decided:
    """SGLang `ModelOptFp4Config.from_config` / `ModelOptFp8Config` and `_get_quant_method`
    (modelopt_quant.py): Linear and LM head excluded by `is_layer_skipped` or
    `is_layer_excluded`, FusedMoE by `is_layer_excluded` only."""
    nested = "quant_algo" not in qc and isinstance(qc.get("quantization"), dict)
    q = qc["quantization"] if nested else qc
    algo = q.get("quant_algo")
    where = "quantization." if nested else ""
    if nested:
        key, kv_raw = "exclude_modules", q.get("kv_cache_quant_algo")
        entries = names(q.get(key), where + key, file, "an exclusion list")
    else:
        present = [k for k in ("ignore", "modules_to_not_convert", "exclude_modules") if k in q]
        key = present[0] if present else "ignore"
        lists = {k: names(q[k], k, file, "an exclusion list") for k in present}
        entries = lists.get(key, [])
        if len({tuple(v) for v in lists.values()}) > 1:
            imp.warn("PCC806", f"{' and '.join(present)} differ: SGLang reads {key} only", key)
        kv_raw = q.get("kv_cache_scheme") or q.get("kv_cache_quant_algo")
    if algo == "NVFP4":
        group = q.get("group_size", 16)
        if group != 16:
            raise ImportFailed(f"{file}: NVFP4 group_size {group}: NVFP4 scales groups of 16", path=where + "group_size",
                               file=file)
        name = _define(imp, {"format": "nvfp4"}, "nvfp4")
    elif algo == "FP8":
        name = _define(imp, {"format": "fp8_e4m3", "grouping": {"kind": "tensor"}}, "fp8_tensor")
        imp.warn("PCC804", "ModelOpt FP8 uses the checkpoint's calibrated input_scale; pcc's per-tensor FP8 scheme "
                 "states the grouping, not where the activation scale comes from", where + "quant_algo")
    elif algo == "MIXED_PRECISION":
        from pcc.importer.modelopt_mixed import decide_mixed

        return decide_mixed(q, catalog, imp, file, where, _SGLANG_LINEAR | {"lm_head"}, _define, Decided)
    else:
        raise ImportFailed(f"{file}: ModelOpt quant_algo {algo!r}: pcc imports NVFP4, FP8 and MIXED_PRECISION", path=where + "quant_algo",
                           file=file)
    d = Decided()
    paths = _Paths(catalog)
    _globs(entries, where + key, file, paths, parts=True)
    _unmatched_sglang(imp, paths, catalog, entries, where + key, budget, modelopt=True)
    listed = _Listed(modelopt_exclusions(entries))
    for prefix, (module, idx) in _sglang_modules(catalog, _SGLANG_LINEAR | {"lm_head"}).items():
        try:
            with budget.matching(f"{where + key} (deciding {prefix})"):
                excluded = (not module.moe and sglang_skipped(module, listed.naming(module))) or modelopt_excluded(
                    prefix, listed.modelopt_naming(prefix))
        except FusedDisagreement as exc:
            raise ImportFailed(f"{file}: {exc}", path=where + key, file=file) from None
        if not excluded:
            d.scheme.update(dict.fromkeys(idx, name))
    d.kv = _kv_algo(kv_raw)
    return d


def _compressed_tensors(qc: dict, catalog: Catalog, imp: Imported, file: str, budget: Budget) -> Decided:
    """compressed-tensors `apply_quantization_config` (quantization/lifecycle/apply.py) with its
    matchers (utils/match.py)."""
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ImportFailed(f"{file}: compressed-tensors config without config_groups", path="config_groups", file=file)
    target_group: dict[str, str] = {}
    schemes: dict[str, str] = {}
    labelled: list[tuple[str, str]] = []  # (where, entry) of every target and ignore entry
    for gname, g in groups.items():
        if not isinstance(g, dict) or not isinstance(g.get("targets"), list):
            raise ImportFailed(f"{file}: config_groups.{gname} has no targets list", path=f"config_groups.{gname}",
                               file=file)
        schemes[gname] = _define(imp, _ct_scheme(g, gname, imp, file), _ct_stem(g, gname))
        at = f"config_groups.{gname}.targets"
        for k, t in enumerate(names(g["targets"], at, file, "a targets list")):
            if t in target_group:
                imp.warn("PCC803", f"target {t!r} is in config_groups {target_group[t]} and {gname}: compressed-tensors "
                         f"keeps the later ({gname})", at)
            target_group[t] = gname
            labelled.append((f"{at}[{k}]", t))
    ignore = names(qc.get("ignore"), "ignore", file, "an ignore list")
    labelled += [(f"ignore[{k}]", e) for k, e in enumerate(ignore)]
    ops = [(i, op, module_name(op), ct_classes(op, catalog)) for i, op in enumerate(catalog.operators)
           if op.family != "kv_cache"]
    hits = _ct_regex_hits(budget, file, labelled, [name for _, _, name, _ in ops])
    re_targets = [t for t in target_group if t in hits]
    re_ignores = [e for e in dict.fromkeys(ignore) if e in hits]
    ignored = set(ignore)
    order = list(groups)
    d = Decided()
    target_hits: set[str] = set()
    ignore_hits: set[str] = set()
    for i, op, name, classes in ops:
        # only the targets that can match (the name itself, its classes, the regexes that matched it):
        # compressed-tensors' order over them is its order over all
        maybe = [t for t in (name, *classes) if t in target_group] + [t for t in re_targets if name in hits[t]]
        matched = ct_matched_targets(name, classes, list(dict.fromkeys(maybe)))
        if not matched:
            continue
        quantizable = bool(set(classes) & {"Linear", "Embedding"}) or op.family == "other"
        if quantizable:
            target_hits.update(matched)
        hit_ignores = [e for e in (name, *classes) if e in ignored] + [e for e in re_ignores if name in hits[e]]
        if hit_ignores:
            ignore_hits.update(hit_ignores)
            continue
        if not quantizable:
            continue
        chosen = target_group[matched[0]]
        if op.family == "other":
            imp.warn("PCC804", f"{op.tensor}: compressed-tensors quantizes it ({chosen}) but pcc has no operator family "
                     "for it, so the contract keeps it wide", "ignore")
            continue
        d.scheme[i] = schemes[chosen]
        last = max({target_group[t] for t in matched}, key=order.index)
        if last != chosen:
            imp.warn("PCC803", f"{name}: matched by config_groups {', '.join(sorted({target_group[t] for t in matched}))}; "
                     f"compressed-tensors applies {chosen} (target {matched[0]!r}: exact names, then regexes, then "
                     f"classes, each alphabetically), not the later group {last}", f"config_groups.{chosen}.targets")
    for t in target_group:
        if t not in target_hits:
            imp.warn("PCC802", f"target {t!r} matches no Linear or Embedding module of {catalog.name}",
                     f"config_groups.{target_group[t]}.targets", hint=_ct_hint(t))
    for k, e in enumerate(ignore):
        if e not in ignore_hits:
            imp.warn("PCC802", f"ignore[{k}] {e!r} excludes nothing a target selects in {catalog.name} "
                     "(compressed-tensors says nothing about it)", f"ignore[{k}]", hint=_ct_hint(e))
    kv = qc.get("kv_cache_scheme")
    if isinstance(kv, dict):
        if kv.get("type") == "float" and kv.get("num_bits") == 8:
            d.kv = "fp8_e4m3"
        else:
            imp.warn("PCC804", f"kv_cache_scheme {kv}: pcc imports FP8 KV caches only; the KV cache stays wide",
                     "kv_cache_scheme")
    return d


def _ct_regex_hits(budget: Budget, file: str, labelled: list[tuple[str, str]], modules: list[str]
                   ) -> dict[str, set[str]]:
    """Each `re:` entry -> the module names it matches (compressed-tensors' `match_name`), found once and
    entry by entry within the budget, so that a pattern that backtracks is named; the per-module
    decisions look them up instead of matching again."""
    regexes = [(at, e) for at, e in labelled if e.startswith("re:")]
    count("config_groups targets and ignore", file, len({e for _, e in regexes}), len(modules))
    hits: dict[str, set[str]] = {}
    for at, e in regexes:
        pattern(e, at, file, re.compile, e[3:])
        if e not in hits:
            with budget.matching(f"{at} {e!r}"):
                hits[e] = {name for name in modules if ct_match_name(name, e)}
    return hits


def _ct_hint(entry: str) -> str:
    if entry.startswith("re:"):
        return "'re:' patterns use re.match: anchored at the start of the module name, not at its end"
    return "a plain entry is an exact module name (or a torch class name such as Linear); use 're:' for patterns"


def _ct_stem(g: dict, gname: str) -> str:
    w = g.get("weights") or {}
    bits, kind = w.get("num_bits"), w.get("type")
    size = w.get("group_size")
    a = f"a{g['input_activations'].get('num_bits')}" if g.get("input_activations") else "a16"
    return f"{gname}_{'w' if kind == 'int' else 'f'}{bits}{a}" + (f"_g{size}" if size else "")


def _ct_grouping(args: dict, fmt: str, role: str, where: str, file: str) -> dict:
    strategy = args.get("strategy")
    if strategy == "tensor":
        return {"kind": "tensor"}
    if strategy == "channel":
        return {"kind": "row"}
    if strategy == "token":
        return {"kind": "token"}
    if strategy == "block":
        block = args.get("block_structure")
        if not (isinstance(block, list) and len(block) == 2 and all(map(_positive, block))):
            raise ImportFailed(f"{file}: {where}.block_structure {said(block)} is not [rows, cols] of positive "
                               "integers (true and false are no numbers)", path=f"{where}.block_structure", file=file)
        return {"kind": "block", "rows": block[0], "cols": block[1]}
    if strategy in ("group", "tensor_group"):
        size = args.get("group_size")
        if not _positive(size):
            raise ImportFailed(f"{file}: {where}.group_size {said(size)} is not a positive integer (true and false "
                               "are no numbers)", path=f"{where}.group_size", file=file)
        if fmt == "fp8_e4m3" and role == "activations":
            return {"kind": "tile", "rows": 1, "cols": size}
        return {"kind": "group", "size": size}
    raise ImportFailed(f"{file}: {where}: strategy {said(strategy)} has no pcc grouping", path=where, file=file)


def _ct_format(args: dict, where: str, file: str) -> str:
    kind, bits, size = args.get("type"), args.get("num_bits"), args.get("group_size")
    if kind == "int" and bits in (4, 8):
        return f"int{bits}"
    if kind == "float" and bits == 8:
        return "fp8_e4m3"
    if kind == "float" and bits == 4:
        if args.get("strategy") == "tensor_group" and size == 16:
            return "nvfp4"
        if size == 32:
            return "mxfp4"
    raise ImportFailed(f"{file}: {where}: {kind} {bits}-bit (strategy {args.get('strategy')}, group {size}) has no pcc "
                       "format", path=where, file=file)


def _ct_scheme(g: dict, gname: str, imp: Imported, file: str) -> dict:
    w, a = g.get("weights"), g.get("input_activations")
    base = f"config_groups.{gname}"
    if not isinstance(w, dict):
        raise ImportFailed(f"{file}: {base} quantizes no weights; pcc imports weight schemes", path=base + ".weights",
                           file=file)
    if a is not None and not isinstance(a, dict):
        raise ImportFailed(f"{file}: {base}.input_activations is {kind_of(a)}; compressed-tensors takes a mapping "
                           "(or null)", path=base + ".input_activations", file=file)
    fmt = _ct_format(w, base + ".weights", file)
    spec: dict = {"format": fmt, "weights": _ct_grouping(w, fmt, "weights", base + ".weights", file)}
    if w.get("symmetric") is False:
        spec["symmetric"] = False
    if w.get("actorder"):
        imp.warn("PCC804", f"{base}.weights.actorder {w['actorder']!r}: pcc has no activation-order permutation; "
                 "the imported scheme groups columns in storage order", base + ".weights.actorder")
    if isinstance(a, dict):
        afmt = _ct_format(a, base + ".input_activations", file)
        if afmt != fmt:
            raise ImportFailed(f"{file}: {base} has {fmt} weights and {afmt} activations; a pcc scheme has one format",
                               path=base + ".input_activations", file=file)
        spec["activations"] = _ct_grouping(a, fmt, "activations", base + ".input_activations", file)
        if a.get("dynamic") is False and fmt != "nvfp4":
            imp.warn("PCC804", f"{base}.input_activations are static (calibrated scales): pcc states the grouping, "
                     "not where the activation scale comes from", base + ".input_activations.dynamic")
    elif fmt in ("fp8_e4m3", "nvfp4", "int8"):
        spec["activations"] = None
    if g.get("output_activations"):
        imp.warn("PCC804", f"{base}.output_activations: pcc has no output quantization; ignored",
                 base + ".output_activations")
    return spec


# -- shared ---------------------------------------------------------------------------------------

def _define(imp: Imported, spec: dict, stem: str) -> str:
    """The scheme's name in the contract: a preset when it is one, else a definition."""
    from pydantic import ValidationError

    try:
        name, definition = scheme_name(spec, stem.replace(".", "_"))
    except ValidationError as exc:
        raise ImportFailed(f"the source's scheme {spec} is not a valid pcc scheme: "
                           f"{exc.errors()[0]['msg']}", file=imp.source) from None
    if definition is not None:
        imp.contract.setdefault("schemes", {})[name] = definition
    return name


def _kv_algo(value) -> str | None:
    text = str(value or "").upper()
    if text in ("FP8", "FLOAT8"):
        return "fp8_e4m3"
    if text in ("NVFP4", "FP4", "FLOAT4"):
        return "nvfp4"
    if isinstance(value, dict) and value.get("type") == "float" and value.get("num_bits") == 8:
        return "fp8_e4m3"
    return None


def _positive(v) -> bool:
    """A positive integer; JSON's true and false are no numbers (Python counts them as 1 and 0)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_INT


class _Listed:
    """An exclusion list indexed for SGLang's rules, so that a list of 200k names costs lookups per
    module rather than a scan: the entries each dotted run of a module path names, those naming
    experts (searched as one text), and (ModelOpt) the entries with regex syntax. SGLang's verdict
    over `naming(m)` / `modelopt_naming(p)` is its verdict over the whole list."""

    def __init__(self, entries: list[str]):
        self.by_run: dict[str, list[str]] = {}
        for e in entries:
            self.by_run.setdefault(e.rstrip("."), []).append(e)
        self._entries = entries
        self._experts = [e for e in entries if "experts" in e]
        self._text = "\n".join(self._experts)
        self._starts = list(accumulate((len(e) + 1 for e in self._experts[:-1]), initial=0))

    def runs_of(self, path: str) -> list[str]:
        """The entries `_module_path_match` can match with `path`: those naming one of its dotted runs."""
        bits = path.split(".")
        return [e for i in range(len(bits)) for j in range(i + 1, len(bits) + 1)
                for e in self.by_run.get(".".join(bits[i:j]), ())]

    def containing(self, prefix: str) -> list[str]:
        """The entries naming experts that contain `prefix` (SGLang's FusedMoE substring rule), in order."""
        out, at = [], self._text.find(prefix)
        while at >= 0:
            k = bisect_right(self._starts, at) - 1
            out.append(self._experts[k])
            at = self._text.find(prefix, self._starts[k] + len(self._experts[k]))
        return out

    def naming(self, module: SglangModule) -> list[str]:
        found = [e for p in (module.prefix, *module.shards) for e in self.runs_of(p)]
        return found + self.containing(module.prefix) if module.moe else found

    @cached_property
    def literal(self) -> set[str]:
        return {e for e in self._entries if _LITERAL.fullmatch(e)}

    @cached_property
    def patterns(self) -> list[str]:
        return [e for e in dict.fromkeys(self._entries) if e not in self.literal]

    @cached_property
    def mla(self) -> list[str]:
        return [e for e in dict.fromkeys(self._entries) if e.rsplit(".", 1)[-1] in _MLA_FUSED_PARTS]

    def modelopt_naming(self, prefix: str) -> list[str]:
        """The entries `is_layer_excluded(prefix)` can match: a literal one only equal to the prefix (or
        one dotted part of it), then the patterns and the MLA fused-part tails."""
        variants = [prefix] + ([prefix.removeprefix("language_model.")] if prefix.startswith("language_model.") else [])
        words = {w for v in variants for w in (v, *v.split("."))}
        return [w for w in words if w in self.literal] + self.patterns + self.mla


class _Paths:
    """Every module path of the model (checkpoint and SGLang names), their dotted ancestors and
    parts, so that 'which entry matches nothing' is set lookups; only patterns are matched."""

    def __init__(self, catalog: Catalog):
        self.paths = _all_paths(catalog)
        self.ancestors: set[str] = set()
        self.parts: set[str] = set()
        for p in self.paths:
            bits = p.split(".")
            self.parts.update(bits)
            self.ancestors.update(".".join(bits[:k]) for k in range(1, len(bits) + 1))
        self.sorted = sorted(self.ancestors)

    def candidates(self, entry: str) -> list[str]:
        """The ancestors a pattern can fullmatch: those starting with its literal head (a published list
        names layers one by one, `model.layers.7.self_attn*`, so each pattern meets a few hundred of a
        large MoE's hundred thousand module paths, not all of them)."""
        head = _literal_head(entry)
        lo = bisect_left(self.sorted, head)
        hi = bisect_left(self.sorted, head + "\U0010ffff") if head else len(self.sorted)
        return self.sorted[lo:hi]

    @cached_property
    def runs(self) -> set[str]:
        """Every dotted run of every path (a dotted suffix of an ancestor), built when first asked."""
        out: set[str] = set()
        for a in self.ancestors:
            at = 0
            while at >= 0:
                out.add(a[at:])
                at = a.find(".", at) + 1 or -1
        return out

    def path_match(self, entry: str) -> bool:
        """Some module matches SGLang's `_module_path_match(entry, module)`."""
        e = entry.rstrip(".")
        return e in self.ancestors or e in self.runs

    def glob_match(self, entry: str, parts: bool = False) -> bool:
        """ModelOpt's regex form (`*` is `.*`) over whole module paths or their ancestors (and, with
        `parts`, single dotted parts, as ModelOpt's part-by-part check)."""
        if _LITERAL.fullmatch(entry):
            return entry in self.ancestors or (parts and entry in self.parts)
        rx = _modelopt_regex(entry)
        return (any(rx.fullmatch(a) for a in self.candidates(entry))
                or (parts and any(rx.fullmatch(x) for x in self.parts)))


def _literal_head(entry: str) -> str:
    """What every name a ModelOpt pattern (`*` is `.*`, the rest a regex) fullmatches starts with: its
    leading plain characters, less the last when a quantifier follows it; none where an alternation could
    start the match elsewhere."""
    if "|" in entry:
        return ""
    head = re.match(r"[A-Za-z0-9_.\-]*", entry).group()
    return head[:-1] if head and entry[len(head):len(head) + 1] in ("?", "+", "{") else head


def _globs(entries: list[str], key: str, file: str, paths: _Paths, parts: bool) -> None:
    """Every entry SGLang compiles as a regex (all but the literal ones) compiles, and the names they are
    matched against (each pattern's candidates, and with `parts` every dotted part) are few enough
    (bounds.py)."""
    globs = [(k, e) for k, e in enumerate(entries) if not _LITERAL.fullmatch(e)]
    for k, e in globs:
        pattern(e, f"{key}[{k}]", file, _modelopt_regex, e)
    count(key, file, len(globs), len(paths.ancestors) + parts * len(paths.parts),
          sum(len(paths.candidates(e)) + parts * len(paths.parts) for _, e in globs))


def _timed(budget: Budget | None, at: str, entry: str):
    """The budget's block for matching `entry` when SGLang reads it as a regex; nothing to time for a
    literal one (a lookup)."""
    if budget is None or _LITERAL.fullmatch(entry):
        return nullcontext()
    return budget.matching(f"{at} {entry!r}")


def _glob_prefix(entry: str, path: str) -> bool:
    """A `*` glob naming this module path or one of its ancestors."""
    rx, bits = _modelopt_regex(entry), path.split(".")
    return any(rx.fullmatch(".".join(bits[:k])) for k in range(1, len(bits) + 1))


def _unmatched_sglang(imp: Imported, paths: _Paths, catalog: Catalog, entries: list[str], key: str,
                      budget: Budget | None = None, modelopt: bool = False) -> None:
    """PCC802 for each entry that matches no module, but one naming what the config says the checkpoint has and
    catalogs leave out (the vision tower, the MTP layer): pcc carries those tensors as stored, so they stay
    unquantized, as the entry asks. Entry by entry, so that a pattern that never ends is named by the budget
    (ModelOpt's entries are regexes)."""
    for k, e in enumerate(entries):
        forms = modelopt_exclusions([e]) if modelopt else [e]
        with _timed(budget if modelopt else None, f"{key}[{k}]", e):
            hit = any(paths.path_match(f.removeprefix("model.")) or paths.path_match(f) or (
                modelopt and paths.glob_match(f, parts=True)) for f in forms)
        if not hit and not uncataloged(e, catalog.config):
            imp.warn("PCC802", f"{key}[{k}] {e!r} matches no module of {catalog.name}", f"{key}[{k}]",
                     hint="SGLang matches whole dotted names (or, for ModelOpt, '*' globs over the whole name or "
                          "one dotted part); the entry excludes nothing")



def _expert_entries(imp: Imported, catalog: Catalog, ignored: _Listed, entries: _Listed, key: str) -> None:
    """SGLang skips a whole FusedMoE layer when any entry naming experts contains its prefix:
    one listed expert keeps every expert of that layer wide (pcc would keep that one only)."""
    for prefix in _sglang_modules(catalog, {"experts.gate_up", "experts.down"}):
        by_substring = entries.containing(prefix)
        if by_substring and not ignored.runs_of(prefix):  # an entry naming the layer itself skips it anyway
            imp.warn("PCC803", f"{key} lists {by_substring[0]!r}; SGLang then keeps every routed expert of "
                     f"{prefix} wide (one FusedMoE module per layer), and so does the imported contract", key)


def rollout_rules(imp: Imported, catalog: Catalog, d: Decided) -> None:
    """The rollout block: the most common scheme over whole families, later rules for the others,
    `keep bf16` for the wide operators inside those families; checked exact by resolution."""
    rules = component_rules(catalog, d.scheme, ["rollout"])
    if d.kv:
        rules.append({"components": ["rollout"], "patterns": ["kv_cache"], "scheme": d.kv})
    imp.contract["rollout"] = {"engine": d.engine, "rules": rules}
    imp.decided = d  # what the source decides, for the exactness check in finish()


def finish(imp: Imported, catalog: Catalog, hardware: str | None) -> None:
    """Hardware (given, or the first that runs every format, warned), then prove the rules exact."""
    from pcc.contract.model import Contract
    from pcc.lang.build import SourceMap
    from pcc.lang.diagnostics import Reporter
    from pcc.plan.capabilities import hardware_table
    from pcc.plan.resolve import resolve

    if "hardware" not in imp.contract:
        if hardware is None:
            c = Contract.model_validate({**imp.contract})
            fmts = {s.format for s in (c.schemes.get(n) or _preset(n) for n in _rule_schemes(imp.contract)) if not s.wide}
            table = hardware_table()
            hardware = next((h for h, row in table.items() if row.get("vendor") != "any"
                             and fmts <= set(row.get("native", [])) | set(row.get("weight_only", []))), "cpu")
            imp.warn("PCC808", f"the source does not say which hardware runs it; the contract says {hardware}, the first "
                     f"in targets/hardware.yaml that runs {', '.join(sorted(fmts)) or 'bf16'}", "hardware",
                     hint="edit 'hardware' to the GPUs you run")
        imp.contract["hardware"] = hardware
    d = imp.decided
    if d is None:
        return
    contract = Contract.model_validate(imp.contract)
    rep = Reporter()
    plan = resolve(contract, catalog, SourceMap(), rep)
    wrong = [op.tensor for i, op in enumerate(catalog.operators)
             if op.family != "kv_cache" and (plan.scheme_name("rollout", i) if not plan.scheme("rollout", i).wide
                                             else None) != d.scheme.get(i)]
    if wrong:
        raise ImportFailed(f"internal: the imported rules decide {len(wrong)} operator(s) otherwise than the source, "
                           f"e.g. {wrong[0]}", code="PCC801")


def _preset(name: str):
    from pcc.contract.scheme import preset

    return preset(name)


def _rule_schemes(contract: dict) -> list[str]:
    return [r["scheme"] for sec in ("rollout", "trainer") for r in contract.get(sec, {}).get("rules", [])]

