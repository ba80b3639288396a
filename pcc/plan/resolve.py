"""Resolution: every operator x component gets exactly one scheme and the rule that chose it.

Precedence (docs/language.md): `keep` rules beat pattern rules; within each
kind the later rule wins. Operators no rule matches stay at the default,
"bf16". Resolution works on (family, layer) groups, so its cost grows with the
number of groups and rules, plus one linear pass over operators at the end;
tensor-name globs, the only per-tensor patterns, refine groups where used.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from pcc.contract.model import Contract, Rule, Scheme
from pcc.contract.scheme import PRESETS, lookup
from pcc.lang.build import SourceMap
from pcc.lang.diagnostics import Reporter, did_you_mean
from pcc.models import Catalog
from pcc.plan.layouts import Layout, layout_of, named
from pcc.plan.mixed import is_mixed
from pcc.plan.patterns import NON_GEMM, Pattern, PatternError, parse_pattern
from pcc.plan.tensors import nbytes, sync_size, tensor_targets

COMPONENTS = ("rollout", "fprop", "dgrad", "wgrad")
DEFAULT = -1  # owner id of operators no rule matched
DEFAULT_SCHEME = "bf16"


@dataclass(frozen=True)
class RuleRef:
    id: int
    section: str  # "rollout" | "trainer"
    rule: Rule
    path: str  # where it sits in the canonical contract, e.g. "rollout.rules[2]"



# The Transformer Engine recipe a real or QDQ trainer GEMM of a format runs; INT4/INT8 have none
# (Megatron fake-quantizes them through Miles' QAT patch).
def te_recipe(scheme: Scheme) -> str | None:
    if scheme.format in ("nvfp4", "mxfp8"):
        return scheme.format
    if scheme.format in ("fp8_e4m3", "fp8_e5m2"):
        if scheme.amax == "delayed":
            return "delayed"
        return "blockwise" if scheme.weights and scheme.weights.kind == "block" else "tensorwise"
    return None


@dataclass(frozen=True)
class Decision:
    """What one component does to the operators one rule (or the bf16 default) owns: scheme, what
    reaches the GEMM, accumulation and output, the rule and, for trainer GEMMs, the TE recipe.
    Every operator a rule owns shares its Decision; `Plan.decision(component, i)` finds it."""

    component: str
    scheme_name: str
    scheme: Scheme
    gemm: str  # "real" | "qdq" | "wide"
    accumulate: str | None  # as declared; None = the engine's (FP32 in every engine pcc targets)
    output: str | None  # as declared; None = the engine's activation dtype
    rule: RuleRef | None  # None: the bf16 default

    @property
    def path(self) -> str | None:
        return self.rule.path if self.rule else None

    @property
    def recipe(self) -> str | None:
        return te_recipe(self.scheme) if self.component != "rollout" and self.gemm != "wide" else None


@dataclass(frozen=True)
class Plan:
    """The canonical, frozen result of resolution: one Decision per (component, operator), the
    trainable set, and derived facts computed once (cached) for every consumer to read. Every
    consumer reads the same objects, so they are tuples and read-only mappings, copied at
    construction: one consumer cannot change what the next one reads."""

    contract: Contract
    catalog: Catalog
    rules: tuple[RuleRef, ...]
    schemes: Mapping[str, Scheme]
    owner: Mapping[str, tuple[int, ...]]  # component -> rule id per operator (DEFAULT: no rule)
    trainable: tuple[int, ...]  # operators that train (base or adapter)
    decisions: Mapping[str, Mapping[int, Decision]]  # component -> rule id (or DEFAULT) -> Decision
    smap: SourceMap = field(default_factory=SourceMap, compare=False)  # contract path -> span

    def __post_init__(self):
        freeze = {"rules": tuple(self.rules), "schemes": _readonly(self.schemes),
                  "owner": _readonly({c: tuple(a) for c, a in self.owner.items()}),
                  "trainable": tuple(self.trainable),
                  "decisions": _readonly({c: _readonly(d) for c, d in self.decisions.items()})}
        for name, value in freeze.items():
            object.__setattr__(self, name, value)

    def decision(self, component: str, op: int) -> Decision:
        return self.decisions[component][self.owner[component][op]]

    def scheme_name(self, component: str, op: int) -> str:
        return self.decision(component, op).scheme_name

    def scheme(self, component: str, op: int) -> Scheme:
        return self.decision(component, op).scheme

    def used(self, component: str):
        """(Decision, operator indices) for every rule that owns operators in `component`."""
        for rid, idx in self.groups[component]:
            if rid != DEFAULT:
                yield self.decisions[component][rid], idx

    def hardware(self, section: str) -> str | None:
        """The hardware of "rollout" or "trainer": the section's own, else the contract's."""
        return getattr(self.contract, section).hardware or self.contract.hardware

    @cached_property
    def index(self) -> Mapping[str, int]:
        """Tensor name -> operator index."""
        return _readonly({op.tensor: i for i, op in enumerate(self.catalog.operators)})

    @cached_property
    def groups(self) -> Mapping[str, tuple[tuple[int, tuple[int, ...]], ...]]:
        """component -> ((rule id, operator indices), ...), rules in source order, default first."""
        out = {}
        for comp, owner in self.owner.items():
            by_rule: dict[int, list[int]] = defaultdict(list)
            for i, rid in enumerate(owner):
                by_rule[rid].append(i)
            out[comp] = tuple((rid, tuple(idx)) for rid, idx in sorted(by_rule.items()))
        return _readonly(out)

    @cached_property
    def params(self) -> int:
        """Weight parameters of the model (every operator but the KV cache)."""
        return sum(math.prod(op.shape) for op in self.catalog.operators if op.family != "kv_cache")

    @cached_property
    def fp8_recipe(self) -> str | None:
        """The Transformer Engine FP8 recipe (--fp8-recipe) the trainer's first real FP8 GEMM implies."""
        for comp in ("fprop", "dgrad", "wgrad"):
            for d, _ in self.used(comp):
                if d.gemm == "real" and d.recipe not in (None, "nvfp4"):
                    return d.recipe
        return None

    @cached_property
    def layouts(self) -> tuple[Layout | None, ...]:
        """Per operator, its rollout checkpoint layout (pcc.plan.layouts), decided once here; None for
        the KV cache and for a scheme no checkpoint layout stores."""
        base = tuple(None if op.family == "kv_cache" else layout_of(self.scheme("rollout", i))
                     for i, op in enumerate(self.catalog.operators))
        if not is_mixed(self):
            return base
        # a ModelOpt MIXED_PRECISION checkpoint (pcc.plan.mixed): each quantized weight in its member form,
        # or its own layout where it has none (PCC650 reports it)
        member = [x.mixed_member(self.scheme("rollout", i)) if x is not None and x.quantized else None
                  for i, x in enumerate(base)]
        return tuple(named(m) if m else x for x, m in zip(base, member))

    @cached_property
    def rollout_tensors(self) -> tuple[dict | None, ...]:
        """Per operator, its rollout checkpoint tensors (pcc.plan.tensors); None for the KV cache
        and for a scheme with no checkpoint layout (the targets report those)."""
        return tuple(None if op.family == "kv_cache" else tensor_targets(self, i)
                     for i, op in enumerate(self.catalog.operators))

    @cached_property
    def rollout_bytes(self) -> int:
        """Bytes of the rollout checkpoint's weights, every target tensor once (fused ones too)."""
        seen: dict[str, int] = {}
        rest = 0
        for i, t in enumerate(self.rollout_tensors):
            if t is not None:
                for name, x in t["targets"].items():
                    seen.setdefault(name, nbytes(x))
            elif self.catalog.operators[i].family != "kv_cache":
                rest += self.scheme("rollout", i).weight_bytes(self.catalog.operators[i].shape)
        return sum(seen.values()) + rest

    @cached_property
    def adapter_params(self) -> int:
        """LoRA adapter parameters: rank x (N + K) per adapter operator; 0 without LoRA."""
        t, ops = self.contract.trainable, self.catalog.operators
        if t.kind != "lora":
            return 0
        return sum((t.rank or 0) * (ops[i].shape[0] + ops[i].shape[1]) for i in self.trainable
                   if len(ops[i].shape) == 2)

    @cached_property
    def sync_bytes(self) -> int:
        """Bytes one version moves: the BF16 adapter, or every weight as the bridge carries it."""
        if self.contract.sync.moves == "adapter":
            return 2 * self.adapter_params
        return sum(sync_size(self, i) for i, op in enumerate(self.catalog.operators) if op.family != "kv_cache")

    def kv_cache_formats(self) -> dict[str, "RuleRef | None"]:
        """Rollout KV cache format -> the rule that chose it (None: the bf16 default)."""
        ops, out = self.catalog.operators, {}
        for rid, idx in self.groups["rollout"]:
            if any(ops[i].family == "kv_cache" for i in idx):
                d = self.decisions["rollout"][rid]
                out.setdefault(d.scheme.format, d.rule)
        return out

    def quantized(self, component: str) -> bool:
        """Whether any weight (not the KV cache) has a low-precision scheme in `component`."""
        ops = self.catalog.operators
        return any(not d.scheme.wide and any(ops[i].family != "kv_cache" for i in idx)
                   for d, idx in self.used(component))


def _readonly(m: Mapping) -> Mapping:
    """A read-only view of a private copy of `m`: the caller's dict cannot change it either."""
    return MappingProxyType(dict(m))


def _groups(catalog: Catalog) -> tuple[dict[tuple[str, int | None], list[int]], int]:
    groups: dict[tuple[str, int | None], list[int]] = defaultdict(list)
    for i, op in enumerate(catalog.operators):
        groups[(op.family, op.layer)].append(i)
    return groups, catalog.num_layers


def _applies(component: str, family: str) -> bool:
    return not (family == "kv_cache" and component != "rollout")


def resolve(contract: Contract, catalog: Catalog, smap: SourceMap, rep: Reporter) -> Plan:
    """Resolve `contract` against `catalog`; problems go to `rep` (PCC2xx)."""
    refs: list[RuleRef] = []
    for section in ("rollout", "trainer"):
        for k, rule in enumerate(getattr(contract, section).rules):
            refs.append(RuleRef(len(refs), section, rule, f"{section}.rules[{k}]"))
    schemes: dict[str, Scheme] = {DEFAULT_SCHEME: lookup({}, DEFAULT_SCHEME)}
    for ref in refs:
        spec = lookup(contract.schemes, ref.rule.scheme)
        if spec is None:

            rep.error("PCC202", f"unknown scheme '{ref.rule.scheme}'", smap.find(ref.path + ".scheme"),
                      hint=did_you_mean(ref.rule.scheme, list(contract.schemes) + list(PRESETS))
                      or "define it with 'scheme NAME = FORMAT ...'", path=ref.path)
        else:
            schemes[ref.rule.scheme] = spec

    groups, num_layers = _groups(catalog)
    ops = catalog.operators
    # Precedence order: pattern rules in order, then keep rules in order.
    ordered = [r for r in refs if not r.rule.keep] + [r for r in refs if r.rule.keep]
    group_owner: dict[str, dict] = {c: {} for c in COMPONENTS}  # key -> (seq, rid)
    op_owner: dict[str, dict[int, tuple[int, int]]] = {c: {} for c in COMPONENTS}
    matched: dict[int, int] = defaultdict(int)
    for seq, ref in enumerate(ordered):
        if ref.rule.scheme not in schemes:
            continue  # PCC202 reported above; the operators keep their other rules
        keys: list[tuple[str, int | None]] = []
        names: list[int] = []
        for k, text in enumerate(ref.rule.patterns):
            where = smap.find(f"{ref.path}.patterns[{k}]")
            try:
                pat = parse_pattern(text)
            except PatternError as exc:
                rep.error("PCC201", str(exc), where, hint=exc.hint, path=ref.path)
                continue
            hit_keys, hit_names = _match(pat, groups, num_layers, ops)
            if not hit_keys and not hit_names:
                rep.error("PCC201", f"pattern '{text}' matches no operator of model '{catalog.name}'", where,
                          hint=_why_nothing(pat, catalog), path=ref.path)
                continue
            spec = schemes.get(ref.rule.scheme)
            if spec is not None and not spec.wide:
                named = {f for f in pat.families if f in NON_GEMM and f != "kv_cache"}
                if named:
                    rep.error("PCC206", f"'{', '.join(sorted(named))}' is not a GEMM operator; "
                              f"it cannot take the quantized scheme '{ref.rule.scheme}'", where,
                              hint="quantize linear operators; keep norms and embeddings wide", path=ref.path)
            if "kv_cache" in pat.families and ref.section == "trainer":
                rep.error("PCC206", "the KV cache exists only in rollout", where, path=ref.path)
            keys += hit_keys
            names += hit_names
        for comp in ref.rule.components:
            for key in keys:
                if _applies(comp, key[0]):
                    group_owner[comp][key] = (seq, ref.id)
                    matched[ref.id] += 1
            for i in names:
                if _applies(comp, ops[i].family):
                    op_owner[comp][i] = (seq, ref.id)
                    matched[ref.id] += 1

    owner: dict[str, list[int]] = {}
    for comp in COMPONENTS:
        arr = [DEFAULT] * len(ops)
        for key, (_, rid) in group_owner[comp].items():
            for i in groups[key]:
                arr[i] = rid
        for i, (seq, rid) in op_owner[comp].items():
            g = group_owner[comp].get((ops[i].family, ops[i].layer))
            if g is None or g[0] < seq:
                arr[i] = rid
        owner[comp] = arr
    decisions = {comp: _decisions(comp, refs, schemes, owner[comp]) for comp in COMPONENTS}
    trainable = _trainable(contract, groups, num_layers, ops, smap, rep, catalog)
    plan = Plan(contract, catalog, refs, schemes, owner, trainable, decisions, smap)
    _report_shadowed(plan, matched, smap, rep)
    return plan


def _decisions(comp: str, refs: list[RuleRef], schemes: dict[str, Scheme], owner: list[int]) -> dict[int, Decision]:
    out = {DEFAULT: Decision(comp, DEFAULT_SCHEME, schemes[DEFAULT_SCHEME], "wide", None, None, None)}
    for rid in set(owner) - {DEFAULT}:
        ref = refs[rid]
        spec = schemes[ref.rule.scheme]
        out[rid] = Decision(comp, ref.rule.scheme, spec, _gemm(ref, spec), ref.rule.accumulate, ref.rule.output, ref)
    return out


def _gemm(ref: RuleRef, scheme: Scheme) -> str:
    """What reaches the GEMM: stated, else real on rollout and for trainer formats with a trainer
    GEMM, QDQ (fake quantization) for INT4/INT8 in the trainer."""
    if scheme.wide:
        return "wide"
    if ref.rule.gemm:
        return ref.rule.gemm
    return "qdq" if ref.section == "trainer" and scheme.format in ("int4", "int8") else "real"


def _match(pat: Pattern, groups, num_layers: int, ops) -> tuple[list, list[int]]:
    layers = pat.layer_set(num_layers)
    if pat.name_regex is not None:
        rx = pat.name_regex.match
        return [], [i for i, op in enumerate(ops)
                    if rx(op.tensor) and (layers is None or op.layer in layers)]
    fams = set(pat.families)
    return [k for k in groups if k[0] in fams and (layers is None or k[1] in layers)], []


def _why_nothing(pat: Pattern, catalog: Catalog) -> str:
    if pat.mtp:
        return (f"'{catalog.name}' lists no MTP layer (layer {catalog.num_layers} on): built-in catalogs and "
                "config-only directories leave it out; the checkpoint's index lists it")
    if pat.layers is not None:
        return f"the model has layers 0..{catalog.num_layers - 1}"
    if any(f.startswith(("experts", "router")) for f in pat.families) and not catalog.is_moe:
        return f"'{catalog.name}' is a dense model: it has no routed experts"
    if any(f.startswith("shared_experts") for f in pat.families):
        return f"'{catalog.name}' has no shared experts"
    present = sorted({op.family for op in catalog.operators})
    return "the model's families: " + ", ".join(present)


def _report_shadowed(plan: Plan, matched: dict[int, int], smap: SourceMap, rep: Reporter) -> None:
    owned: dict[int, int] = defaultdict(int)
    for comp, arr in plan.owner.items():
        for rid, idx in plan.groups[comp]:
            owned[rid] += len(idx)
    for ref in plan.rules:
        if matched.get(ref.id) and not owned.get(ref.id):
            rep.warning("PCC203", "rule is shadowed: every operator it matches is decided by a later rule",
                        smap.find(ref.path), hint="remove it, or move it after the rules that override it",
                        path=ref.path)


def _trainable(contract: Contract, groups, num_layers: int, ops, smap: SourceMap, rep: Reporter,
               catalog: Catalog) -> list[int]:
    t = contract.trainable
    if t.kind == "none":
        return []
    if t.kind == "all":
        return [i for i, op in enumerate(ops) if op.family != "kv_cache"]
    out: set[int] = set()
    for k, text in enumerate(t.targets):
        where = smap.find(f"trainable.targets[{k}]")
        try:
            pat = parse_pattern(text)
        except PatternError as exc:
            rep.error("PCC201", str(exc), where, hint=exc.hint, path="trainable.targets")
            continue
        keys, names = _match(pat, groups, num_layers, ops)
        hit = [i for key in keys for i in groups[key]] + names
        hit = [i for i in hit if ops[i].family not in NON_GEMM]
        if not hit:
            rep.error("PCC201", f"LoRA target '{text}' matches no linear operator of model '{catalog.name}'",
                      where, hint=_why_nothing(pat, catalog), path="trainable.targets")
        out.update(hit)
    return sorted(out)
