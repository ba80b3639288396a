"""Operator sets -> pcc rules, and schemes -> names: the contract an import writes.

A source decides, operator by operator, what is quantized. The importer writes that as one
positive rule over the families concerned plus `keep` exceptions, compacted to families,
aliases and layer ranges where the exception covers them exactly, else quoted tensor names.
The result is exact by construction: `decided_by` re-resolves the patterns against the catalog
and the import fails (PCC801) if they select anything else.
"""

from __future__ import annotations

from collections import defaultdict

from pcc.contract.scheme import PRESETS, Scheme
from pcc.models import Catalog
from pcc.plan.patterns import ALIASES, LINEAR, parse_pattern

_ALIAS_ORDER = ("linear", "attn", "mlp", "experts", "shared_experts")


def scheme_name(spec: dict, stem: str) -> tuple[str, dict | None]:
    """(name, definition or None): a preset's name when the scheme equals one, else `stem`."""
    scheme = Scheme.model_validate(spec)
    for name, preset in PRESETS.items():
        if Scheme.model_validate(preset) == scheme:
            return name, None
    return stem, scheme.minimal()


def _ranges(layers: list[int]) -> str:
    out, start, prev = [], None, None
    for x in sorted(layers) + [None]:
        if start is not None and (x is None or x != prev + 1):
            out.append(str(start) if start == prev else f"{start}..{prev}")
            start = None
        if x is not None and start is None:
            start = x
        prev = x
    return ",".join(out)


def family_patterns(catalog: Catalog, families: set[str]) -> list[str]:
    """Families written with the widest aliases that cover exactly them (among families present)."""
    present = {op.family for op in catalog.operators}
    left = set(families)
    out = []
    for alias in _ALIAS_ORDER:
        members = set(ALIASES[alias]) & present
        if members and members <= left:
            out.append(alias)
            left -= members
    return out + sorted(left, key=list(LINEAR).index if left <= set(LINEAR) else str)


def select(catalog: Catalog, chosen: set[int], scope: set[int]) -> list[str]:
    """Patterns selecting exactly `chosen` among the operators in `scope` (their families'
    operators): whole families, families over layer sets, else quoted tensor names."""
    ops = catalog.operators
    by_family: dict[str, list[int]] = defaultdict(list)
    for i in scope:
        by_family[ops[i].family].append(i)
    whole: set[str] = set()
    layered: dict[tuple[int, ...], set[str]] = defaultdict(set)
    names: list[str] = []
    for fam, idx in by_family.items():
        picked = [i for i in idx if i in chosen]
        if not picked:
            continue
        if len(picked) == len(idx):
            whole.add(fam)
            continue
        layers = {ops[i].layer for i in picked}
        if None not in layers and {i for i in idx if ops[i].layer in layers} == set(picked):
            layered[tuple(sorted(layers))].add(fam)
        else:
            names += [f"name:{ops[i].tensor}" for i in sorted(picked)]
    out = family_patterns(catalog, whole) if whole <= set(LINEAR) else sorted(whole)
    for layers, fams in sorted(layered.items()):
        heads = family_patterns(catalog, fams) if fams <= set(LINEAR) else sorted(fams)
        out += [f"{h}[{_ranges(list(layers))}]" for h in heads]
    return out + names


def selected(catalog: Catalog, patterns: list[str]) -> set[int]:
    """The operators `patterns` select (pcc's own pattern semantics), to prove an import exact."""
    ops, n = catalog.operators, catalog.num_layers
    out: set[int] = set()
    for text in patterns:
        p = parse_pattern(text)
        layers = p.layer_set(n)
        for i, op in enumerate(ops):
            if layers is not None and op.layer not in layers:
                continue
            if p.name_regex is not None:
                if p.name_regex.match(op.tensor):
                    out.add(i)
            elif op.family in p.families:
                out.add(i)
    return out


def component_rules(catalog: Catalog, decided: dict[int, str], components: list[str]) -> list[dict]:
    """Rules for `components` deciding exactly `decided` (operator -> scheme name; every other
    operator of those families wide): the most common scheme over whole families, later rules for
    the other schemes, then `keep bf16` for the wide operators inside those families."""
    ops = catalog.operators
    by_scheme: dict[str, set[int]] = defaultdict(set)
    for i, s in decided.items():
        by_scheme[s].add(i)
    if not by_scheme:
        return []
    order = sorted(by_scheme, key=lambda s: (-len(by_scheme[s]), s))
    families = {ops[i].family for i in decided}
    scope = {i for i, op in enumerate(ops) if op.family in families}
    rules = [{"components": list(components), "patterns": family_patterns(catalog, families), "scheme": order[0]}]
    for s in order[1:]:
        rules.append({"components": list(components), "patterns": select(catalog, by_scheme[s], scope), "scheme": s})
    wide = scope - set(decided)
    if wide:
        rules.append({"components": list(components), "patterns": select(catalog, wide, scope), "scheme": "bf16",
                      "keep": True})
    return rules
