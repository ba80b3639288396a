"""`pcc import te SOURCE`: a Transformer Engine per-module precision file as trainer rules.

The file is megatron-core's (megatron/core/quantization/quant_config.py, read by `--te-precision-
config-file`; pcc.lower.megatron writes one as trainer/te_precision.yaml): named `configs`, each a
`TEQuantizationParams` with a `training_recipe` (`fp8_quantization_recipe` / `fp4_quantization_recipe`;
none = BF16), and ordered `matchers` (type glob, fnmatch over the module path, only those with
`enabled: true`; the first that matches decides the module). A module no matcher decides runs the
launch's global recipe. Miles launches read the same file through this module (miles.py).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from pcc.importer import Imported, ImportFailed, contract_name
from pcc.importer.bounds import MAX_PATTERN, Budget, OverBound, count, shown
from pcc.importer.checkpoint import _define, finish, load_model
from pcc.importer.rules import component_rules
from pcc.importer.yamlsource import load, read_text
from pcc.lang.diagnostics import Span
from pcc.models import Catalog
from pcc.plan.patterns import LINEAR

# TEQuantizationRecipe's fields (megatron-core 0.19 extensions/transformer_engine.py): an unknown
# key is refused by megatron-core itself ("Field ... not valid for this configuration").
RECIPE_FIELDS = {"fp8_quantization_recipe", "fp4_quantization_recipe", "custom_recipe_factory", "fp8_format",
                 "override_quantized_autocast", "override_nonquantized_autocast", "tp_only_amax_red", "fp8_param",
                 "fp4_param"}
_RECIPE_DEFAULTS = {"fp8_format": "e4m3", "override_quantized_autocast": True, "override_nonquantized_autocast": False,
                    "tp_only_amax_red": False, "fp8_param": False, "fp4_param": False, "custom_recipe_factory": None}
FP8_RECIPES = ("tensorwise", "blockwise", "mxfp8")  # `delayed` is refused per module by megatron-core
FP4_RECIPES = ("nvfp4",)
_RECIPE_SCHEME = {"tensorwise": ({"format": "fp8_e4m3", "grouping": {"kind": "tensor"}}, "fp8_tensor"),
                  "delayed": ({"format": "fp8_e4m3", "grouping": {"kind": "tensor"}, "amax": "delayed"}, "fp8_delayed"),
                  "mxfp8": ({"format": "mxfp8"}, "mxfp8"),
                  "nvfp4": ({"format": "nvfp4"}, "nvfp4")}
UNMATCHED = "<global>"  # a module no matcher decides: it runs the launch's global recipe
BLOCK_FP32_ENV = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES"


def recipe_scheme(imp: Imported, recipe: str, fp32_scales: str | None, where: str, span: Span | None = None) -> str:
    """The contract scheme a TE recipe runs (defined in the contract unless a preset). Blockwise
    scales are FP32 with NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1, else powers of two; unset, Miles and
    verl choose by GPU (FP32 below SM100), and the contract states FP32 (PCC808)."""
    if recipe == "blockwise":
        if fp32_scales is None:
            imp.warn("PCC808", f"{where} blockwise without {BLOCK_FP32_ENV}: the scale dtype is chosen by GPU (FP32 "
                     "below SM100); the contract states FP32 scales", "env", span=span)
        spec = {"format": "fp8_e4m3", "weights": {"kind": "block", "rows": 128, "cols": 128},
                "activations": {"kind": "tile", "rows": 1, "cols": 128}}
        stem = "fp8_block"
        if fp32_scales not in (None, "1"):
            spec["scale"], stem = "pow2", "fp8_block_pow2"
        return _define(imp, spec, stem)
    if recipe not in _RECIPE_SCHEME:
        raise ImportFailed(f"{imp.source}: {where} {recipe}: pcc imports tensorwise, delayed, blockwise, mxfp8 and "
                           "nvfp4", path=where, file=imp.source, span=span)
    spec, stem = _RECIPE_SCHEME[recipe]
    return _define(imp, spec, stem)


@dataclass
class PrecisionFile:
    """A TE precision file as megatron-core reads it."""

    path: str
    recipes: dict[str, str | None] = field(default_factory=dict)  # config -> recipe, None = BF16
    matchers: list[tuple[str, str, str]] = field(default_factory=list)  # (key, pattern, config), enabled, in order
    spans: dict[str, Span] = field(default_factory=dict)

    def span(self, path: str) -> Span | None:
        return self.spans.get(path)


def read_precision_file(path: str, imp: Imported) -> PrecisionFile:
    """Read and check the file as megatron-core's RecipeConfig and TEQuantizationParams do; recipe
    keys that change precision and have no contract field are PCC807."""
    text = read_text(path, "TE precision file")
    doc, spans = load(text, path, "TE precision file")
    pf = PrecisionFile(path, spans=spans)

    def fail(msg: str, at: str):
        raise ImportFailed(f"{path}: {msg}", file=path, span=spans.get(at) or spans.get(""), path=at or None)

    if not isinstance(doc, dict) or not isinstance(doc.get("configs"), dict) or not isinstance(doc.get("matchers"), dict):
        fail("a TE precision file is a mapping with 'configs' and 'matchers' mappings "
             "(megatron/core/quantization/quant_config.py)", "")
    for key in sorted(set(doc) - {"configs", "matchers"}):
        imp.warn("PCC810", f"{path}: top-level key {key!r} is not read by megatron-core's precision config", key,
                 file=path, span=spans.get(key + "@key"))
    for name, cfg in doc["configs"].items():
        at = f"configs.{name}"
        if not isinstance(cfg, dict):
            fail(f"config {name} is not a mapping", at)
        if cfg.get("transformer_engine_config_type") != "TEQuantizationParams":
            fail(f"config {name}: transformer_engine_config_type must be TEQuantizationParams (megatron-core's only "
                 "type)", at)
        extra = sorted(set(cfg) - {"transformer_engine_config_type", "training_recipe", "evaluation_recipe"})
        if extra:
            fail(f"config {name}: key {extra[0]!r} is not a TEQuantizationParams field", f"{at}.{extra[0]}@key")
        if "evaluation_recipe" in cfg:
            imp.warn("PCC807", f"{path}: config {name} has an evaluation_recipe (the precision when not training); "
                     "a contract states the training precision only", f"{at}.evaluation_recipe", file=path,
                     span=spans.get(f"{at}.evaluation_recipe@key"))
        tr = cfg.get("training_recipe")
        if not isinstance(tr, dict):
            fail(f"config {name}: training_recipe must be a mapping ({{}} for BF16)", f"{at}.training_recipe")
        pf.recipes[name] = _recipe(imp, pf, name, tr)
    for key, m in doc["matchers"].items():
        at = f"matchers.{key}"
        if not isinstance(m, dict):
            fail(f"matcher {key} is not a mapping", at)
        if not m.get("enabled", False):  # megatron-core skips a matcher without enabled: true
            if "enabled" not in m:
                imp.warn("PCC806", f"{path}: matcher {key} has no 'enabled: true'; megatron-core skips it", at,
                         file=path, span=spans.get(at + "@key"))
            continue
        if m.get("type") != "glob":
            fail(f"matcher {key}: type {m.get('type')!r}; megatron-core implements glob matchers only", at)
        config = m.get("config")
        if not isinstance(m.get("pattern"), str) or not isinstance(config, str) or config not in pf.recipes:
            fail(f"matcher {key} needs a 'pattern' string and a 'config' naming one of configs "
                 f"({', '.join(pf.recipes)})", at)
        pf.matchers.append((key, m["pattern"], m["config"]))
    return pf


def _recipe(imp: Imported, pf: PrecisionFile, name: str, tr: dict) -> str | None:
    at = f"configs.{name}.training_recipe"
    extra = sorted(set(tr) - RECIPE_FIELDS)
    if extra:
        raise ImportFailed(f"{pf.path}: config {name}: {extra[0]!r} is not a TEQuantizationRecipe field (megatron-core "
                           "refuses it)", file=pf.path, span=pf.span(f"{at}.{extra[0]}@key"), path=f"{at}.{extra[0]}")
    fp8, fp4 = tr.get("fp8_quantization_recipe"), tr.get("fp4_quantization_recipe")
    if fp8 is not None and fp4 is not None:
        raise ImportFailed(f"{pf.path}: config {name} sets both an FP8 and an FP4 recipe (megatron-core refuses it)",
                           file=pf.path, span=pf.span(at), path=at)
    if fp8 is not None and fp8 not in FP8_RECIPES:
        raise ImportFailed(f"{pf.path}: config {name}: fp8_quantization_recipe {fp8!r}: megatron-core runs "
                           f"{', '.join(FP8_RECIPES)} per module (delayed is refused, custom is not importable)",
                           file=pf.path, span=pf.span(f"{at}.fp8_quantization_recipe"), path=at)
    if fp4 is not None and fp4 not in FP4_RECIPES:
        raise ImportFailed(f"{pf.path}: config {name}: fp4_quantization_recipe {fp4!r}: pcc imports nvfp4",
                           file=pf.path, span=pf.span(f"{at}.fp4_quantization_recipe"), path=at)
    for k, default in _RECIPE_DEFAULTS.items():
        if k in tr and tr[k] != default:
            code = "PCC804" if k == "fp8_format" else "PCC807"
            what = ("E5M2 gradients; the imported schemes state E4M3" if k == "fp8_format"
                    else "a Transformer Engine switch that changes precision and that no contract field states")
            imp.warn(code, f"{pf.path}: config {name}: {k} {tr[k]}: {what}", f"{at}.{k}", file=pf.path,
                     span=pf.span(f"{at}.{k}"))
    return fp8 or fp4


def megatron_paths(op) -> list[str]:
    """The Megatron module paths an operator runs in (targets/megatron.yaml `modules`), as the
    precision file's globs see them: decoder.layers.<L>.<module>, expert 0 for per-expert modules."""
    from pcc.lower.megatron import tables

    return [f"decoder.layers.{op.layer}.{m}".replace("*", "0") for m in tables()["modules"].get(op.family, [])]


def decide(pf: PrecisionFile, imp: Imported, catalog: Catalog) -> dict[int, str | None]:
    """TE operator -> the recipe its module runs (None = BF16, UNMATCHED = the global recipe); the
    first enabled matcher whose glob matches a module path decides it, and an operator is quantized
    when one of its candidate module paths is (MLA and plain attention name different modules).
    A matcher that decides nothing is PCC802. Matched matcher by matcher, each against the paths no
    earlier one took, within the import's budget (bounds.py), so a glob that never ends is named."""
    paths = {i: megatron_paths(op) for i, op in enumerate(catalog.operators) if op.family in LINEAR}
    left = list(dict.fromkeys(m for ms in paths.values() for m in ms))
    count("matchers", pf.path, len(pf.matchers), len(left))
    first: dict[str, str] = {}  # module path -> the config of the first matcher that matches it
    used: set[str] = set()
    budget = Budget(pf.path)
    for key, pattern, config in pf.matchers:
        if len(pattern) > MAX_PATTERN:
            raise OverBound(f"{pf.path}: matcher {key}: pattern {shown(pattern)} is longer than the {MAX_PATTERN} "
                            "characters pcc matches", file=pf.path, span=pf.span(f"matchers.{key}.pattern"))
        with budget.matching(f"matcher {key} ({shown(pattern)})"):
            taken = set(fnmatch.filter(left, pattern))  # fnmatch, as megatron-core's GlobMatcher (case-sensitive on POSIX)
        if taken:
            used.add(key)
            first.update(dict.fromkeys(taken, config))
            left = [m for m in left if m not in taken]
    out: dict[int, str | None] = {}
    for i, modules in paths.items():
        found = [pf.recipes[first[m]] if m in first else UNMATCHED for m in modules]
        out[i] = next((r for r in found if r not in (None, UNMATCHED)), None if None in found else UNMATCHED)
    for key, pattern, _ in pf.matchers:
        if key not in used:
            imp.warn("PCC802", f"{pf.path}: matcher {key} ({pattern!r}) decides no module of {catalog.name} (an "
                     "earlier matcher takes them, or none exists)", f"matchers.{key}", file=pf.path,
                     span=pf.span(f"matchers.{key}@key"))
    return out


def prove_trainer(imp: Imported, catalog: Catalog, decided: dict[int, str]) -> None:
    """The written trainer rules resolve, operator by operator, to what the source decides (FProp;
    the rules name DGrad and WGrad with it), else an internal PCC801."""
    from pcc.contract.model import Contract
    from pcc.lang.build import SourceMap
    from pcc.lang.diagnostics import Reporter
    from pcc.plan.resolve import resolve

    plan = resolve(Contract.model_validate(imp.contract), catalog, SourceMap(), Reporter())
    wrong = [op.tensor for i, op in enumerate(catalog.operators) if op.family in LINEAR
             and (None if plan.scheme("fprop", i).wide else plan.scheme_name("fprop", i)) != decided.get(i)]
    if wrong:
        raise ImportFailed(f"internal: the imported trainer rules decide {len(wrong)} operator(s) otherwise than the "
                           f"source, e.g. {wrong[0]}")


def import_te(source: str, model: str | None, hardware: str | None = None) -> Imported:
    catalog, ref = load_model(model, None)
    imp = Imported({"name": contract_name(source), "model": ref}, source=source)
    pf = read_precision_file(source, imp)
    by_op = decide(pf, imp, catalog)
    unmatched = [i for i, r in by_op.items() if r == UNMATCHED]
    if unmatched:
        imp.warn("PCC808", f"{len(unmatched)} TE module(s) of {catalog.name} match no matcher "
                 f"(e.g. {megatron_paths(catalog.operators[unmatched[0]])[0]}): they run the launch's global recipe "
                 "(--fp8-recipe), which the file does not carry; the contract states them BF16", "matchers",
                 hint="add a catch-all matcher (pattern '*') last, as pcc writes it")
    names: dict[str, str] = {}
    for recipe in sorted({r for r in by_op.values() if r not in (None, UNMATCHED)}):
        where = ("fp4_quantization_recipe" if recipe in FP4_RECIPES else "fp8_quantization_recipe")
        names[recipe] = recipe_scheme(imp, recipe, None, where)
    decided = {i: names[r] for i, r in by_op.items() if r in names}
    imp.warn("PCC808", "NVTE_BACKWARD_OVERRIDE is an environment variable, not in the file: the contract states "
             "DGrad and WGrad with FProp's scheme", "trainer.rules")
    imp.warn("PCC808", "a TE precision file states the trainer's GEMMs only: rollout, optimizer state, sync and the "
             "objective are pcc's defaults", "rollout")
    imp.contract["trainer"] = {"engine": "megatron", "rules": component_rules(catalog, decided, ["fprop", "dgrad", "wgrad"])}
    finish(imp, catalog, hardware)
    prove_trainer(imp, catalog, decided)
    return imp
