"""Plan vs Plan: what two resolved contracts do differently, operator by operator.

Rules are compared by effect, never by text: every operator x component gets a
signature (scheme definition, what reaches the GEMM, accumulation, output), and
only operators whose signature differs are reported, grouped by component and
family, with the rules that decide them on each side. Rules are signed once per
side; per component the owner lists map to signature ids and compare as whole
lists, and only a component that differs is walked to group its changed operators.
"""

from __future__ import annotations

from collections import defaultdict

from pcc.diff.align import Alignment, align
from pcc.models import FAMILIES, Catalog
from pcc.plan import COMPONENTS, DEFAULT, Plan

NOT_RUN = ("not run",)  # the component does not execute this operator on that side
EXAMPLES = 3
_FAMILY_ORDER = {f: k for k, f in enumerate(FAMILIES)}


def _live(plan: Plan, comp: str) -> bool:
    """DGrad runs unless nothing trains; WGrad of base weights only when they all train
    (a LoRA adapter's own WGrad is part of the trainable set)."""
    kind = plan.contract.trainable.kind
    return comp in ("rollout", "fprop") or (comp == "dgrad" and kind != "none") or kind == "all"


def _signatures(plan: Plan, comp: str) -> dict[int, tuple]:
    """rule id -> (scheme, gemm, accumulate, output): what the rule does, not how it is written."""
    live = _live(plan, comp)
    return {rid: (d.scheme, d.gemm, d.accumulate, d.output) if live else NOT_RUN
            for rid, d in plan.decisions[comp].items()}


def _label(plan: Plan, rid: int, sig: tuple) -> str:
    if sig is NOT_RUN:
        return "not run"
    name = "bf16" if rid == DEFAULT else plan.rules[rid].rule.scheme
    spec, gemm, acc, out = sig
    extra = [gemm] if gemm == "qdq" else []
    extra += [f"accumulate {acc}"] if acc else []
    extra += [f"output {out}"] if out else []
    return " ".join([name, *extra])


def rule_text(plan: Plan, rid: int) -> str:
    if rid == DEFAULT:
        return "default (bf16)"
    ref = plan.rules[rid]
    r = ref.rule
    head = "keep " if r.keep else ""
    comps = "" if ref.section == "rollout" else ", ".join(r.components) + " "
    return f"{ref.path}: {head}{comps}{', '.join(r.patterns)} : {r.scheme}" + (f" {r.gemm}" if r.gemm else "")


def layer_text(layers) -> str:
    """Sorted layer indices as ranges ("0..2, 7"); None (global tensors) as "-"."""
    nums = sorted(x for x in layers if x is not None)
    parts = ["-"] if None in layers else []
    start = prev = None
    for x in nums + [None]:
        if start is not None and (x is None or x != prev + 1):
            parts.append(str(start) if start == prev else f"{start}..{prev}")
            start = None
        if x is not None and start is None:
            start = x
        prev = x
    return ", ".join(parts)


def by_layer(layers) -> list[list]:
    """[[layer, tensors], ...] in layer order, global tensors (None) first: where a row's tensors
    are, cell by cell (the precision map marks them)."""
    counts: dict = defaultdict(int)
    for x in layers:
        counts[x] += 1
    return [[x, counts[x]] for x in sorted(counts, key=lambda x: -1 if x is None else x)]


def tensor_groups(catalog: Catalog, indices) -> list[dict]:
    """Operators summarized by family: count, layers, a few tensor names."""
    ops = catalog.operators
    by_family: dict[str, list[int]] = defaultdict(list)
    for i in sorted(indices):
        by_family[ops[i].family].append(i)
    return [{"family": fam, "tensors": len(idx), "layers": layer_text({ops[i].layer for i in idx}),
             "examples": [ops[i].tensor for i in idx[:EXAMPLES]]}
            for fam, idx in sorted(by_family.items(), key=lambda kv: _FAMILY_ORDER.get(kv[0], 99))]


def _kind(sa: tuple, sb: tuple, quantized_a: bool, quantized_b: bool) -> str:
    if sa is NOT_RUN:
        return "now runs"
    if sb is NOT_RUN:
        return "no longer runs"
    if sa[0] == sb[0]:
        return "execution"  # same values; GEMM mode, accumulation or output changed
    wide_a, wide_b = sa[0].wide, sb[0].wide
    if wide_a and wide_b:
        return "wide format"
    if wide_b:
        return "exception added" if quantized_b else "no longer quantized"
    if wide_a:
        return "exception removed" if quantized_a else "newly quantized"
    return "scheme"


def component_rows(pa: Plan, pb: Plan, al: Alignment, comp: str) -> list[dict]:
    sa, sb = _signatures(pa, comp), _signatures(pb, comp)
    interned: dict[tuple, int] = {}
    ida = {rid: interned.setdefault(sig, len(interned)) for rid, sig in sa.items()}
    idb = {rid: interned.setdefault(sig, len(interned)) for rid, sig in sb.items()}
    oa, ob = pa.owner[comp], pb.owner[comp]
    if not al.same:
        oa, ob = [oa[i] for i in al.a], [ob[j] for j in al.b]
    va, vb = list(map(ida.__getitem__, oa)), list(map(idb.__getitem__, ob))
    if va == vb:
        return []
    ops = pb.catalog.operators
    rows: dict[tuple, list[int]] = defaultdict(list)  # (family, sig A, sig B) -> positions
    for k, x, y in zip(range(len(va)), va, vb):
        if x != y:
            fam = ops[al.b[k]].family
            if fam != "kv_cache" or comp == "rollout":  # the KV cache exists only in rollout
                rows[(fam, x, y)].append(k)
    qa, qb = pa.quantized(comp), pb.quantized(comp)
    out = []
    for (fam, _, _), pos in rows.items():
        rid_a, rid_b = oa[pos[0]], ob[pos[0]]
        sig_a, sig_b = sa[rid_a], sb[rid_b]
        entry = {"family": fam, "kind": _kind(sig_a, sig_b, qa, qb),
                 "from": _label(pa, rid_a, sig_a), "to": _label(pb, rid_b, sig_b), "tensors": len(pos),
                 "layers": layer_text({ops[al.b[k]].layer for k in pos}),
                 "by_layer": by_layer(ops[al.b[k]].layer for k in pos),
                 "examples": [ops[al.b[k]].tensor for k in pos[:EXAMPLES]],
                 "rules_a": sorted(rule_text(pa, rid) for rid in {oa[k] for k in pos}),
                 "rules_b": sorted(rule_text(pb, rid) for rid in {ob[k] for k in pos}),
                 "quantized": any(s is not NOT_RUN and not s[0].wide for s in (sig_a, sig_b))}
        if entry["from"] == entry["to"] and sig_a is not NOT_RUN and sig_b is not NOT_RUN:
            # one name, two definitions (a redefined scheme): show what the name means on each side
            entry["from"] += f" ({sig_a[0].text()})"
            entry["to"] += f" ({sig_b[0].text()})"
        out.append(entry)
    out.sort(key=lambda e: (_FAMILY_ORDER.get(e["family"], 99), e["from"], e["to"]))
    return out


def show(v) -> str:
    """A settings value as a reader writes it (None as "-", lists comma-separated)."""
    if isinstance(v, list):
        return ", ".join(map(show, v))
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return "-" if v is None else str(v)


def field_changes(a: dict, b: dict, prefix: str = "") -> list[dict]:
    """Leaf fields of two settings dicts that differ, by dotted path."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb, path = a.get(key), b.get(key), f"{prefix}{key}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out += field_changes(va, vb, path + ".")
        elif va != vb:
            out.append({"field": path, "from": va, "to": vb})
    return out


def _settings(plan: Plan) -> dict[str, dict]:
    c = plan.contract
    t, r = c.trainer.model_dump(mode="json"), c.rollout.model_dump(mode="json")
    return {
        "optimizer": {"trainer": {k: t[k] for k in ("params", "master", "moments", "grads", "param_gather",
                                                    "optimizer")}},
        "sync": {"sync": c.sync.model_dump(mode="json")},
        "correction": {"correction": c.correction.model_dump(mode="json"), "routing_replay": c.routing_replay},
        "placement": {"framework": c.runs_on,
                      "rollout": {"hardware": plan.hardware("rollout"),
                                  **{k: r[k] for k in ("engine", "parallel", "deterministic", "max_tokens", "record")}},
                      "trainer": {"hardware": plan.hardware("trainer"), "fp8_recipe": plan.fp8_recipe,
                                  **{k: t[k] for k in ("engine", "impl", "parallel")}}},
    }


_TIGHTER = {"<=": -1, "<": -1, ">=": 1, ">": 1, "==": 0}


def expectation_changes(pa: Plan, pb: Plan) -> list[dict]:
    ea = {(e.metric, e.stat, e.op): e.value for e in pa.contract.expect}
    eb = {(e.metric, e.stat, e.op): e.value for e in pb.contract.expect}
    out = []
    for key in sorted(set(ea) | set(eb), key=lambda k: tuple(str(x) for x in k)):
        metric, stat, op = key
        text = " ".join(x for x in (metric, stat, op) if x)
        va, vb = ea.get(key), eb.get(key)
        if va == vb:
            continue
        if va is None or vb is None:
            change = "added" if va is None else "removed"
        else:
            sign = _TIGHTER[op] * (vb - va)
            change = "tightened" if sign > 0 else "loosened" if sign < 0 else "changed"
        out.append({"expectation": text, "metric": metric, "from": va, "to": vb, "change": change})
    return out


def trainable_changes(pa: Plan, pb: Plan, al: Alignment) -> dict:
    ta, tb = pa.contract.trainable, pb.contract.trainable
    fields = field_changes({k: getattr(ta, k) for k in ("kind", "rank", "alpha", "dropout")},
                           {k: getattr(tb, k) for k in ("kind", "rank", "alpha", "dropout")}, "trainable.")
    now, before = set(pb.trainable), al.to_b(pa.trainable)
    return {"fields": fields, "gained": tensor_groups(pb.catalog, now - before),
            "lost": tensor_groups(pb.catalog, before - now), "targets_a": list(ta.targets),
            "targets_b": list(tb.targets), "tensors_a": len(pa.trainable), "tensors_b": len(pb.trainable)}


def _model(plan: Plan) -> dict:
    cat = plan.catalog
    return {"name": cat.name, "operators": len(cat.operators), "layers": cat.num_layers, "experts": cat.num_experts}


def compare(pa: Plan, pb: Plan) -> dict:
    """The semantic difference of two plans (without engine arguments or consequences)."""
    al = align(pa.catalog, pb.catalog)
    report: dict = {"a": {"contract": pa.contract.name, **_model(pa)},
                    "b": {"contract": pb.contract.name, **_model(pb)}}
    report["model"] = None if al.same else {
        "only_a": tensor_groups(pa.catalog, al.only_a), "only_b": tensor_groups(pb.catalog, al.only_b)}
    report["components"] = {comp: component_rows(pa, pb, al, comp) for comp in COMPONENTS}
    sa, sb = _settings(pa), _settings(pb)
    for section in ("optimizer", "sync", "correction", "placement"):
        report[section] = field_changes(sa[section], sb[section])
    report["trainable"] = trainable_changes(pa, pb, al)
    report["expect"] = expectation_changes(pa, pb)
    report["changed"] = semantic(report)
    return report


def semantic(report: dict) -> bool:
    t = report["trainable"]
    m = report["model"]
    return bool(any(report["components"].values()) or report["optimizer"] or report["sync"]
                or report["correction"] or report["placement"] or report["expect"]
                or t["fields"] or t["gained"] or t["lost"]
                or (m and (m["only_a"] or m["only_b"])))
