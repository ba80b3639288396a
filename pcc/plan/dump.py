"""The resolved Plan as canonical JSON, and its lock hash.

Consumers (lowering, converter, runtime, diff) read explicit tensor-name lists
from here, never patterns to re-match. The same contract, whichever syntax it
was written in, dumps byte-identical JSON.
"""

from __future__ import annotations

import hashlib
import json

from pcc.contract.io import canonical
from pcc.plan.resolve import COMPONENTS, Plan


def plan_dict(plan: Plan) -> dict:
    c, cat = plan.contract, plan.catalog
    ops = cat.operators
    components = {}
    for comp in COMPONENTS:
        entries = []
        for rid, idx in plan.groups[comp]:
            d = plan.decisions[comp][rid]
            tensors = [ops[i].tensor for i in idx if comp == "rollout" or ops[i].family != "kv_cache"]
            if not tensors:
                continue
            entries.append({"rule": d.path, "scheme": d.scheme_name, "gemm": d.gemm, "accumulate": d.accumulate,
                            "output": d.output, "tensors": tensors})
        components[comp] = entries
    doc = canonical(c)
    used = sorted({e["scheme"] for entries in components.values() for e in entries})
    return {
        "contract": c.name,
        "framework": c.runs_on,  # which framework's files the bundle carries (miles/, verl/, or neither)
        "model": {"name": cat.name, "architecture": cat.architecture, "operators": len(ops),
                  "layers": cat.num_layers, "experts": cat.num_experts},
        "hardware": {"rollout": c.rollout.hardware or c.hardware, "trainer": c.trainer.hardware or c.hardware},
        "schemes": {n: plan.schemes[n].model_dump(mode="json", exclude_none=True) for n in used},
        "components": components,
        "trainable": {"kind": c.trainable.kind, "tensors": [ops[i].tensor for i in plan.trainable]}
        if c.trainable.kind == "lora" else {"kind": c.trainable.kind},
        **{k: doc[k] for k in ("rollout", "trainer", "trainable", "sync", "correction", "routing_replay", "expect")
           if k not in ("rollout", "trainer", "trainable")},
        "rollout": {k: v for k, v in doc["rollout"].items() if k != "rules"},
        "trainer": {k: v for k, v in doc["trainer"].items() if k != "rules"},
        "lora": {k: v for k, v in doc["trainable"].items() if k != "targets"},
    }


def plan_json(plan: Plan) -> str:
    d = plan_dict(plan)
    d["lock"] = lock_hash(d)
    return json.dumps(d, indent=1, sort_keys=True) + "\n"


def lock_hash(d: dict) -> str:
    body = json.dumps({k: v for k, v in d.items() if k != "lock"}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()
