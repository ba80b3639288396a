"""A ModelOpt `quant_algo: MIXED_PRECISION` export as rollout rules: what vLLM 0.32 runs of it.

vLLM serves the form (pcc.plan.mixed; vllm/model_executor/layers/quantization/modelopt.py
`ModelOptMixedPrecisionConfig`) and reads config.json's flat `quantization_config` before
hf_quant_config.json (model_loader/weight_utils.py `get_quant_config`). Per vLLM module (a fused
projection or a layer's routed experts is one): excluded by `is_layer_excluded` (the shards' exact
names, a substring, an fnmatch wildcard), else the `quant_algo` `_resolve_quant_algo` finds (the
prefix or its model.language_model. / language_model.model. twin, the fused shards, a child, a
RoutedExperts' parent `mlp.`), else unquantized. Members pcc states: FP8 (per tensor, static
activations), NVFP4, W4A16_NVFP4 with groups of 16.
"""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

from pcc.importer import Imported, ImportFailed, read_json
from pcc.importer.bounds import count, names, said
from pcc.importer.matching import SglangModule, sglang_module, uncataloged
from pcc.models import Catalog

_SCHEMES = {"FP8": ({"format": "fp8_e4m3", "grouping": {"kind": "tensor"}}, "fp8_tensor"),
            "NVFP4": ({"format": "nvfp4"}, "nvfp4"),
            "W4A16_NVFP4": ({"format": "nvfp4", "weights": {"kind": "group", "size": 16}}, "nvfp4_w4a16")}
_ACTS = {"FP8": 8, "NVFP4": 4, "W4A16_NVFP4": None}  # input-activation bits each algo quantizes to


def decide_mixed(q: dict, catalog: Catalog, imp: Imported, file: str, where: str, families: set[str], define, decided):
    """Decided for a MIXED_PRECISION config `q` (`where`: "quantization." for the nested form)."""
    layers = q.get("quantized_layers")
    if not isinstance(layers, dict) or not layers:
        raise ImportFailed(f"{file}: MIXED_PRECISION without a quantized_layers mapping (vLLM requires a non-empty "
                           "one)", path=where + "quantized_layers", file=file)
    algos = {}
    for key, info in layers.items():
        algo = str(info.get("quant_algo", "")).upper() if isinstance(info, dict) else ""
        if algo not in _SCHEMES:
            raise ImportFailed(f"{file}: quantized_layers[{key!r}] quant_algo {said(algo)}: pcc states the members "
                               f"{', '.join(_SCHEMES)} (PCC650 says why no other)", path=where + "quantized_layers",
                               file=file)
        if algo != "FP8" and info.get("group_size", 16) != 16:
            raise ImportFailed(f"{file}: quantized_layers[{key!r}] group_size {said(info['group_size'])}: NVFP4 "
                               "scales groups of 16", path=where + "quantized_layers", file=file)
        algos[key] = algo
    key = "exclude_modules" if where else "ignore"
    excluded = names(q.get(key), where + key, file, "an exclusion list")
    d = decided()
    d.engine = "vllm"
    schemes = {}
    used: set[str] = set()
    modules: dict[str, tuple[SglangModule, list[int]]] = {}
    for i, op in enumerate(catalog.operators):
        if op.family in families:
            m = sglang_module(op)
            modules.setdefault(m.prefix, (m, []))[1].append(i)
    # every exclusion and quantized_layers key is matched against every module (substring, glob, prefix): bounded
    count(where + key, file, len(excluded), len(modules))
    count(where + "quantized_layers", file, len(algos), len(modules))
    for prefix, (module, idx) in modules.items():
        if _excluded(prefix, module.shards, excluded, file, where + key):
            continue
        algo = _resolve(prefix, module.shards, algos, used, file, where)
        if algo is not None:
            if algo not in schemes:
                schemes[algo] = define(imp, *_SCHEMES[algo])
            d.scheme.update(dict.fromkeys(idx, schemes[algo]))
    for k in layers:
        if k not in used:
            imp.warn("PCC802", f"quantized_layers[{k!r}] names no module vLLM builds for {catalog.name}",
                     where + "quantized_layers")
    for k, e in enumerate(excluded):
        if not any(e in p or fnmatch(p, e) for p in modules) and not uncataloged(e, catalog.config):
            imp.warn("PCC802", f"{key}[{k}] {e!r} matches no module of {catalog.name}", f"{where}{key}[{k}]")
    if "FP8" in schemes:
        imp.warn("PCC804", "ModelOpt FP8 members use the checkpoint's calibrated input_scale; pcc's per-tensor FP8 "
                 "scheme states the grouping, not where the activation scale comes from", where + "quantized_layers")
    _groups(q, algos, imp)
    d.kv = _kv(q, imp, file, where)
    return d


def _candidates(prefix: str) -> list[str]:
    """vLLM's `_quantized_layer_prefix_candidates`."""
    out = [prefix]
    if prefix.endswith(".lm_head"):
        out.append("lm_head")
    for a, b in (("language_model.model.", "model.language_model."), ("model.language_model.", "language_model.model.")):
        if prefix.startswith(a):
            out.append(b + prefix[len(a):])
            break
    return list(dict.fromkeys(out))


def _resolve(prefix: str, shards: tuple, algos: dict, used: set, file: str, where: str) -> str | None:
    """vLLM's `_resolve_quant_algo` for one module; `used` collects the keys it read."""
    for c in _candidates(prefix):
        if c in algos:
            used.add(c)
            return algos[c]
    if shards:
        found = {s2: algos[s2] for s in shards for s2 in _candidates(s) if s2 in algos}
        if len(set(found.values())) > 1:
            raise ImportFailed(f"{file}: {prefix}: its shards are {', '.join(sorted(set(found.values())))}; vLLM "
                               "refuses a fused layer of mixed quant_algo", path=where + "quantized_layers", file=file)
        if found:
            used.update(found)
            return next(iter(found.values()))
    for c in _candidates(prefix):
        for k in algos:
            if k.startswith(c + "."):
                used.add(k)
                return algos[k]
    if prefix.endswith(".experts"):
        parent = prefix.rsplit(".experts", 1)[0] + "."
        for k in algos:
            if k.startswith(parent):
                return algos[k]
    return None


def _excluded(prefix: str, shards: tuple, entries: list[str], file: str, at: str) -> bool:
    """vLLM's `is_layer_excluded`: the shards' exact names (all or none), a substring, a wildcard."""
    if not entries:
        return False
    if shards:
        listed = {s in entries for s in shards}
        if len(listed) > 1:
            raise ImportFailed(f"{file}: {prefix}: some but not all of its shards are excluded; vLLM refuses a fused "
                               "layer of mixed precision", path=at, file=file)
        if listed == {True}:
            return True
    bare = prefix.removeprefix("language_model.")
    return any(e in prefix or e in bare or fnmatch(prefix, e) for e in entries)


def _groups(q: dict, algos: dict, imp: Imported) -> None:
    """ModelOpt's `config_groups` beside `quantized_layers` (vLLM reads the latter only): PCC804 where a group's
    input activations say otherwise than its targets' quant_algo."""
    groups = q.get("config_groups")
    for g, body in (groups or {}).items() if isinstance(groups, dict) else ():
        targets = body.get("targets") if isinstance(body, dict) else None
        acts = body.get("input_activations") if isinstance(body, dict) else None
        bits = acts.get("num_bits") if isinstance(acts, dict) else None
        wrong = sorted({algos[t] for t in targets or () if t in algos and _ACTS[algos[t]] != bits})
        if wrong:
            imp.warn("PCC804", f"config_groups.{g} gives its targets {said(bits)}-bit input activations, and "
                     f"quantized_layers says they are {', '.join(wrong)}: vLLM reads quantized_layers, and so does the "
                     "import", f"config_groups.{g}.input_activations")


def _kv(q: dict, imp: Imported, file: str, where: str) -> str | None:
    """The KV cache vLLM's `from_config` reads: the nested form's kv_cache_quant_algo, the flat form's
    kv_cache_scheme (float 8 bits: FP8); PCC806 for the hf_quant_config.json beside it that vLLM does not read."""
    if where:
        algo = q.get("kv_cache_quant_algo")
    else:
        s = q.get("kv_cache_scheme")
        algo = "FP8" if isinstance(s, dict) and s.get("type") == "float" and s.get("num_bits") == 8 else None
        if s is not None and algo is None:
            raise ImportFailed(f"{file}: kv_cache_scheme {said(s)}: pcc imports an FP8 KV cache (type float, 8 bits)",
                               path="kv_cache_scheme", file=file)
        beside = Path(file).parent / "hf_quant_config.json"
        if Path(file).name == "config.json" and beside.is_file():
            nested = read_json(beside, "hf_quant_config.json").get("quantization")  # bounded, as every source
            other = nested.get("kv_cache_quant_algo") if isinstance(nested, dict) else None
            if other and other != algo:
                imp.warn("PCC806", f"hf_quant_config.json's kv_cache_quant_algo {said(other)}: vLLM reads config.json's "
                         "quantization_config first, whose flat form sets the KV cache only in kv_cache_scheme (absent "
                         "here), so the contract keeps the KV cache wide", "kv_cache_scheme")
    if algo not in (None, "FP8"):
        raise ImportFailed(f"{file}: kv_cache_quant_algo {said(algo)}: pcc imports an FP8 KV cache",
                           path=where + "kv_cache_quant_algo", file=file)
    return "fp8_e4m3" if algo == "FP8" else None
