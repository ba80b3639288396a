"""What a change means downstream, derived from the kinds of change a diff found.

Each change is reduced to tags (rollout representation, FProp, sync transfer, ...);
the consequences follow from the tags through the tables below, never from the
particular contracts: which artifacts are rebuilt, which validation levels (seed
Table 6) must run again, whether the measured step-0 same-version mismatch still
holds, and how memory and bytes per sync move (pcc.plan.explain's accounting).
"""

from __future__ import annotations

from pcc.diff.compare import show as _show
from pcc.plan import Plan

LEVELS = {
    1: "precision contract", 2: "quantizer and converter", 3: "one operator", 4: "fixed-prefix scoring",
    5: "routes and request state", 6: "live update", 7: "deterministic training step", 8: "bounded RL run",
    9: "performance profile",
}
# tag -> the validation levels whose controlled comparison the change moves
LEVELS_FOR = {
    "model": tuple(LEVELS), "rollout": (2, 3, 4, 5, 6, 8, 9), "kv_cache": (4, 5, 8, 9),
    "fprop": (3, 4, 5, 7, 8, 9), "quantizer": (2,), "dgrad": (3, 7, 8, 9), "wgrad": (3, 7, 8, 9),
    "optimizer": (7, 8, 9), "sync_transfer": (2, 6, 8, 9), "sync_activation": (6, 8), "sync_version": (8, 9),
    "correction": (7, 8), "routing_replay": (5, 7, 8), "hardware": (3, 4, 5, 9), "engine": (3, 4, 7, 9),
    "framework": (6, 7, 9),  # the same engines, launched and synchronized by another framework's code
    "rollout_parallel": (5, 6, 9), "trainer_parallel": (6, 7, 9), "max_tokens": (5, 8, 9),
    "deterministic": (4, 5, 9), "record": (5, 8), "trainable": (7, 8, 9), "adapter": (4, 6, 7, 8),
    "expect:same_version": (4,), "expect:baseline_drift": (6,), "expect:route_agreement": (5,),
    "expect:version_age": (8,),
}
ROUTE_LEVEL_NEEDS_MOE = ("rollout", "fprop", "hardware")  # level 5 compares expert IDs
# the policy either side scores at step 0 (a fresh LoRA adapter is zero, so targets do not move it)
BASELINE_TAGS = ("model", "rollout", "kv_cache", "fprop", "hardware", "engine", "rollout_parallel",
                 "trainer_parallel", "routing_replay", "deterministic", "max_tokens")
BYTES_TAGS = ("model", "rollout", "fprop", "trainable", "adapter", "optimizer", "sync_transfer")
_SYNC = {"moves": "sync_transfer", "bridge": "sync_transfer", "transfer": "sync_transfer",
         "activation": "sync_activation", "schedule": "sync_version", "max_staleness": "sync_version",
         "interval": "sync_version"}
_PLACEMENT = {"framework": "framework", "hardware": "hardware", "parallel": "{side}_parallel", "engine": "engine", "impl": "engine",
              "fp8_recipe": "engine", "max_tokens": "max_tokens", "deterministic": "deterministic",
              "record": "record"}


def _field(c: dict) -> str:
    return f"{c['field']} {_show(c['from'])} -> {_show(c['to'])}"


def tags(report: dict, pa: Plan, pb: Plan) -> list[tuple[str, str]]:
    """(tag, reason) for every change in the report."""
    out: list[tuple[str, str]] = []
    m = report["model"]
    if m is not None and (m["only_a"] or m["only_b"]):
        n_a, n_b = sum(g["tensors"] for g in m["only_a"]), sum(g["tensors"] for g in m["only_b"])
        out.append(("model", f"model {report['a']['name']} -> {report['b']['name']}: {n_b} tensors only in B, "
                             f"{n_a} only in A"))
    for comp, rows in report["components"].items():
        merged: dict[tuple, list[dict]] = {}  # one reason per (tag, from, to), families listed
        for r in rows:
            tag = "kv_cache" if r["family"] == "kv_cache" else comp
            merged.setdefault((tag, r["from"], r["to"]), []).append(r)
        for (tag, a, b), group in merged.items():
            n, fams = sum(r["tensors"] for r in group), ", ".join(r["family"] for r in group)
            out.append((tag, f"{comp} {a} -> {b} ({n} tensors: {fams})"))
            if comp == "fprop" and any(r["quantized"] for r in group):
                out.append(("quantizer", f"fprop quantizer {a} -> {b} ({fams})"))
    out += [("optimizer", _field(c)) for c in report["optimizer"]]
    out += [(_SYNC.get(c["field"].split(".")[1], "sync_version"), _field(c)) for c in report["sync"]]
    out += [("routing_replay" if c["field"] == "routing_replay" else "correction", _field(c))
            for c in report["correction"]]
    for c in report["placement"]:
        side, _, rest = c["field"].partition(".")  # "framework", or "rollout.engine", "trainer.parallel.tp"
        out.append((_PLACEMENT[rest.split(".")[0] if rest else side].format(side=side), _field(c)))
    t = report["trainable"]
    lora = "lora" in (pa.contract.trainable.kind, pb.contract.trainable.kind)
    for c in t["fields"]:
        out.append(("trainable", _field(c)))
    for what, groups in (("gained", t["gained"]), ("lost", t["lost"])):
        for g in groups:
            out.append(("trainable", f"trainable {what} {g['tensors']} {g['family']} tensors"))
    if lora and (t["fields"] or t["gained"] or t["lost"]):
        out.append(("adapter", "the LoRA adapter's shape or targets change"))
    for e in report["expect"]:
        out.append((f"expect:{e['metric']}", f"expectation {e['expectation']} {e['change']} "
                                             f"({_show(e['from'])} -> {_show(e['to'])})"))
    return out


def validation_levels(found: list[tuple[str, str]], moe: bool) -> list[dict]:
    why: dict[int, list[str]] = {}
    for tag, reason in found:
        for level in LEVELS_FOR.get(tag, (8,)):
            if level == 5 and tag in ROUTE_LEVEL_NEEDS_MOE and not moe:
                continue
            why.setdefault(level, []).append(reason)
    if found:
        why.setdefault(1, []).insert(0, "the contract's resolved plan changed")
    return [{"level": n, "name": LEVELS[n], "why": _unique(why[n])} for n in sorted(why)]


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _bytes(pa: Plan, pb: Plan) -> list[dict]:
    from pcc.plan.explain import explain

    ra = {r["name"]: r["bytes"] for r in explain(pa)["representations"]}
    rb = {r["name"]: r["bytes"] for r in explain(pb)["representations"]}
    rows = [{"name": n, "a": ra.get(n), "b": rb.get(n), "delta": (rb.get(n) or 0) - (ra.get(n) or 0)}
            for n in dict.fromkeys([*ra, *rb])]
    return [r for r in rows if r["delta"] or r["a"] is None or r["b"] is None]


def consequences(report: dict, pa: Plan, pb: Plan, engines: dict | None = None) -> dict:
    found = tags(report, pa, pb)
    kinds = {t for t, _ in found}

    def by(*wanted: str) -> list[str]:
        return _unique([r for t, r in found if t in wanted])

    roll = [r for r in report["components"]["rollout"] if r["family"] != "kv_cache"]
    if "model" in kinds:
        artifact = {"rebuild": True, "tensors": report["b"]["operators"], "groups": [],
                    "why": ["the model changed: every rollout tensor of the new model is built"]}
    else:
        artifact = {"rebuild": bool(roll), "tensors": sum(r["tensors"] for r in roll),
                    "groups": [{k: r[k] for k in ("family", "from", "to", "tensors", "layers", "examples")}
                               for r in roll], "why": by("rollout")}
    if artifact["rebuild"] and pb.contract.sync.moves == "full_weights":
        artifact["why"].append("every full-weight sync converts these tensors to the new scheme")
    lora = "lora" in (pa.contract.trainable.kind, pb.contract.trainable.kind)
    adapter = by("adapter", "trainable", "rollout_parallel", "trainer_parallel", "model") if lora else []
    trainer_files = [f["path"] for e in (engines or {}).values() if e["available"] for f in e["files"]
                     if f["path"].startswith("trainer/")]  # Megatron's args, env, TE file; FSDP's fsdp.json
    trainer_file = {"changes": bool(by("fprop", "dgrad", "wgrad", "optimizer", "engine")),
                    "why": by("fprop", "dgrad", "wgrad", "optimizer", "engine"), "files": trainer_files}
    trainer_file["changes"] = trainer_file["changes"] or bool(trainer_file["files"])
    baseline = by(*BASELINE_TAGS)
    return {
        "rollout_artifact": artifact,
        "adapter_mapping": {"changes": bool(adapter), "why": adapter},
        "trainer_precision_file": trainer_file,
        "validation_levels": validation_levels(found, pa.catalog.is_moe or pb.catalog.is_moe),
        "baseline": {"invalidated": bool(baseline), "why": baseline},
        "bytes": _bytes(pa, pb) if kinds & set(BYTES_TAGS) else [],
    }
