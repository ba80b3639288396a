"""`pcc import checkpoint SOURCE`: a checkpoint's own quantization config as rollout rules.

SOURCE is a checkpoint directory (config.json's `quantization_config`, else
hf_quant_config.json), a config.json, an hf_quant_config.json, or a bare
`quantization_config` object. The method decides whose matching rules apply (matching.py);
the operators they quantize become `rollout sglang { <families> : S  keep bf16 : <exceptions> }`,
proved exact against pcc's own resolver before anything is written.
"""

from __future__ import annotations

from pathlib import Path

from pcc.importer import Imported, ImportFailed, contract_name, read_json
from pcc.importer.matching import (FusedDisagreement, SglangModule, ct_classes, ct_match_name,
                                   ct_matched_targets, modelopt_excluded, modelopt_exclusions, module_name,
                                   module_path_match, normalized_fp8_ignores, sglang_module, sglang_skipped)
from pcc.importer.rules import component_rules, scheme_name
from pcc.models import Catalog
from pcc.plan.patterns import LINEAR

# Families SGLang's fp8/modelopt/mxfp4 loaders can quantize (LinearBase and FusedMoE modules;
# ModelOpt also ParallelLMHead). Routers are built without a quant config, embeddings and norms
# are never quantized by these methods.
_SGLANG_LINEAR = set(LINEAR)
SUPPORTED = "fp8 / mxfp8 (block or per-tensor), compressed-tensors, modelopt (NVFP4, FP8), mxfp4 (gpt-oss)"


def read_quant_config(source: str) -> tuple[dict, str, str | None]:
    """(quantization config, the file it came from, the checkpoint directory if SOURCE is one)."""
    p = Path(source)
    if p.is_dir():
        cfg_file = p / "config.json"
        if cfg_file.is_file():
            config = read_json(cfg_file, "config.json")
            for c in (config, config.get("text_config") or {}):
                for key in ("quantization_config", "compression_config"):
                    if isinstance(c.get(key), dict):
                        return c[key], str(cfg_file), str(p)
        hf = p / "hf_quant_config.json"
        if hf.is_file():
            return read_json(hf, "hf_quant_config.json"), str(hf), str(p)
        raise ImportFailed(f"{p}: no quantization_config in config.json and no hf_quant_config.json: "
                           "the checkpoint is not quantized", file=str(p))
    if not p.is_file():
        raise ImportFailed(f"{source}: no such file or checkpoint directory", file=source)
    data = read_json(p, "quantization config")
    for key in ("quantization_config", "compression_config"):
        if isinstance(data.get(key), dict):
            return data[key], str(p), None
    return data, str(p), None


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


def import_checkpoint(source: str, model: str | None, hardware: str | None = None) -> Imported:
    qc, file, ckpt = read_quant_config(source)
    catalog, ref = load_model(model, ckpt)
    imp = Imported({"name": contract_name(source), "model": ref}, source=file)
    rollout_rules(imp, catalog, decide_config(qc, file, catalog, imp))
    finish(imp, catalog, hardware)
    return imp


def decide_config(qc: dict, file: str, catalog: Catalog, imp: Imported) -> Decided:
    """What the config decides per operator, by its method's own rules (launch imports call this
    for the checkpoint their rollout loads)."""
    return {"fp8": _fp8, "mxfp4": _mxfp4, "compressed-tensors": _compressed_tensors,
            "modelopt": _modelopt}[method_of(qc, file)](qc, catalog, imp, file)


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


def _fp8(qc: dict, catalog: Catalog, imp: Imported, file: str) -> Decided:
    """SGLang `Fp8Config.from_config` + `get_quant_method` (fp8.py)."""
    mx = "mxfp8" in str(qc.get("quant_method"))
    if "activation_scheme" not in qc:
        raise ImportFailed(f"{file}: quant_method fp8 without activation_scheme (SGLang requires it)",
                           path="activation_scheme", file=file)
    act = qc["activation_scheme"]
    block = qc.get("weight_block_size")
    if mx:
        if block not in (None, [1, 32]):
            imp.warn("PCC806", f"weight_block_size {block}: SGLang's mxfp8 method always uses [1, 32]",
                     "weight_block_size")
        spec, stem = {"format": "mxfp8"}, "mxfp8"
    elif block is not None:
        if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
            raise ImportFailed(f"{file}: weight_block_size {block!r} is not [rows, cols]", path="weight_block_size",
                               file=file)
        if act != "dynamic":
            raise ImportFailed(f"{file}: block FP8 with activation_scheme {act!r}: SGLang runs block scales with "
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
        imp.warn("PCC804", f"fmt {qc['fmt']!r}: SGLang ignores fmt and reads E4M3 weights", "fmt")
    name = _define(imp, spec, stem)
    key = "ignored_layers" if qc.get("ignored_layers") else "modules_to_not_convert"
    entries = list(qc.get(key) or [])
    if qc.get("ignored_layers") and qc.get("modules_to_not_convert"):
        imp.warn("PCC806", "both ignored_layers and modules_to_not_convert: SGLang reads ignored_layers only",
                 "modules_to_not_convert")
    d = Decided()
    ignored = normalized_fp8_ignores(entries)
    for prefix, (module, idx) in _sglang_modules(catalog, _SGLANG_LINEAR).items():
        try:
            skipped = sglang_skipped(module, ignored)
        except FusedDisagreement as exc:
            raise ImportFailed(f"{file}: {exc}", path=key, file=file) from None
        if not skipped:
            d.scheme.update(dict.fromkeys(idx, name))
    _unmatched_sglang(imp, catalog, entries, key)
    _expert_entries(imp, catalog, ignored, entries, key)
    d.kv = _kv_algo(qc.get("kv_cache_quant_algo"))
    return d


def _mxfp4(qc: dict, catalog: Catalog, imp: Imported, file: str) -> Decided:
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
    entries = list(qc.get("modules_to_not_convert") or [])
    if entries:
        imp.warn("PCC806", "modules_to_not_convert: SGLang's mxfp4 method ignores it (it quantizes every routed "
                 "expert and nothing else); the imported rules say what SGLang runs", "modules_to_not_convert")
    paths = _Paths(catalog)
    moe = sorted({sglang_module(op).prefix for op in catalog.operators if op.family.startswith("experts.")})
    for k, e in enumerate(entries):
        if not paths.glob_match(e):
            imp.warn("PCC802", f"modules_to_not_convert[{k}] {e!r} matches no module of {catalog.name}",
                     f"modules_to_not_convert[{k}]")
        elif any(_glob_prefix(e, p) for p in moe):
            imp.warn("PCC803", f"modules_to_not_convert[{k}] {e!r} names routed experts, which SGLang's mxfp4 "
                     "method quantizes anyway", f"modules_to_not_convert[{k}]")
    return d


def _modelopt(qc: dict, catalog: Catalog, imp: Imported, file: str) -> Decided:
    """SGLang `ModelOptFp4Config.from_config` / `ModelOptFp8Config` and `_get_quant_method`
    (modelopt_quant.py): Linear and LM head excluded by `is_layer_skipped` or
    `is_layer_excluded`, FusedMoE by `is_layer_excluded` only."""
    nested = "quant_algo" not in qc and isinstance(qc.get("quantization"), dict)
    q = qc["quantization"] if nested else qc
    algo = q.get("quant_algo")
    where = "quantization." if nested else ""
    if nested:
        key, entries, kv_raw = "exclude_modules", q.get("exclude_modules") or [], q.get("kv_cache_quant_algo")
    else:
        present = [k for k in ("ignore", "modules_to_not_convert", "exclude_modules") if k in q]
        key = present[0] if present else "ignore"
        entries = q.get(key) or []
        if len({tuple(q[k] or []) for k in present}) > 1:
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
    else:
        raise ImportFailed(f"{file}: ModelOpt quant_algo {algo!r}: pcc imports NVFP4 and FP8", path=where + "quant_algo",
                           file=file)
    d = Decided()
    exclusions = modelopt_exclusions(entries)
    for prefix, (module, idx) in _sglang_modules(catalog, _SGLANG_LINEAR | {"lm_head"}).items():
        try:
            if module.moe:
                excluded = modelopt_excluded(prefix, exclusions)
            else:
                excluded = sglang_skipped(module, exclusions) or modelopt_excluded(prefix, exclusions)
        except FusedDisagreement as exc:
            raise ImportFailed(f"{file}: {exc}", path=where + key, file=file) from None
        if not excluded:
            d.scheme.update(dict.fromkeys(idx, name))
    _unmatched_sglang(imp, catalog, entries, where + key, modelopt=True)
    d.kv = _kv_algo(kv_raw)
    return d


def _compressed_tensors(qc: dict, catalog: Catalog, imp: Imported, file: str) -> Decided:
    """compressed-tensors `apply_quantization_config` (quantization/lifecycle/apply.py) with its
    matchers (utils/match.py)."""
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ImportFailed(f"{file}: compressed-tensors config without config_groups", path="config_groups", file=file)
    target_group: dict[str, str] = {}
    names: dict[str, str] = {}
    for gname, g in groups.items():
        if not isinstance(g, dict) or not isinstance(g.get("targets"), list):
            raise ImportFailed(f"{file}: config_groups.{gname} has no targets list", path=f"config_groups.{gname}",
                               file=file)
        names[gname] = _define(imp, _ct_scheme(g, gname, imp, file), _ct_stem(g, gname))
        for t in g["targets"]:
            if t in target_group:
                imp.warn("PCC803", f"target {t!r} is in config_groups {target_group[t]} and {gname}: compressed-tensors "
                         f"keeps the later ({gname})", f"config_groups.{gname}.targets")
            target_group[t] = gname
    ignore = list(qc.get("ignore") or [])
    order = list(groups)
    d = Decided()
    target_hits: set[str] = set()
    ignore_hits: set[str] = set()
    for i, op in enumerate(catalog.operators):
        if op.family == "kv_cache":
            continue
        name, classes = module_name(op), ct_classes(op, catalog)
        matched = ct_matched_targets(name, classes, list(target_group))
        if not matched:
            continue
        quantizable = bool(set(classes) & {"Linear", "Embedding"}) or op.family == "other"
        if quantizable:
            target_hits.update(matched)
        hit_ignores = [e for e in ignore if ct_match_name(name, e) or e in classes]
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
        d.scheme[i] = names[chosen]
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


def _ct_hint(entry: str) -> str:
    if entry.startswith("re:"):
        return "'re:' patterns use re.match: anchored at the start of the module name, not at its end"
    return "a plain entry is an exact module name (or a torch class name such as Linear); use 're:' for patterns"


def _ct_stem(g: dict, gname: str) -> str:
    w = g.get("weights") or {}
    bits, kind = w.get("num_bits"), w.get("type")
    size = w.get("group_size")
    a = "a16" if not g.get("input_activations") else f"a{(g['input_activations'] or {}).get('num_bits')}"
    return f"{gname}_{'w' if kind == 'int' else 'f'}{bits}{a}" + (f"_g{size}" if size else "")


def _ct_grouping(args: dict, fmt: str, role: str, where: str) -> dict:
    strategy = args.get("strategy")
    if strategy == "tensor":
        return {"kind": "tensor"}
    if strategy == "channel":
        return {"kind": "row"}
    if strategy == "token":
        return {"kind": "token"}
    if strategy == "block":
        r, c = args.get("block_structure") or [None, None]
        return {"kind": "block", "rows": r, "cols": c}
    if strategy in ("group", "tensor_group"):
        size = args.get("group_size")
        if fmt == "fp8_e4m3" and role == "activations":
            return {"kind": "tile", "rows": 1, "cols": size}
        return {"kind": "group", "size": size}
    raise ImportFailed(f"{where}: strategy {strategy!r} has no pcc grouping", path=where)


def _ct_format(args: dict, where: str) -> str:
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
    raise ImportFailed(f"{where}: {kind} {bits}-bit (strategy {args.get('strategy')}, group {size}) has no pcc format",
                       path=where)


def _ct_scheme(g: dict, gname: str, imp: Imported, file: str) -> dict:
    w, a = g.get("weights"), g.get("input_activations")
    base = f"config_groups.{gname}"
    if not isinstance(w, dict):
        raise ImportFailed(f"{file}: {base} quantizes no weights; pcc imports weight schemes", path=base + ".weights",
                           file=file)
    fmt = _ct_format(w, base + ".weights")
    spec: dict = {"format": fmt, "weights": _ct_grouping(w, fmt, "weights", base + ".weights")}
    if w.get("symmetric") is False:
        spec["symmetric"] = False
    if w.get("actorder"):
        imp.warn("PCC804", f"{base}.weights.actorder {w['actorder']!r}: pcc has no activation-order permutation; "
                 "the imported scheme groups columns in storage order", base + ".weights.actorder")
    if isinstance(a, dict):
        afmt = _ct_format(a, base + ".input_activations")
        if afmt != fmt:
            raise ImportFailed(f"{file}: {base} has {fmt} weights and {afmt} activations; a pcc scheme has one format",
                               path=base + ".input_activations", file=file)
        spec["activations"] = _ct_grouping(a, fmt, "activations", base + ".input_activations")
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


class _Paths:
    """Every module path of the model (checkpoint and SGLang names), their dotted ancestors and
    parts, so that 'which entry matches nothing' is set lookups plus a scan for the rare rest."""

    def __init__(self, catalog: Catalog):
        self.paths = _all_paths(catalog)
        self.ancestors: set[str] = set()
        self.parts: set[str] = set()
        for p in self.paths:
            bits = p.split(".")
            self.parts.update(bits)
            self.ancestors.update(".".join(bits[:k]) for k in range(1, len(bits) + 1))

    def path_match(self, entry: str) -> bool:
        """Some module matches SGLang's `_module_path_match(entry, module)`."""
        e = entry.rstrip(".")
        if e in self.ancestors:
            return True
        return any(f".{e}." in f".{p}." for p in self.paths)

    def glob_match(self, entry: str, parts: bool = False) -> bool:
        """`*` globs (ModelOpt's form) over whole module paths or their ancestors (and, with
        `parts`, single dotted parts, as ModelOpt's part-by-part check)."""
        from pcc.importer.matching import _modelopt_regex

        if "*" not in entry:
            return entry in self.ancestors or (parts and entry in self.parts)
        rx = _modelopt_regex(entry)
        return any(rx.fullmatch(a) for a in self.ancestors) or (parts and any(rx.fullmatch(x) for x in self.parts))


def _glob_prefix(entry: str, path: str) -> bool:
    """A `*` glob naming this module path or one of its ancestors."""
    from pcc.importer.matching import _modelopt_regex

    rx, bits = _modelopt_regex(entry), path.split(".")
    return any(rx.fullmatch(".".join(bits[:k])) for k in range(1, len(bits) + 1))


def _unmatched_sglang(imp: Imported, catalog: Catalog, entries: list[str], key: str, modelopt: bool = False) -> None:
    paths = _Paths(catalog)
    for k, e in enumerate(entries):
        forms = modelopt_exclusions([e]) if modelopt else [e]
        hit = any(paths.path_match(f.removeprefix("model.")) or paths.path_match(f) or (
            modelopt and paths.glob_match(f, parts=True)) for f in forms)
        if not hit:
            imp.warn("PCC802", f"{key}[{k}] {e!r} matches no module of {catalog.name}", f"{key}[{k}]",
                     hint="SGLang matches whole dotted names (or, for ModelOpt, '*' globs over the whole name or "
                          "one dotted part); the entry excludes nothing")


def _expert_entries(imp: Imported, catalog: Catalog, ignored: list[str], entries: list[str], key: str) -> None:
    """SGLang skips a whole FusedMoE layer when any entry naming experts contains its prefix:
    one listed expert keeps every expert of that layer wide (pcc would keep that one only)."""
    for prefix, (module, idx) in _sglang_modules(catalog, {"experts.gate_up", "experts.down"}).items():
        direct = any(module_path_match(e, prefix) for e in ignored)
        by_substring = [e for e in entries if "experts" in e and prefix in e and not module_path_match(e, prefix)]
        if by_substring and not direct:
            imp.warn("PCC803", f"{key} lists {by_substring[0]!r}; SGLang then keeps every routed expert of "
                     f"{prefix} wide (one FusedMoE module per layer), and so does the imported contract", key)


def rollout_rules(imp: Imported, catalog: Catalog, d: Decided) -> None:
    """The rollout block: the most common scheme over whole families, later rules for the others,
    `keep bf16` for the wide operators inside those families; checked exact by resolution."""
    rules = component_rules(catalog, d.scheme, ["rollout"])
    if d.kv:
        rules.append({"components": ["rollout"], "patterns": ["kv_cache"], "scheme": d.kv})
    imp.contract["rollout"] = {"engine": "sglang", "rules": rules}
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
